//! The upgrade record of one tool and the rules that change it: upgrade with probation,
//! commit, rollback (automatic or by an operator), irreversible versions, versions a tool
//! switched to by itself, and putting things right after a crash. Pure: a record and
//! facts in, a new record (to be written durably *before* acting) and a decision out.
//!
//! A probation must survive a restart of supd without depending on the wall clock,
//! which may be stepped by a day either way (a board without an RTC before NTP). The
//! record keeps the probation's length and its `CLOCK_BOOTTIME` deadline with the boot id
//! ([`Clocks`]); the wall-clock times beside them are for people. In the same boot a
//! probation resumes at its BOOTTIME deadline (never later than its length from now); in
//! another boot everything restarted anyway, and a fresh full probation begins.
//!
//! Every decision that touches `current` comes as a [`Change`]: the record to write, then
//! the version to switch to, then whether to restart. The shell carries it out in that
//! order and stops at the first failure, so `current` never names a version the durable
//! record does not explain.

use crate::restart::History;
use crate::time::{Clocks, MAX_DURATION};
use semver::Version;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Where the last upgrade of a tool is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// No upgrade yet.
    #[default]
    Idle,
    Probation,
    Committed,
    RolledBack,
    /// Not revertible and crash-looped: it stays, marked failed.
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Probation => "probation",
            Phase::Committed => "committed",
            Phase::RolledBack => "rolled-back",
            Phase::Failed => "failed",
        }
    }
}

/// Why a version must not be used again without `--force`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadMark {
    pub reason: String,
    pub time_ms: u64,
}

/// The durable record of one tool.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Record {
    /// The version `current` names (or will name, once an intent is carried out).
    pub current: Option<String>,
    /// The version before `current`, the target of a plain `rollback`.
    pub previous: Option<String>,
    pub phase: Phase,
    /// The version of the last upgrade (in probation, committed, rolled back or failed).
    pub proposed: Option<String>,
    /// The version in use before the probation: what a rollback returns to.
    pub from: Option<String>,
    /// Wall-clock start and deadline of the probation, for display only.
    pub started_ms: Option<u64>,
    pub deadline_ms: Option<u64>,
    /// The probation's length (absent in records of older supds).
    pub probation_ms: Option<u64>,
    /// The boot the BOOTTIME deadline belongs to.
    pub boot_id: Option<String>,
    /// The probation's deadline on `CLOCK_BOOTTIME`, in milliseconds.
    pub boot_deadline_ms: Option<u64>,
    /// The probation may not be rolled back (`--irreversible` or the version's manifest).
    pub irreversible_upgrade: bool,
    /// Upgrades tried, per version (their sum: the probations begun, for metrics).
    pub attempts: BTreeMap<String, u32>,
    /// Rollbacks carried out: of failed probations (and regressions), by operators, by
    /// the tool itself (absent in records of older supds: counted from then on).
    pub rollbacks: u32,
    pub bad: BTreeMap<String, BadMark>,
    /// Versions that have run and may not be gone back from.
    pub irreversible: BTreeSet<String>,
    /// Why the last upgrade ended as it did.
    pub reason: Option<String>,
    /// The version the last rollback left (a bad version, or the one an operator rolled
    /// back from): a link still naming it after a crash is a rollback not carried out.
    pub rolled_back_from: Option<String>,
    /// The restart histories of the tool's services while its version is watched (in
    /// probation or in its regression window), on CLOCK_MONOTONIC of the boot `boot_id`
    /// names: a supd restarted meanwhile counts the crashes before it, so it reaches the
    /// verdict an undisturbed one would.
    pub histories: BTreeMap<String, History>,
    /// A probation that does not count now (a leader-only service of the tool does not
    /// run on this node): what is left of it. No BOOTTIME deadline meanwhile.
    pub paused_left_ms: Option<u64>,
    /// After a commit: the regression window's length and its end on CLOCK_BOOTTIME (of
    /// the boot `boot_id` names).
    pub window_ms: Option<u64>,
    pub window_boot_deadline_ms: Option<u64>,
    /// CLOCK_BOOTTIME when supd last wrote a probation that counts: a supd started
    /// again in the same boot does not count the time after it (supd may have been down
    /// for all of it, and nothing watched the version meanwhile).
    pub boot_noted_ms: Option<u64>,
    /// A service of the tool started on `current` since it last changed: the change was
    /// carried out. A link that names something else after a crash was then moved since
    /// (by the tool, or by hand), not a change left half done.
    pub link_seen: bool,
}

/// An operator's `upgrade`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub version: String,
    pub force: bool,
    pub irreversible: bool,
}

/// What the file system says about the requested version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    pub installed: bool,
    /// Why a service's program in that version cannot be run, if it cannot.
    pub not_executable: Option<String>,
    /// `revertible = false` in its `sup-tool.toml`.
    pub manifest_irreversible: bool,
    pub probation: Duration,
    pub clocks: Clocks,
}

/// A change of a tool, carried out in this order, each step only once the one before
/// it is done: the record written durably (when it differs from the one held), `current`
/// switched, the tool's services restarted (all but `except`, which the caller starts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub record: Record,
    pub switch: Option<String>,
    pub restart: bool,
    pub except: Option<String>,
}

impl Change {
    /// Only a new record.
    pub fn record(record: Record) -> Change {
        Change {
            record,
            switch: None,
            restart: false,
            except: None,
        }
    }

    /// A new record, then `current` switched to `to`, then every service restarted.
    pub fn switch(record: Record, to: &str) -> Change {
        Change {
            record,
            switch: Some(to.to_string()),
            restart: true,
            except: None,
        }
    }
}

/// Starts a probation of `length` now.
fn start_probation(n: &mut Record, length: Duration, c: &Clocks) {
    let ms = length.min(MAX_DURATION).as_millis() as u64;
    n.started_ms = Some(c.wall_ms);
    n.deadline_ms = Some(c.wall_ms.saturating_add(ms));
    n.probation_ms = Some(ms);
    n.boot_id = Some(c.boot_id.clone()).filter(|id| !id.is_empty());
    // `boot_ms` is rounded down: one more millisecond keeps the deadline from coming
    // before the probation's length has passed.
    n.boot_deadline_ms = Some(c.boot_ms.saturating_add(ms).saturating_add(1));
    n.boot_noted_ms = Some(c.boot_ms);
    n.paused_left_ms = None;
    n.histories.clear();
    end_window(n);
}

/// The record as supd writes it now: a probation that counts notes when (on
/// CLOCK_BOOTTIME), so that a supd started again counts only the time up to it.
pub fn noted(r: &Record, c: &Clocks) -> Record {
    let mut n = r.clone();
    if r.phase == Phase::Probation && r.boot_deadline_ms.is_some() && this_boot(r, c) {
        n.boot_noted_ms = Some(c.boot_ms);
    }
    n
}

/// The regression window is over (or another change came).
fn end_window(n: &mut Record) {
    n.window_ms = None;
    n.window_boot_deadline_ms = None;
}

/// The probation's length: recorded, or (a record of an older supd) the difference of
/// its two wall-clock times, written together. Never above [`MAX_DURATION`].
pub fn probation_length(r: &Record) -> Duration {
    let ms = r.probation_ms.unwrap_or_else(|| {
        r.deadline_ms
            .unwrap_or(0)
            .saturating_sub(r.started_ms.unwrap_or(0))
    });
    Duration::from_millis(ms).min(MAX_DURATION)
}

/// How much of the record's probation is left: in the boot it was started in, up to its
/// BOOTTIME deadline, never more than its length; otherwise its whole length.
pub fn probation_left(r: &Record, c: &Clocks) -> Duration {
    let length = probation_length(r);
    if let Some(left) = r.paused_left_ms {
        return Duration::from_millis(left).min(length);
    }
    match (&r.boot_id, r.boot_deadline_ms) {
        (Some(id), Some(d)) if !c.boot_id.is_empty() && *id == c.boot_id => {
            Duration::from_millis(d.saturating_sub(c.boot_ms)).min(length)
        }
        _ => length,
    }
}

/// At start: a probation recorded in another boot (or by an older supd, without a BOOTTIME
/// deadline) begins again, whole; one of this boot goes on unchanged.
///
/// Likewise a regression window: whole again in another boot. Restart histories are
/// times of one boot: kept in it, dropped in another.
pub fn resume(r: &Record, c: &Clocks) -> Record {
    let same_boot = this_boot(r, c);
    let mut n = r.clone();
    if !same_boot {
        n.histories.clear();
    }
    let goes_on = same_boot && (r.boot_deadline_ms.is_some() || r.paused_left_ms.is_some());
    if let (true, Phase::Probation, Some(d), Some(at)) =
        (same_boot, r.phase, r.boot_deadline_ms, r.boot_noted_ms)
    {
        // Goes on from when it was last written: the time since, supd down for all or
        // part of it, does not count. (A clean stop or a reexec writes it just before.)
        let lost = c.boot_ms.saturating_sub(at);
        n.boot_deadline_ms = Some(d.saturating_add(lost));
        n.deadline_ms = r.deadline_ms.map(|w| w.saturating_add(lost));
        n.boot_noted_ms = Some(c.boot_ms);
    }
    if r.phase == Phase::Probation && !goes_on {
        if r.paused_left_ms.is_some() {
            // It does not count now: still paused, whole again (another boot).
            n.paused_left_ms = Some(probation_length(r).as_millis() as u64);
            n.boot_id = Some(c.boot_id.clone()).filter(|id| !id.is_empty());
            n.boot_deadline_ms = None;
            n.histories.clear();
        } else {
            start_probation(&mut n, probation_length(r), c);
        }
    }
    if let (Some(ms), false) = (r.window_ms, same_boot) {
        start_window(&mut n, Duration::from_millis(ms), c);
    }
    n
}

/// At the start of an image that took over by `reexec`: as `resume`, but a probation
/// goes on from its deadline as it is, the old image having written it just before the
/// exec (the exec's moment is not lost).
pub fn resume_handed_over(r: &Record, c: &Clocks) -> Record {
    let mut fresh = r.clone();
    if r.phase == Phase::Probation && this_boot(r, c) && r.boot_deadline_ms.is_some() {
        fresh.boot_noted_ms = Some(c.boot_ms);
    }
    resume(&fresh, c)
}

/// Whether the record's times belong to this boot.
fn this_boot(r: &Record, c: &Clocks) -> bool {
    !c.boot_id.is_empty() && r.boot_id.as_deref() == Some(c.boot_id.as_str())
}

/// A probation that waits for its leader-only services: it stops counting, what is
/// left kept. `None` when it is not counting already (or not a probation).
pub fn pause(r: &Record, c: &Clocks) -> Option<Record> {
    if r.phase != Phase::Probation || r.paused_left_ms.is_some() {
        return None;
    }
    let mut n = r.clone();
    n.paused_left_ms = Some(probation_left(r, c).as_millis() as u64);
    n.boot_deadline_ms = None;
    n.boot_id = Some(c.boot_id.clone()).filter(|id| !id.is_empty());
    Some(n)
}

/// A paused probation counts again from now. `None` when it was not paused.
pub fn unpause(r: &Record, c: &Clocks) -> Option<Record> {
    let left = r.paused_left_ms.filter(|_| r.phase == Phase::Probation)?;
    let mut n = r.clone();
    n.paused_left_ms = None;
    n.boot_id = Some(c.boot_id.clone()).filter(|id| !id.is_empty());
    // `left` came from a deadline already rounded up (`start_probation`).
    n.boot_deadline_ms = Some(c.boot_ms.saturating_add(left));
    n.boot_noted_ms = Some(c.boot_ms);
    // The wall-clock deadline, for people, follows.
    n.deadline_ms = Some(c.wall_ms.saturating_add(left));
    Some(n)
}

/// Whether the probation waits (does not count).
pub fn paused(r: &Record) -> bool {
    r.phase == Phase::Probation && r.paused_left_ms.is_some()
}

/// Starts a regression window of `length` now.
fn start_window(n: &mut Record, length: Duration, c: &Clocks) {
    let ms = length.min(MAX_DURATION).as_millis() as u64;
    if ms == 0 {
        end_window(n);
        return;
    }
    n.window_ms = Some(ms);
    n.boot_id = Some(c.boot_id.clone()).filter(|id| !id.is_empty());
    n.window_boot_deadline_ms = Some(c.boot_ms.saturating_add(ms).saturating_add(1));
}

/// How much of a committed version's regression window is left (`None`: none is); never
/// more than its recorded length (a record's end past it is garbage), nor any without one.
pub fn window_left(r: &Record, c: &Clocks) -> Option<Duration> {
    if r.phase != Phase::Committed {
        return None;
    }
    let end = r.window_boot_deadline_ms.filter(|_| this_boot(r, c))?;
    // `start_window` rounds its end up by one millisecond.
    let length = r
        .window_ms?
        .min(MAX_DURATION.as_millis() as u64)
        .saturating_add(1);
    let left = end.saturating_sub(c.boot_ms).min(length);
    (left > 0).then(|| Duration::from_millis(left))
}

/// The window came to its end: the record forgets it (and the histories kept for it).
pub fn window_over(r: &Record) -> Record {
    let mut n = r.clone();
    end_window(&mut n);
    n.histories.clear();
    n
}

/// Whether a failure of the tool's services decides about its version now: in
/// probation, or in the regression window after its commit.
pub fn watched(r: &Record, c: &Clocks) -> bool {
    r.phase == Phase::Probation || window_left(r, c).is_some()
}

/// A service's restart history, kept in the record while the version is watched.
/// `None` when nothing changes.
pub fn note_history(r: &Record, service: &str, h: &History, c: &Clocks) -> Option<Record> {
    if !watched(r, c) || r.histories.get(service) == Some(h) {
        return None;
    }
    let mut n = r.clone();
    n.histories.insert(service.to_string(), h.clone());
    n.boot_id = Some(c.boot_id.clone()).filter(|id| !id.is_empty());
    Some(n)
}

/// A crash loop or an unhealthy verdict in the regression window: rolled back to the
/// version before (marked bad), exactly as in probation; irreversible: it stays, failed.
pub fn regressed(r: &Record, reason: &str, now_ms: u64) -> (Record, Outcome) {
    let mut p = r.clone();
    p.phase = Phase::Probation;
    p.from = r.previous.clone();
    p.proposed = r.current.clone();
    p.irreversible_upgrade = r
        .current
        .as_ref()
        .is_some_and(|v| r.irreversible.contains(v));
    let (mut n, outcome) = end_probation(
        &p,
        &format!("regression after its commit: {reason}"),
        Some(now_ms),
    );
    if matches!(outcome, Outcome::RollBack(_)) {
        // The version before becomes current; the one before it stays `previous`
        // unknown: what was rolled back from is kept as such.
        n.previous = None;
    }
    (n, outcome)
}

/// What a failed probation leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Switch back to this version and restart the services.
    RollBack(String),
    /// Stay (irreversible, or nothing to go back to).
    Stay,
}

/// Something to do to the `current` link after a crash, before anything starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fix {
    Nothing,
    SwitchTo(String),
}

/// What to do when a service of the tool starts on `version`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartCheck {
    /// The expected version.
    Expected,
    /// The tool switched `current` by itself: an upgrade, now in probation.
    SelfUpgrade,
    /// It switched to a version marked bad: switch back to this one.
    SwitchBack(String),
    /// It switched back to the version before its probation, which is over.
    SwitchedBack,
}

/// `upgrade TOOL CURRENT --force`: the bad mark of the version `current` names is
/// cleared (a first version that failed its probation stays, marked bad; once the
/// operator has fixed what failed, the mark is lifted). Nothing is switched or restarted;
/// with no probation pending, the version is committed. `None` when the request is not
/// for the current version (an upgrade proper); without `--force`, or with no mark to
/// clear, the refusal says so.
pub fn clear_current_mark(tool: &str, r: &Record, req: &Request) -> Option<Result<Record, String>> {
    let v = &req.version;
    if r.current.as_deref() != Some(v.as_str()) || r.phase == Phase::Probation {
        return None;
    }
    let Some(mark) = r.bad.get(v) else {
        return Some(Err(format!("{tool} is already at {v}")));
    };
    if !req.force {
        return Some(Err(format!(
            "{tool} is already at {v}, marked bad ({}); --force clears the mark",
            mark.reason
        )));
    }
    let mut n = r.clone();
    n.bad.remove(v);
    n.phase = Phase::Committed;
    n.reason = Some(format!(
        "the bad mark of {v} was cleared by the operator (it was: {})",
        mark.reason
    ));
    Some(Ok(n))
}

/// The durable intent of an upgrade, or why it is refused (nothing changed).
pub fn begin_upgrade(tool: &str, r: &Record, req: &Request, f: &Facts) -> Result<Record, String> {
    let v = &req.version;
    if !f.installed {
        return Err(format!(
            "version {v} of {tool} is not installed (supctl install {tool} {v} DIR)"
        ));
    }
    if let Some(why) = &f.not_executable {
        return Err(format!("version {v} of {tool} cannot run: {why}"));
    }
    if r.phase == Phase::Probation {
        let p = r.proposed.as_deref().unwrap_or("?");
        return Err(format!(
            "the upgrade of {tool} to {p} is in probation; wait for it to commit or roll back"
        ));
    }
    if r.current.as_deref() == Some(v.as_str()) {
        return Err(format!("{tool} is already at {v}"));
    }
    if let (Some(mark), false) = (r.bad.get(v), req.force) {
        return Err(format!(
            "version {v} of {tool} is marked bad ({}); --force tries it once more",
            mark.reason
        ));
    }
    let mut n = r.clone();
    n.bad.remove(v);
    *n.attempts.entry(v.clone()).or_insert(0) += 1;
    n.from = r.current.clone();
    n.current = Some(v.clone());
    n.link_seen = false;
    n.proposed = Some(v.clone());
    n.phase = Phase::Probation;
    start_probation(&mut n, f.probation, &f.clocks);
    n.irreversible_upgrade = req.irreversible || f.manifest_irreversible;
    if n.irreversible_upgrade {
        n.irreversible.insert(v.clone());
    }
    n.reason = None;
    Ok(n)
}

/// The probation passed: the version is committed, and watched for `window` more (its
/// regression window; none when zero).
pub fn probation_passed(r: &Record, window: Duration, c: &Clocks) -> Record {
    let mut n = r.clone();
    n.phase = Phase::Committed;
    if r.from.is_some() {
        n.previous = r.from.clone();
    }
    n.from = None;
    clear_probation(&mut n);
    n.reason = None;
    start_window(&mut n, window, c);
    n
}

/// A probation is over: no deadline is left in the record, nor what it counted.
fn clear_probation(n: &mut Record) {
    n.deadline_ms = None;
    n.boot_deadline_ms = None;
    n.paused_left_ms = None;
    n.histories.clear();
}

/// The probation failed (a crash loop, a ready timeout): roll back or stay.
pub fn probation_failed(r: &Record, reason: &str, now_ms: u64) -> (Record, Outcome) {
    end_probation(r, reason, Some(now_ms))
}

/// A probation ended by a start the kernel refused for want of permission (the
/// service's user may not enter its directory or run its program): rolled back, or
/// staying, as for a failure, but the version is not marked bad. It is not at fault,
/// and once the modes are mended it may be tried again without `--force`.
pub fn probation_refused(r: &Record, reason: &str) -> (Record, Outcome) {
    end_probation(r, reason, None)
}

/// The end of a failed probation; the version is marked bad at `bad_at` (ms) if given.
fn end_probation(r: &Record, reason: &str, bad_at: Option<u64>) -> (Record, Outcome) {
    let mut n = r.clone();
    let Some(v) = r.proposed.clone() else {
        return (n, Outcome::Stay);
    };
    clear_probation(&mut n);
    n.reason = Some(reason.to_string());
    match (&r.from, r.irreversible_upgrade) {
        (Some(from), false) => {
            if let Some(time_ms) = bad_at {
                n.bad.insert(
                    v.clone(),
                    BadMark {
                        reason: reason.to_string(),
                        time_ms,
                    },
                );
            }
            n.phase = Phase::RolledBack;
            n.rollbacks = n.rollbacks.saturating_add(1);
            n.rolled_back_from = Some(v);
            n.current = Some(from.clone());
            n.link_seen = false;
            n.from = None;
            (n, Outcome::RollBack(from.clone()))
        }
        (None, false) => {
            // The first version: nothing to go back to. It stays, marked bad, so it is
            // not tried again by accident.
            if let Some(time_ms) = bad_at {
                n.bad.insert(
                    v,
                    BadMark {
                        reason: reason.to_string(),
                        time_ms,
                    },
                );
            }
            n.phase = Phase::Failed;
            (n, Outcome::Stay)
        }
        (_, true) => {
            n.phase = Phase::Failed;
            n.previous = r.from.clone().or(n.previous);
            n.from = None;
            (n, Outcome::Stay)
        }
    }
}

/// An operator's `rollback`: to `target`, or to the version before.
pub fn begin_rollback(
    tool: &str,
    r: &Record,
    target: Option<&str>,
    force: bool,
    installed: impl Fn(&str) -> bool,
) -> Result<(Record, String), String> {
    let cur = r
        .current
        .clone()
        .ok_or_else(|| format!("{tool} has no current version"))?;
    let to = match (target, r.phase) {
        (Some(t), _) => t.to_string(),
        (None, Phase::Probation) => r
            .from
            .clone()
            .ok_or_else(|| format!("{tool} has no version before {cur}"))?,
        (None, _) => r
            .previous
            .clone()
            .ok_or_else(|| format!("{tool} has no previous version; name one"))?,
    };
    if to == cur {
        return Err(format!("{tool} is already at {to}"));
    }
    if !installed(&to) {
        return Err(format!("version {to} of {tool} is not installed"));
    }
    if !force {
        if let Some(v) = crossed_irreversible(r, &to, &cur) {
            return Err(format!("going back from {cur} to {to} crosses the irreversible version {v}; --force if you are sure"));
        }
    }
    let mut n = r.clone();
    if r.phase == Phase::Probation {
        n.reason = Some(format!(
            "probation of {cur} cancelled by an operator's rollback"
        ));
    } else {
        n.reason = Some("rolled back by an operator".into());
    }
    n.phase = Phase::RolledBack;
    n.rollbacks = n.rollbacks.saturating_add(1);
    n.rolled_back_from = Some(cur.clone());
    n.previous = Some(cur);
    n.current = Some(to.clone());
    n.link_seen = false;
    n.from = None;
    clear_probation(&mut n);
    end_window(&mut n);
    Ok((n, to))
}

/// An irreversible version that has run, newer than `to` and not newer than `cur`.
fn crossed_irreversible(r: &Record, to: &str, cur: &str) -> Option<String> {
    let (Ok(to_v), Ok(cur_v)) = (Version::parse(to), Version::parse(cur)) else {
        return r.irreversible.contains(cur).then(|| cur.to_string());
    };
    let (low, high) = if to_v < cur_v {
        (to_v, cur_v)
    } else {
        (cur_v, to_v)
    };
    r.irreversible
        .iter()
        .find(|v| Version::parse(v).is_ok_and(|v| v > low && v <= high))
        .cloned()
}

/// What supd knows of a version a tool switched to by itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfSwitch {
    pub probation: Duration,
    /// `revertible = false` in the version's `sup-tool.toml`.
    pub manifest_irreversible: bool,
}

/// A service of the tool is starting on `version` (what `current` names now).
///
/// A version the tool switched to by itself is an upgrade with the operator's rules: its
/// rollback goes to the last committed version (a switch during another version's
/// probation does not make that one the target), its manifest may make it irreversible
/// (and a switch away from an irreversible version in probation cannot be undone
/// either), and a version marked bad is switched back from before anything of it runs.
pub fn on_start(r: &Record, version: &str, s: &SelfSwitch, c: &Clocks) -> (Record, StartCheck) {
    let expected = r.current.as_deref();
    if expected == Some(version)
        || r.phase == Phase::Probation && r.proposed.as_deref() == Some(version)
    {
        let mut n = r.clone();
        n.link_seen |= expected == Some(version);
        return (n, StartCheck::Expected);
    }
    let Some(last) = expected else {
        // The first version supd sees (placed by a provisioner): committed.
        let mut n = r.clone();
        n.current = Some(version.to_string());
        n.phase = Phase::Committed;
        n.link_seen = true;
        return (n, StartCheck::Expected);
    };
    if r.bad.contains_key(version) {
        return (r.clone(), StartCheck::SwitchBack(last.to_string()));
    }
    let in_probation = r.phase == Phase::Probation;
    if in_probation && r.from.as_deref() == Some(version) {
        // Back to the version before the probation, by the tool's own hand: the
        // probation is over, as by an operator's rollback (nothing marked bad). A
        // probation of it from itself would roll back, on failure, to itself.
        let mut n = r.clone();
        n.phase = Phase::RolledBack;
        n.rollbacks = n.rollbacks.saturating_add(1);
        n.rolled_back_from = Some(last.to_string());
        n.previous = Some(last.to_string());
        n.current = Some(version.to_string());
        n.from = None;
        n.link_seen = true;
        clear_probation(&mut n);
        n.reason = Some(format!(
            "the tool switched itself back from {last} (in probation) to {version}"
        ));
        return (n, StartCheck::SwitchedBack);
    }
    let mut n = r.clone();
    *n.attempts.entry(version.to_string()).or_insert(0) += 1;
    n.from = if in_probation {
        r.from.clone()
    } else {
        Some(last.to_string())
    };
    n.current = Some(version.to_string());
    n.link_seen = true;
    n.proposed = Some(version.to_string());
    n.phase = Phase::Probation;
    start_probation(&mut n, s.probation, c);
    n.irreversible_upgrade = s.manifest_irreversible || in_probation && r.irreversible_upgrade;
    if s.manifest_irreversible {
        n.irreversible.insert(version.to_string());
    }
    n.reason = Some(if in_probation {
        format!(
            "the tool switched itself from {last} (in probation) to {version}; a rollback goes to {}",
            r.from.as_deref().unwrap_or("nothing")
        )
    } else {
        format!("the tool switched itself from {last} to {version}")
    });
    (n, StartCheck::SelfUpgrade)
}

/// After a crash: what `current` must be made to name so the record and the link agree.
/// `link` is what `current` names now. Returns the (possibly updated) record.
pub fn reconcile(r: &Record, link: Option<&str>, c: &Clocks) -> (Record, Fix) {
    let want = r.current.as_deref();
    if link == want || want.is_none() {
        let mut n = r.clone();
        if want.is_none() {
            n.current = link.map(str::to_string);
            if n.current.is_some() && n.phase == Phase::Idle {
                n.phase = Phase::Committed;
            }
        }
        return (n, Fix::Nothing);
    }
    if r.link_seen {
        // The change was carried out (a service started on it): the link moved since,
        // by the tool or by hand. The start decides (`on_start`: a self-switch).
        return (r.clone(), Fix::Nothing);
    }
    match r.phase {
        Phase::Probation if link.is_some() && link == r.from.as_deref() => {
            // The intent was written, the switch was not made: make it, with a fresh
            // probation (the new version has not run yet).
            let mut n = r.clone();
            start_probation(&mut n, probation_length(r), c);
            (n, Fix::SwitchTo(want.unwrap_or_default().to_string()))
        }
        // A rollback (automatic or not) was recorded but not carried out: carry it out.
        // Only when the link still names what was rolled back from (a record of an
        // older supd: the bad version or the one rolled back from by an operator); a
        // link moved since to a third version is the tool's or an operator's doing,
        // which the start decides (`on_start`: a self-switch, with probation).
        Phase::RolledBack
            if link.is_some()
                && match &r.rolled_back_from {
                    Some(v) => link == Some(v.as_str()),
                    None => link == r.proposed.as_deref() || link == r.previous.as_deref(),
                } =>
        {
            (
                r.clone(),
                Fix::SwitchTo(want.unwrap_or_default().to_string()),
            )
        }
        Phase::RolledBack => (r.clone(), Fix::Nothing),
        // Anything else: the link moved without supd; starting the service decides
        // (`on_start`: a self-switch, with probation).
        Phase::Idle | Phase::Probation | Phase::Committed | Phase::Failed => {
            (r.clone(), Fix::Nothing)
        }
    }
}

#[cfg(test)]
mod tests;
