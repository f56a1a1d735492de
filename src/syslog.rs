//! `[supd] syslog = PATH`: a syslog listener for daemons that log nowhere else (cron,
//! old daemons). Each datagram goes to the log of the service whose process sent it,
//! found from the sender's pid (SCM_CREDENTIALS) in a few reads, never a walk of /proc:
//! the service's leader itself, else its cgroup (one read of `/proc/PID/cgroup`), else its
//! session (`/proc/PID/stat`: every run is a session whose id is its main pid). A sender
//! that is no service's, or gone before supd looked, goes to supd's own log.
//!
//! This file is the pure part: parsing RFC 3164 (as glibc's syslog(3) and logger(1) send
//! it) and RFC 5424 lines, the line kept in a service's log, the per-sender rate bound (a
//! token bucket on `CLOCK_MONOTONIC` values, refilled lazily: no timer), and the decision
//! of a sender's service over plain data. The socket is `syslog/listener.rs`; the
//! coordinator's side is `supervisor/syslog.rs`.

pub mod listener;

use crate::time::Mono;
use std::collections::BTreeMap;
use std::time::Duration;

/// Messages a sender may send per second, on average.
pub const RATE: u64 = 200;
/// Messages a sender may send at once after a quiet second.
pub const BURST: u64 = 200;
/// A message's text is cut to this many bytes.
const TEXT_MAX: usize = 4096;
/// Senders remembered before the quiet ones are forgotten.
const SENDERS_MAX: usize = 1024;
/// Senders remembered at most: past that, new senders share one bucket
/// ([`OVERFLOW`]), so that a storm of short-lived senders cannot grow supd.
const SENDERS_CAP: usize = 4 * SENDERS_MAX;
/// The pid under which the senders past [`SENDERS_CAP`] are bounded together.
pub const OVERFLOW: i32 = -1;

const FACILITIES: [&str; 24] = [
    "kern",
    "user",
    "mail",
    "daemon",
    "auth",
    "syslog",
    "lpr",
    "news",
    "uucp",
    "cron",
    "authpriv",
    "ftp",
    "ntp",
    "security",
    "console",
    "solaris-cron",
    "local0",
    "local1",
    "local2",
    "local3",
    "local4",
    "local5",
    "local6",
    "local7",
];
const SEVERITIES: [&str; 8] = [
    "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// One message as parsed: its priority, its tag (`APP[PID]`) and its text.
#[derive(Debug, PartialEq, Eq)]
pub struct Message {
    pub facility: u8,
    pub severity: u8,
    pub tag: Option<String>,
    pub text: String,
}

impl Message {
    /// `CRON[123]: (root) CMD (x)`: its tag and text.
    pub fn body(&self) -> String {
        match &self.tag {
            Some(tag) => format!("{tag}: {}", self.text),
            None => self.text.clone(),
        }
    }

    /// `daemon.info`.
    pub fn priority(&self) -> String {
        let f = FACILITIES
            .get(self.facility as usize)
            .copied()
            .unwrap_or("user");
        let s = SEVERITIES
            .get(self.severity as usize)
            .copied()
            .unwrap_or("notice");
        format!("{f}.{s}")
    }

    /// What follows the timestamp in a service's log:
    /// `[syslog daemon.info] CRON[123]: (root) CMD (x)`.
    pub fn line(&self) -> String {
        format!("[syslog {}] {}", self.priority(), self.body())
    }
}

/// Parses one datagram; never fails: what is not syslog is kept as it is, `user.notice`.
pub fn parse(data: &[u8]) -> Message {
    let raw = String::from_utf8_lossy(data);
    let raw = raw.trim_end_matches(['\n', '\r', '\0']);
    let (pri, rest) = match priority(raw) {
        Some((pri, rest)) => (pri, rest),
        None => (1 << 3 | 5, raw),
    };
    let (tag, text) = match rest.strip_prefix("1 ") {
        Some(r5424) => rfc5424(r5424),
        None => rfc3164(rest),
    };
    Message {
        facility: (pri >> 3) as u8,
        severity: (pri & 7) as u8,
        tag: tag.map(|t| clean(&t)),
        text: clean(text),
    }
}

/// `<PRI>` at the start (0 to 191, one to three digits), and what follows it.
fn priority(s: &str) -> Option<(u32, &str)> {
    let rest = s.strip_prefix('<')?;
    let end = rest.find('>')?;
    let digits = &rest[..end];
    if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let pri: u32 = digits.parse().ok()?;
    (pri <= 191).then_some((pri, &rest[end + 1..]))
}

/// `Mmm dd hh:mm:ss [HOST] TAG[PID]: MSG`; the timestamp and the host are let go (the
/// line gets supd's own stamp), a missing part is tolerated.
fn rfc3164(s: &str) -> (Option<String>, &str) {
    let s = skip_3164_stamp(s);
    // The tag ends at its first ':' or '[' (both in the first word): `CRON[123]: text`.
    let tag_of = |word: &str| -> Option<usize> {
        let end = word.find([':', '['])?;
        (end > 0).then_some(end)
    };
    let first = s.split(' ').next().unwrap_or("");
    let s = match tag_of(first) {
        Some(_) => s,
        // `HOST TAG: MSG` (logger --rfc3164): a first word without ':' and a second
        // that is a tag.
        None => match s.split_once(' ') {
            Some((_, after)) if tag_of(after.split(' ').next().unwrap_or("")).is_some() => after,
            _ => return (None, s),
        },
    };
    let first = s.split(' ').next().unwrap_or("");
    match tag_of(first) {
        Some(_) => {
            let head_len = first.len();
            let head = first.strip_suffix(':').unwrap_or(first);
            let text = s[head_len..].strip_prefix(' ').unwrap_or(&s[head_len..]);
            (Some(head.to_string()), text)
        }
        None => (None, s),
    }
}

/// After `Mmm dd hh:mm:ss ` when it is there (the day may be padded: `Dec  2`).
fn skip_3164_stamp(s: &str) -> &str {
    let b = s.as_bytes();
    let looks = b.len() >= 16
        && MONTHS.iter().any(|m| s.starts_with(m))
        && b[3] == b' '
        && (b[4] == b' ' || b[4].is_ascii_digit())
        && b[5].is_ascii_digit()
        && b[6] == b' '
        && b[9] == b':'
        && b[12] == b':'
        && b[15] == b' '
        && [7, 8, 10, 11, 13, 14]
            .iter()
            .all(|&i| b[i].is_ascii_digit());
    if looks {
        &s[16..]
    } else {
        s
    }
}

/// `TIMESTAMP HOST APP PROCID MSGID SD MSG` (after `<PRI>1 `): the tag is `APP[PROCID]`
/// (nil values, `-`, left out); the structured data is let go.
fn rfc5424(s: &str) -> (Option<String>, &str) {
    let mut rest = s;
    let mut field = || -> &str {
        let (f, r) = rest.split_once(' ').unwrap_or((rest, ""));
        rest = r;
        f
    };
    let (_stamp, _host, app, procid, _msgid) = (field(), field(), field(), field(), field());
    let nil = |f: &str| f.is_empty() || f == "-";
    let tag = match (nil(app), nil(procid)) {
        (true, _) => None,
        (false, true) => Some(app.to_string()),
        (false, false) => Some(format!("{app}[{procid}]")),
    };
    let text = skip_structured_data(rest);
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    (tag, text)
}

/// After the structured data: `-`, or `[id k="v" ...]...` (`\]` and `\"` escaped in
/// values).
fn skip_structured_data(s: &str) -> &str {
    if let Some(r) = s.strip_prefix('-') {
        return r.strip_prefix(' ').unwrap_or(r);
    }
    let b = s.as_bytes();
    let mut i = 0;
    while b.get(i) == Some(&b'[') {
        let mut quoted = false;
        i += 1;
        while i < b.len() {
            match b[i] {
                b'\\' if quoted => i += 1,
                b'"' => quoted = !quoted,
                b']' if !quoted => break,
                _ => {}
            }
            i += 1;
        }
        i += 1;
    }
    let r = s.get(i.min(s.len())..).unwrap_or("");
    r.strip_prefix(' ').unwrap_or(r)
}

/// One line of text: control characters (a newline inside a message) become spaces, and
/// it is cut to [`TEXT_MAX`] bytes.
fn clean(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if out.len() > TEXT_MAX {
        let mut end = TEXT_MAX;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

/// The service whose cgroup a `/proc/PID/cgroup` text names: the component after the
/// services' root (`root_name`, `sup-<id>`), `NAME.service` (or `NAME+check.service`,
/// a health check of NAME's).
pub fn service_in_cgroup<'a>(text: &'a str, root_name: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        let mut parts = path.split('/');
        parts.find(|p| *p == root_name)?;
        let unit = parts.next()?.strip_suffix(".service")?;
        let name = unit.split('+').next()?;
        (!name.is_empty()).then_some(name)
    })
}

/// The services' cgroups by id (a cgroup v2 directory's inode number, which the sender's
/// pidfd tells even once the sender is reaped): told at each start into one, and read
/// from the services' root once (`prime`) for those an earlier image made. A removed
/// cgroup's id stays until its service starts again or is removed: the kernel never
/// gives an id twice, so it names nothing else meanwhile.
#[derive(Debug, Default)]
pub struct CgroupIds {
    by_id: BTreeMap<u64, String>,
    by_dir: BTreeMap<String, u64>,
    primed: bool,
}

impl CgroupIds {
    /// The cgroup directory `dir` (`NAME.service`, `NAME+check.service`) has `id` now.
    pub fn note(&mut self, dir: &str, id: u64) {
        if let Some(old) = self.by_dir.insert(dir.to_string(), id) {
            if old != id {
                self.by_id.remove(&old);
            }
        }
        self.by_id.insert(id, dir.to_string());
    }

    /// The cgroup directory `dir` is gone with its service.
    pub fn forget(&mut self, dir: &str) {
        if let Some(id) = self.by_dir.remove(dir) {
            self.by_id.remove(&id);
        }
    }

    /// Whether the cgroups already there were read in.
    pub fn primed(&self) -> bool {
        self.primed
    }

    /// The cgroups already there, (id, directory name) each.
    pub fn prime(&mut self, found: Vec<(u64, String)>) {
        for (id, dir) in found {
            self.note(&dir, id);
        }
        self.primed = true;
    }

    /// The service the cgroup `id` is of (a health check's is its service's).
    pub fn service(&self, id: u64) -> Option<&str> {
        let unit = self.by_id.get(&id)?.strip_suffix(".service")?;
        unit.split('+').next().filter(|n| !n.is_empty())
    }
}

/// Where a sender's message goes: the service it belongs to, or `None` (supd's own log).
/// Asked in order, each only when the one before found nothing: the service whose cgroup
/// the sender's pidfd named (`by_cgroup_id`: exact, and the only way once the sender is
/// reaped), the leaders (a pid that is a run's main process), the cgroup (the text of
/// `/proc/PID/cgroup`, when services have cgroups: `root_name` is their root's), the
/// session (`/proc/PID/stat`'s, a run's main pid). `known` says whether a name is a
/// service's.
pub fn sender_service(
    pid: i32,
    by_cgroup_id: Option<&str>,
    leader: &dyn Fn(i32) -> Option<String>,
    root_name: Option<&str>,
    cgroup: &dyn Fn(i32) -> Option<String>,
    session: &dyn Fn(i32) -> Option<i32>,
    known: &dyn Fn(&str) -> bool,
) -> Option<String> {
    if let Some(name) = by_cgroup_id.filter(|n| known(n)) {
        return Some(name.to_string());
    }
    if pid <= 0 {
        return None;
    }
    if let Some(name) = leader(pid) {
        return Some(name);
    }
    if let Some(root) = root_name {
        let found = cgroup(pid).and_then(|t| service_in_cgroup(&t, root).map(str::to_string));
        if let Some(name) = found.filter(|n| known(n)) {
            return Some(name);
        }
    }
    session(pid).filter(|s| *s > 0).and_then(leader)
}

/// supd's syslog listener, while it has one, and its senders' rate bound.
#[derive(Default)]
pub struct Syslog {
    pub socket: Option<listener::Listener>,
    pub limiter: Limiter,
    /// Kept while there is a listener (emptied with it: starts are not told meanwhile).
    pub cgroups: CgroupIds,
}

impl Syslog {
    /// A run is started in the cgroup `dir`: its id (`id`, asked only then) is noted
    /// while there is a listener to place messages by it.
    pub fn started_in(&mut self, dir: &std::path::Path, id: impl FnOnce() -> Option<u64>) {
        if self.socket.is_none() {
            return;
        }
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        if let (Some(name), Some(id)) = (name, id()) {
            self.cgroups.note(&name, id);
        }
    }
}

/// A sender's bucket: tokens in billionths (one message is `UNIT`), when last filled,
/// and what it was refused since the last telling.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: u64,
    at: Mono,
    dropped: u64,
}

const UNIT: u64 = 1_000_000_000;

impl Bucket {
    /// Its tokens as of `now` (filled at [`RATE`] a second, up to [`BURST`]).
    fn fill(&mut self, now: Mono) {
        let ns = now.since(self.at).as_nanos().min(u64::MAX as u128) as u64;
        let add = ns.saturating_mul(RATE);
        self.tokens = self.tokens.saturating_add(add).min(BURST * UNIT);
        self.at = now;
    }
}

/// The rate bound of every sender (by pid), and the drops not told yet. No timer: a
/// bucket is filled when its sender sends again.
#[derive(Debug, Default)]
pub struct Limiter {
    senders: BTreeMap<i32, Bucket>,
    /// When drops were last told (at most once a second).
    told: Option<Mono>,
    /// When the quiet senders were last forgotten (at most once a second).
    swept: Option<Mono>,
}

impl Limiter {
    /// Whether a message of `pid` sent at `now` is kept (else it is counted).
    pub fn admit(&mut self, pid: i32, now: Mono) -> bool {
        let mut pid = pid;
        if self.senders.len() >= SENDERS_MAX && !self.senders.contains_key(&pid) {
            // At most once a second: a sweep looks at every sender.
            if self
                .swept
                .is_none_or(|t| now.since(t) >= Duration::from_secs(1))
            {
                self.swept = Some(now);
                self.forget_quiet(now);
            }
            if self.senders.len() >= SENDERS_CAP {
                pid = OVERFLOW;
            }
        }
        let b = self.senders.entry(pid).or_insert(Bucket {
            tokens: BURST * UNIT,
            at: now,
            dropped: 0,
        });
        b.fill(now);
        if b.tokens >= UNIT {
            b.tokens -= UNIT;
            true
        } else {
            b.dropped += 1;
            false
        }
    }

    /// Forgets the senders whose buckets are full again with nothing left to tell.
    fn forget_quiet(&mut self, now: Mono) {
        self.senders.retain(|_, b| {
            b.fill(now);
            b.dropped > 0 || b.tokens < BURST * UNIT
        });
    }

    /// The drops to tell now, by sender: all not told yet, once a second has passed
    /// since the last telling (or none was made); nothing otherwise.
    pub fn to_tell(&mut self, now: Mono) -> Vec<(i32, u64)> {
        if self
            .told
            .is_some_and(|t| now.since(t) < Duration::from_secs(1))
        {
            return Vec::new();
        }
        let drops: Vec<(i32, u64)> = self
            .senders
            .iter_mut()
            .filter(|(_, b)| b.dropped > 0)
            .map(|(pid, b)| (*pid, std::mem::take(&mut b.dropped)))
            .collect();
        if !drops.is_empty() {
            self.told = Some(now);
        }
        drops
    }

    /// How many senders it remembers.
    pub fn senders(&self) -> usize {
        self.senders.len()
    }
}

#[cfg(test)]
mod tests;
