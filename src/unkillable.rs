//! A process that was SIGKILLed and is not gone: in uninterruptible sleep (a hung NFS
//! server, a stuck device), or held by a cgroup freezer (v1: a frozen task keeps its
//! SIGKILL pending until it is thawed). It holds its service back: no new run starts
//! beside it, however long it lives. Here: how often the KILL is sent again (a plain
//! rule over a count, unit tested), what `/proc` says of such a process, and the words
//! `status`, `stop` and the log use for it.

use crate::time::{Human, Mono};
use std::time::Duration;

/// How long a process is given to die after a SIGKILL before it is said not to have:
/// the bound of `stop` beyond its `stop_timeout`, and of a shutdown beyond its
/// `shutdown_timeout`.
pub const KILL_WAIT: Duration = Duration::from_secs(5);
/// The longest wait between two SIGKILLs to a process that outlived them.
pub const KILL_AGAIN_MAX: Duration = Duration::from_secs(60);

/// The wait after the `kills`-th SIGKILL (1 for the first) before the next one: KILL_WAIT
/// for the first `steady` ones, then doubling up to [`KILL_AGAIN_MAX`]. A SIGKILL that
/// could not land yet stays pending, so sending it again costs nothing and catches what
/// a member forked meanwhile; the wait only bounds how often supd looks.
pub fn kill_again_in(kills: u32, steady: u32) -> Duration {
    let over = kills.saturating_sub(steady).min(16);
    KILL_WAIT
        .saturating_mul(1u32 << over)
        .min(KILL_AGAIN_MAX)
        .max(KILL_WAIT)
}

/// What `/proc` says of a process that is awaited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub pid: i32,
    /// Its state letter in `/proc/PID/stat`.
    pub state: char,
    /// A cgroup freezer holds it (v1 `freezer.state` FROZEN or FREEZING, or a cgroup2
    /// `cgroup.events` saying `frozen 1`).
    pub frozen: bool,
}

impl Seen {
    /// `pid` as it is now, if it is alive and `start_time` (when given) is still its own.
    pub fn look(pid: i32, start_time: Option<u64>) -> Option<Seen> {
        let s = crate::proc::stat(pid)?;
        if start_time.is_some_and(|t| t != s.start_time) {
            return None;
        }
        Some(Seen {
            pid,
            state: s.state,
            frozen: frozen(pid),
        })
    }

    /// "uninterruptible (D)", ", frozen by its cgroup" added where a freezer holds it.
    pub fn describe(&self) -> String {
        let frozen = if self.frozen {
            ", frozen by its cgroup"
        } else {
            ""
        };
        format!("{} ({}){frozen}", state_word(self.state), self.state)
    }
}

/// Which run an awaited process belongs to, for people.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Run {
    /// Left by a previous supd, which was killed.
    Previous,
    /// The service's own last run, stopped.
    Last,
}

impl Run {
    pub fn as_str(self) -> &'static str {
        match self {
            Run::Previous => "previous",
            Run::Last => "last",
        }
    }
}

/// What holds a service back, as `status` says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub seen: Seen,
    pub run: Run,
    /// Other processes of that run still there.
    pub more: usize,
    /// Since when supd waits for it.
    pub since: Mono,
}

impl Holder {
    /// "waiting for pid 1234 of the previous run: uninterruptible (D) for 40s".
    pub fn waiting(&self, now: Mono) -> String {
        format!("waiting for {}", self.what(now))
    }

    /// "pid 1234 of the previous run: uninterruptible (D) for 40s".
    pub fn what(&self, now: Mono) -> String {
        let run = match self.run {
            Run::Previous => "the previous run",
            Run::Last => "its last run",
        };
        let more = match self.more {
            0 => String::new(),
            1 => " (and 1 more process)".into(),
            n => format!(" (and {n} more processes)"),
        };
        format!(
            "pid {} of {run}: {} for {}{more}",
            self.seen.pid,
            self.seen.describe(),
            Human(whole_seconds(now.since(self.since)))
        )
    }

    /// The same for `status --json`.
    pub fn status(&self, now: Mono) -> crate::protocol::HeldBy {
        crate::protocol::HeldBy {
            for_ms: now.since(self.since).as_millis() as u64,
            frozen: self.seen.frozen,
            more: self.more,
            pid: self.seen.pid,
            run: self.run.as_str().into(),
            state: self.seen.state.to_string(),
        }
    }
}

/// The first of `pids` that is alive, as seen now, and how many others are.
pub fn first_alive(pids: impl IntoIterator<Item = (i32, Option<u64>)>) -> Option<(Seen, usize)> {
    let mut first = None;
    let mut more = 0;
    for (pid, start) in pids {
        if first.is_some() {
            more += usize::from(crate::proc::stat(pid).is_some_and(|s| s.state != 'Z'));
        } else {
            first = Seen::look(pid, start).filter(|s| s.state != 'Z');
        }
    }
    first.map(|f| (f, more))
}

fn whole_seconds(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

/// The word for a state letter of `/proc/PID/stat`.
pub fn state_word(state: char) -> &'static str {
    match state {
        'D' => "uninterruptible",
        'R' => "running",
        'S' => "sleeping",
        'T' => "stopped",
        't' => "traced",
        'Z' => "a zombie",
        'X' | 'x' => "dead",
        'I' => "idle",
        'P' => "parked",
        'W' | 'K' => "waking",
        _ => "in an unknown state",
    }
}

/// Whether a cgroup freezer holds `pid`.
fn frozen(pid: i32) -> bool {
    let (Ok(cgroups), Ok(mounts)) = (
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")),
        std::fs::read_to_string("/proc/self/mountinfo"),
    ) else {
        return false;
    };
    freezer_files(&cgroups, &mounts)
        .into_iter()
        .any(|(path, v2)| {
            std::fs::read_to_string(path).is_ok_and(|t| {
                if v2 {
                    t.lines().any(|l| l.trim() == "frozen 1")
                } else {
                    matches!(t.trim(), "FROZEN" | "FREEZING")
                }
            })
        })
}

/// The files that say whether a process with these `/proc/PID/cgroup` lines is frozen:
/// its v1 freezer cgroup's `freezer.state` (false) and its cgroup2 `cgroup.events`
/// (true), where `mountinfo` (supd's own: the process's cgroup paths are relative to
/// supd's namespace) shows those hierarchies mounted.
fn freezer_files(cgroups: &str, mountinfo: &str) -> Vec<(std::path::PathBuf, bool)> {
    let mut out = Vec::new();
    for line in cgroups.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let v2 = id == "0" && controllers.is_empty();
        if !v2 && !controllers.split(',').any(|c| c == "freezer") {
            continue;
        }
        let Some((root, mount)) = mount_of(mountinfo, v2) else {
            continue;
        };
        let rel = path.strip_prefix(root.as_str()).unwrap_or(path);
        let dir = std::path::Path::new(&mount).join(rel.trim_start_matches('/'));
        let file = if v2 { "cgroup.events" } else { "freezer.state" };
        out.push((dir.join(file), v2));
    }
    out
}

/// The root and mount point of the cgroup2 hierarchy (`v2`) or of the v1 freezer's.
fn mount_of(mountinfo: &str, v2: bool) -> Option<(String, String)> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let fstype = r.next()?;
        let opts = r.nth(1).unwrap_or("");
        let fits = if v2 {
            fstype == "cgroup2"
        } else {
            fstype == "cgroup" && opts.split(',').any(|o| o == "freezer")
        };
        if !fits {
            return None;
        }
        let f: Vec<&str> = left.split_whitespace().collect();
        Some((f.get(3)?.to_string(), f.get(4)?.to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_is_sent_again_on_a_backoff_never_faster_than_its_wait() {
        let waits: Vec<u64> = (1..=9).map(|k| kill_again_in(k, 3).as_secs()).collect();
        assert_eq!(waits, [5, 5, 5, 10, 20, 40, 60, 60, 60]);
        assert_eq!(kill_again_in(0, 0), KILL_WAIT);
        assert_eq!(kill_again_in(u32::MAX, 1), KILL_AGAIN_MAX);
    }

    #[test]
    fn a_holder_is_said_with_its_pid_run_state_and_wait() {
        let h = Holder {
            seen: Seen {
                pid: 1234,
                state: 'D',
                frozen: false,
            },
            run: Run::Previous,
            more: 0,
            since: Mono(0),
        };
        let now = Mono(0).plus(Duration::from_millis(40_700));
        assert_eq!(
            h.waiting(now),
            "waiting for pid 1234 of the previous run: uninterruptible (D) for 40s"
        );
        let h = Holder {
            seen: Seen {
                frozen: true,
                ..h.seen
            },
            run: Run::Last,
            more: 2,
            ..h
        };
        assert_eq!(
            h.waiting(now),
            "waiting for pid 1234 of its last run: uninterruptible (D), frozen by its cgroup for 40s (and 2 more processes)"
        );
        let st = h.status(now);
        assert_eq!(
            (
                st.pid,
                st.state.as_str(),
                st.run.as_str(),
                st.for_ms,
                st.frozen,
                st.more
            ),
            (1234, "D", "last", 40_700, true, 2)
        );
    }

    #[test]
    fn the_freezer_files_of_a_process_are_found_in_a_hybrid_layout() {
        let mounts = "25 30 0:23 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n\
                      26 25 0:24 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                      27 25 0:25 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n\
                      28 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        let cgroups = "9:name=systemd:/\n6:freezer:/sup-test-1\n1:cpu:/\n0::/sup-1/one.service\n";
        assert_eq!(
            freezer_files(cgroups, mounts),
            vec![
                (
                    "/sys/fs/cgroup/freezer/sup-test-1/freezer.state".into(),
                    false
                ),
                (
                    "/sys/fs/cgroup/unified/sup-1/one.service/cgroup.events".into(),
                    true
                ),
            ]
        );
        // No freezer hierarchy mounted: only the cgroup2 one is looked at.
        let v2 = "40 39 0:30 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            freezer_files("0::/docker/abc/x\n", v2),
            vec![("/sys/fs/cgroup/x/cgroup.events".into(), true)]
        );
    }

    #[test]
    fn states_have_words() {
        assert_eq!(state_word('D'), "uninterruptible");
        assert_eq!(state_word('T'), "stopped");
        assert_eq!(state_word('?'), "in an unknown state");
    }
}
