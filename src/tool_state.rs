//! The tools part: what supd holds about its tools (each tool's state: its record,
//! probation deadlines, a change waiting to be written, starts held for it) and the
//! helper processes it waits for (installs, prunes, a `reexec`'s check), in private
//! fields, with the types they are made of. Its methods take what happened (a change
//! carried out or waiting, a deadline come, a start, a helper reaped) and answer what
//! the coordinator must do; the coordinator's side (`supervisor/tools.rs` and its
//! files) writes records, switches links, restarts services and runs helpers.
//!
//! Across `reexec`: the helpers still running that the new image can finish (installs,
//! deletions: [`Carried`]); tools' states are loaded again from their records, and a
//! change waiting for its record, or another reexec's check, refuses the reexec
//! ([`Tools::why_not_reexec`]). Imports no part and not the coordinator.

use crate::protocol::{Error, ErrorKind};
use crate::restart::History;
use crate::time::{Clocks, Mono};
use crate::upgrade::{self, Change, Outcome, Phase, Record};
use crate::versions;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

/// The first wait before a change whose record could not be written is tried again;
/// it doubles up to [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_millis(100);
pub const RETRY_MAX: Duration = Duration::from_secs(10);

/// What supd holds about one tool.
#[derive(Clone, Debug, Default)]
pub struct ToolState {
    /// The record as it is on disk (held only once written).
    pub record: Record,
    /// The probation's deadline, while it has not come.
    pub deadline: Option<Mono>,
    /// The deadline came: commit as soon as every service of the tool is ready.
    pub overdue: bool,
    /// The end of the regression window after a commit, while it has not come.
    pub window: Option<Mono>,
    /// Services of the tool whose start waits for a change of `current` that supd could
    /// not make yet (a switch back from a bad version): started once it is made.
    pub held: BTreeSet<String>,
    /// The record could not be read at start (it was set aside).
    pub record_error: Option<String>,
    /// A change supd decided but could not write: nothing of it is done; retried.
    pub pending: Option<Pending>,
    /// Leftovers of interrupted installs and prunes were looked at.
    pub swept: bool,
}

/// A change waiting for its record to be written.
#[derive(Clone, Debug)]
pub struct Pending {
    pub change: Change,
    pub op: Op,
    /// "cannot write record ...: ENOSPC (No space left on device)".
    pub error: String,
    pub retry_at: Mono,
    pub delay: Duration,
}

/// Which change it is: for failpoints, logs and events once it is carried out.
#[derive(Clone, Debug)]
pub enum Op {
    /// Putting the record and the link right at start; resuming a probation.
    Load,
    Upgrade,
    Commit,
    /// A failed probation's end: roll back to `to` (or stay, `to` = None).
    Rollback {
        version: String,
        to: Option<String>,
        why: String,
        /// The version was marked bad (not when its start was refused for want of
        /// permission).
        marked: bool,
    },
    OpRollback {
        from: String,
        to: String,
    },
    SelfUpgrade {
        version: String,
    },
    SwitchBack {
        version: String,
        to: String,
    },
    /// What a watched version's verdict rests on (its services' crash histories, a
    /// leader-only probation paused or counting again, a regression window's end).
    Note,
}

impl Op {
    /// The failpoint prefix.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Op::Load => "load",
            Op::Upgrade => "upgrade",
            Op::Commit => "commit",
            Op::Rollback { .. } => "rollback",
            Op::OpRollback { .. } => "oprollback",
            Op::SelfUpgrade { .. } => "selfupgrade",
            Op::SwitchBack { .. } => "switchback",
            Op::Note => "note",
        }
    }

    /// What waits, for `versions` and the log.
    pub fn describe(&self, r: &Record) -> String {
        let p = r.proposed.as_deref().unwrap_or("?");
        match self {
            Op::Load => "putting the record right at start".into(),
            Op::Upgrade => format!("the upgrade to {p}"),
            Op::Commit => format!("the commit of {p}"),
            Op::Rollback {
                version,
                to: Some(to),
                ..
            } => format!("the rollback from {version} to {to}"),
            Op::Rollback { version, .. } => format!("the end of {version}'s probation"),
            Op::OpRollback { from, to } => format!("the rollback from {from} to {to}"),
            Op::SelfUpgrade { version } => format!("the probation of {version}"),
            Op::SwitchBack { version, to } => {
                format!("switching back from the bad version {version} to {to}")
            }
            Op::Note => format!("the probation record of {p}"),
        }
    }
}

/// Why a change stopped (everything before the failed step is done, nothing after).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The record could not be written: nothing was done.
    Record(String),
    /// The record is written, `current` could not be switched.
    Switch(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Record(e) | Failure::Switch(e) => f.write_str(e),
        }
    }
}

/// "ENOSPC (No space left on device)" for an I/O error, its text otherwise.
pub fn errno_text(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => {
            let errno = nix::errno::Errno::from_raw(n);
            format!("{errno:?} ({})", errno.desc())
        }
        None => e.to_string(),
    }
}

/// Whether a start of a tool's service goes on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartGo {
    /// On the version planned.
    AsPlanned,
    /// `current` was switched back from a bad version: plan again (once).
    Replan,
    /// Not now, for this reason (a change of the tool must be made first).
    Held(String),
}

/// A helper process supd waits for.
#[derive(Clone, Debug)]
pub enum Task {
    /// Copying a version in; the client (if it is still there: not after a reexec) is
    /// answered when it ends.
    Install {
        tool: String,
        version: String,
        client: Option<(u64, Value)>,
        /// The read end of the pipe the copy writes why it failed into (not carried
        /// across a reexec: the answer then gives the exit status alone).
        why: Option<Rc<File>>,
    },
    /// Deleting pruned versions and leftovers.
    Prune { dirs: Vec<PathBuf> },
    /// `BINARY --handshake NONCE`, before re-executing into it (handshake.rs).
    ReexecCheck {
        binary: PathBuf,
        client: u64,
        id: Value,
        nonce: String,
        /// The read end of the pipe that is its standard output (non-blocking: read
        /// once it ended, and a process it left may hold the write end).
        answer: Rc<File>,
        /// When it is killed if it has not ended.
        by: Mono,
        /// It was killed at `by`.
        timed_out: bool,
        /// The program, opened before it ran: the file that answers is the file
        /// executed (`handshake::open`).
        program: Rc<File>,
    },
}

/// A helper process carried across `exec` (it stays a child of the same pid).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "task", rename_all = "kebab-case")]
pub enum TaskState {
    Install {
        pid: i32,
        tool: String,
        version: String,
    },
    Prune {
        pid: i32,
        dirs: Vec<PathBuf>,
    },
}

/// The part as the handoff carries it: the helpers still running, under `tasks`, as in
/// every format. An install's client is gone with the old image, but the copy finishes
/// and is moved into place; without them, the new image would take a live install's
/// staging directory for a dead one.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Carried {
    #[serde(default)]
    pub tasks: Vec<TaskState>,
}

/// The tools part.
#[derive(Debug, Default)]
pub struct Tools {
    /// Versioned tools, by name: each loaded at its first use.
    tools: BTreeMap<String, ToolState>,
    /// Helper processes (installs, prunes, a reexec's check), by pid.
    tasks: BTreeMap<i32, Task>,
}

/// A loaded tool's state (`ensure_tool` loads it): indexing a tool not loaded panics,
/// as a map's does.
impl<Q: Ord + ?Sized> std::ops::Index<&Q> for Tools
where
    String: std::borrow::Borrow<Q>,
{
    type Output = ToolState;

    fn index(&self, tool: &Q) -> &ToolState {
        &self.tools[tool]
    }
}

impl Tools {
    /// The tool's state, once loaded.
    pub fn get(&self, tool: &str) -> Option<&ToolState> {
        self.tools.get(tool)
    }

    /// Every loaded tool's state, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &ToolState)> {
        self.tools.iter()
    }

    /// Whether the tool's state is loaded.
    pub fn is_loaded(&self, tool: &str) -> bool {
        self.tools.contains_key(tool)
    }

    /// The tool's state, loaded (its record as it is on disk).
    pub fn insert(&mut self, tool: &str, state: ToolState) {
        self.tools.insert(tool.to_string(), state);
    }

    /// The tool's record as held (as it is on disk), once loaded.
    pub fn record(&self, tool: &str) -> Option<&Record> {
        self.tools.get(tool).map(|t| &t.record)
    }

    /// The record of a change is durable: held (before `current` is switched).
    pub fn hold_record(&mut self, tool: &str, record: Record) {
        let t = self.tools.entry(tool.to_string()).or_default();
        t.record = record;
    }

    /// A change of the tool is carried out (its record held, `current` switched):
    /// nothing waits any more, and the probation's deadline and the regression window
    /// follow the record, counted from the clocks read now, together (the record's
    /// writes took time since the loop's `now`, and a probation never ends before its
    /// length). Returns the starts that waited for the change.
    pub fn carried_out(&mut self, tool: &str) -> BTreeSet<String> {
        let t = self.tools.entry(tool.to_string()).or_default();
        t.pending = None;
        t.overdue = false;
        let (mono, clocks) = (Mono::now(), Clocks::now());
        t.deadline = (t.record.phase == Phase::Probation && !upgrade::paused(&t.record))
            .then(|| mono.plus(upgrade::probation_left(&t.record, &clocks)));
        t.window = upgrade::window_left(&t.record, &clocks).map(|left| mono.plus(left));
        std::mem::take(&mut t.held)
    }

    /// supd's own change could not be carried out (`error`): it waits, with nothing
    /// done, and is tried again after a delay doubled from the last one's (from
    /// [`RETRY_FIRST`], at most [`RETRY_MAX`]). Returns the delay.
    pub fn wait(
        &mut self,
        tool: &str,
        change: Change,
        op: Op,
        error: String,
        now: Mono,
    ) -> Duration {
        let t = self.tools.entry(tool.to_string()).or_default();
        let delay = t
            .pending
            .as_ref()
            .map(|p| p.delay.saturating_mul(2).min(RETRY_MAX))
            .unwrap_or(RETRY_FIRST);
        t.pending = Some(Pending {
            change,
            op,
            error,
            retry_at: now.plus(delay),
            delay,
        });
        delay
    }

    /// The change of the tool waiting for its record, if one does.
    pub fn pending(&self, tool: &str) -> Option<&Pending> {
        self.tools.get(tool).and_then(|t| t.pending.as_ref())
    }

    /// Why the tool's change waits ("cannot write record ...: ENOSPC ..."), or nothing.
    pub fn pending_error(&self, tool: &str) -> String {
        self.pending(tool)
            .map(|p| p.error.clone())
            .unwrap_or_default()
    }

    /// The tools whose waiting change is due to be tried again.
    pub fn retries_due(&self, now: Mono) -> Vec<String> {
        self.tools
            .iter()
            .filter(|(_, t)| t.pending.as_ref().is_some_and(|p| p.retry_at <= now))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Refuses an operator's change while one of supd's own waits for its record.
    pub fn refuse_while_pending(&self, tool: &str) -> Result<(), Error> {
        match self.pending(tool) {
            Some(p) => Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "{tool}: {} waits for its record ({}); supd retries it; nothing changed",
                    p.op.describe(&p.change.record),
                    p.error
                ),
            )),
            None => Ok(()),
        }
    }

    /// A service `name` of the tool is about to start on `version` while a change of
    /// supd's own waits for its record: it goes on only on the version that change
    /// names (and does not mark bad); any other waits with the change (held, started
    /// once it is made). `None` when no change waits.
    pub fn start_while_pending(
        &mut self,
        tool: &str,
        name: &str,
        version: &str,
    ) -> Option<StartGo> {
        let p = self.pending(tool)?;
        let r = &p.change.record;
        let vouched = r.current.as_deref() == Some(version) && !r.bad.contains_key(version);
        if vouched {
            return Some(StartGo::AsPlanned);
        }
        let why = format!(
            "tool {tool}: {} waits ({}); {version} does not run meanwhile",
            p.op.describe(r),
            p.error
        );
        Some(self.hold_start(tool, name, why))
    }

    /// A start that must wait for a change of the tool: noted, so the change's end
    /// starts it; the caller fails the start with `why`.
    pub fn hold_start(&mut self, tool: &str, name: &str, why: String) -> StartGo {
        if let Some(t) = self.tools.get_mut(tool) {
            t.held.insert(name.to_string());
        }
        StartGo::Held(why)
    }

    /// The answer to `upgrade --wait`, once the tool's probation is over.
    pub fn upgrade_settled(&self, tool: &str) -> Option<Result<Value, Error>> {
        let failed = |msg: String| Error::new(ErrorKind::Failed, msg);
        let r = &self.tools.get(tool)?.record;
        let v = r.proposed.as_deref().unwrap_or("?");
        let why = r.reason.as_deref().unwrap_or("no reason recorded");
        match r.phase {
            Phase::Probation => None,
            Phase::Committed | Phase::Idle => Some(Ok(
                json!({"tool": tool, "phase": r.phase.as_str(), "current": r.current}),
            )),
            Phase::RolledBack => Some(Err(failed(format!(
                "{tool} {v} was rolled back to {}: {why}",
                r.current.as_deref().unwrap_or("?")
            )))),
            Phase::Failed => Some(Err(failed(format!(
                "{tool} {v} failed its probation and stays (not revertible): {why}"
            )))),
        }
    }

    /// A service of the tool failed (`mark`: crash-looped, not ready in time, unhealthy)
    /// or was refused its start for want of permission (the version is then not marked
    /// bad): in probation, or in the regression window after a commit when it failed,
    /// that is the end of the watch: the change to make (roll back, or stay when it may
    /// not be rolled back). `None` when the tool's version is not watched so.
    pub fn probation_end(
        &self,
        tool: &str,
        why: &str,
        mark: bool,
        now_ms: u64,
    ) -> Option<(Change, Op)> {
        let state = self.tools.get(tool)?;
        let in_window = upgrade::window_left(&state.record, &Clocks::now()).is_some();
        if state.record.phase != Phase::Probation && !(mark && in_window) {
            return None;
        }
        let (new, outcome) = if state.record.phase != Phase::Probation {
            // In the regression window after its commit: as in probation.
            upgrade::regressed(&state.record, why, now_ms)
        } else if mark {
            upgrade::probation_failed(&state.record, why, now_ms)
        } else {
            upgrade::probation_refused(&state.record, why)
        };
        let version = new.proposed.clone().unwrap_or_default();
        let (change, to) = match outcome {
            Outcome::RollBack(to) => (Change::switch(new, &to), Some(to)),
            Outcome::Stay => (Change::record(new), None),
        };
        let op = Op::Rollback {
            version,
            to,
            why: why.to_string(),
            marked: mark,
        };
        Some((change, op))
    }

    /// A service `name` of the tool went through its restart rule with `history`: the
    /// record with that history written in, when the tool's version is watched (in
    /// probation, or in its regression window, with no change waiting) and the history
    /// is new to it.
    pub fn history_to_note(&self, tool: &str, name: &str, history: &History) -> Option<Record> {
        // Cheap first: most events of versioned services come with nothing watched.
        let t = self.tools.get(tool).filter(|t| {
            t.pending.is_none() && (t.record.phase == Phase::Probation || t.window.is_some())
        })?;
        upgrade::note_history(&t.record, name, history, &Clocks::now())
    }

    /// The tools in probation with no change waiting.
    pub fn in_probation(&self) -> Vec<String> {
        self.tools
            .iter()
            .filter(|(_, t)| t.record.phase == Phase::Probation && t.pending.is_none())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The tool's probation paused (`counting` false: what is left kept in the record)
    /// or counting again, when that changes its record.
    pub fn probation_counting(
        &self,
        tool: &str,
        counting: bool,
        clocks: &Clocks,
    ) -> Option<Record> {
        let r = &self.tools.get(tool)?.record;
        if counting {
            upgrade::unpause(r, clocks)
        } else {
            upgrade::pause(r, clocks)
        }
    }

    /// Every record whose probation counted since it was written, with the time it has
    /// counted up to now (no change waiting).
    pub fn notes_due(&self, clocks: &Clocks) -> Vec<(String, Record)> {
        self.tools
            .iter()
            .filter(|(_, t)| t.pending.is_none())
            .map(|(n, t)| (n.clone(), upgrade::noted(&t.record, clocks)))
            .filter(|(n, r)| *r != self.tools[n].record)
            .collect()
    }

    /// The tools whose regression window is over (no change waiting).
    pub fn windows_over(&self, now: Mono) -> Vec<String> {
        self.tools
            .iter()
            .filter(|(_, t)| t.window.is_some_and(|w| w <= now) && t.pending.is_none())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The tool's regression window is over: no longer timed; the record that says so.
    pub fn end_window(&mut self, tool: &str) -> Option<Record> {
        let t = self.tools.get_mut(tool)?;
        t.window = None;
        Some(upgrade::window_over(&t.record))
    }

    /// The tools whose probation's deadline came (marked overdue: committed as soon as
    /// every service of the tool is ready), with no change waiting.
    pub fn commits_due(&mut self, now: Mono) -> Vec<String> {
        self.tools
            .iter_mut()
            .filter_map(|(n, t)| {
                if t.deadline.is_some_and(|d| d <= now) {
                    t.deadline = None;
                    t.overdue = true;
                }
                (t.overdue && t.pending.is_none()).then(|| n.clone())
            })
            .collect()
    }

    /// The earliest probation deadline, regression window's end or retry of a change
    /// waiting for its record.
    pub fn next_deadline(&self) -> Option<Mono> {
        let retries = self
            .tools
            .values()
            .filter_map(|t| t.pending.as_ref().map(|p| p.retry_at));
        self.tools
            .values()
            .filter_map(|t| t.deadline)
            .chain(self.tools.values().filter_map(|t| t.window))
            .chain(retries)
            .min()
    }

    /// The tools loaded since the last sweep, marked swept.
    pub fn to_sweep(&mut self) -> Vec<String> {
        self.tools
            .iter_mut()
            .filter(|(_, t)| !t.swept)
            .map(|(n, t)| {
                t.swept = true;
                n.clone()
            })
            .collect()
    }

    /// A helper was started.
    pub fn add_task(&mut self, pid: i32, task: Task) {
        self.tasks.insert(pid, task);
    }

    /// Whether `pid` is a helper's.
    pub fn is_task(&self, pid: i32) -> bool {
        self.tasks.contains_key(&pid)
    }

    /// The helpers' pids.
    pub fn task_pids(&self) -> impl Iterator<Item = i32> + '_ {
        self.tasks.keys().copied()
    }

    /// The helper `pid` was reaped: what it was doing, if it was a helper.
    pub fn take_task(&mut self, pid: i32) -> Option<Task> {
        self.tasks.remove(&pid)
    }

    /// Every helper, taken (supd is about to exit and ends them).
    pub fn take_tasks(&mut self) -> BTreeMap<i32, Task> {
        std::mem::take(&mut self.tasks)
    }

    /// Whether a helper is copying `version` of `tool` in.
    pub fn installing(&self, tool: &str, version: &str) -> bool {
        self.tasks.values().any(
            |t| matches!(t, Task::Install { tool: t, version: v, .. } if t == tool && v == version),
        )
    }

    /// What helpers work on in `tool`'s directory (under `tools_dir`): an install's
    /// staging, a prune's hidden directories; a sweep never touches them.
    pub fn busy_dirs(&self, tools_dir: &Path, tool: &str) -> BTreeSet<PathBuf> {
        self.tasks
            .values()
            .flat_map(|t| match t {
                Task::Install {
                    tool: t, version, ..
                } if *t == tool => {
                    vec![versions::install_tmp(tools_dir, t, version)]
                }
                Task::Prune { dirs } => dirs.clone(),
                Task::Install { .. } | Task::ReexecCheck { .. } => Vec::new(),
            })
            .collect()
    }

    /// When the next handshake that has not ended is cut short.
    pub fn handshake_deadline(&self) -> Option<Mono> {
        (self.tasks.values())
            .filter_map(|t| match t {
                Task::ReexecCheck {
                    by,
                    timed_out: false,
                    ..
                } => Some(*by),
                _ => None,
            })
            .min()
    }

    /// The handshakes past their deadline, marked timed out: the pids the coordinator
    /// kills (their exit, reaped as any helper's, refuses the reexec).
    pub fn handshakes_past(&mut self, now: Mono) -> Vec<i32> {
        let mut past = Vec::new();
        for (pid, t) in self.tasks.iter_mut() {
            if let Task::ReexecCheck { by, timed_out, .. } = t {
                if !*timed_out && *by <= now {
                    *timed_out = true;
                    past.push(*pid);
                }
            }
        }
        past
    }

    /// What of the part a `reexec` now would lose, if anything: a change waiting for
    /// its record (the new image could not finish it), another reexec's check.
    pub fn why_not_reexec(&self) -> Option<String> {
        let pending: Vec<&str> = (self.tools.iter())
            .filter(|(_, t)| t.pending.is_some())
            .map(|(n, _)| n.as_str())
            .collect();
        if !pending.is_empty() {
            return Some(format!(
                "a change of {} waits for its record (supd retries writing it)",
                pending.join(", ")
            ));
        }
        if (self.tasks.values()).any(|t| matches!(t, Task::ReexecCheck { .. })) {
            return Some("another reexec is under way".into());
        }
        None
    }

    /// The part as the handoff carries it: installs and deletions under way. A reexec's
    /// check is not carried: its client goes with the exec, and its end is an orphan's.
    pub fn handoff(&self) -> Carried {
        let tasks = self
            .tasks
            .iter()
            .filter_map(|(&pid, t)| match t {
                Task::Install { tool, version, .. } => Some(TaskState::Install {
                    pid,
                    tool: tool.clone(),
                    version: version.clone(),
                }),
                Task::Prune { dirs } => Some(TaskState::Prune {
                    pid,
                    dirs: dirs.clone(),
                }),
                // Its client goes with the exec; its end is an orphan's.
                Task::ReexecCheck { .. } => None,
            })
            .collect();
        Carried { tasks }
    }

    /// The helpers an older image handed over, taken up (an install's client is gone).
    pub fn adopt(&mut self, carried: Carried) {
        for t in carried.tasks {
            let (pid, task) = match t {
                TaskState::Install { pid, tool, version } => (
                    pid,
                    Task::Install {
                        tool,
                        version,
                        client: None,
                        why: None,
                    },
                ),
                TaskState::Prune { pid, dirs } => (pid, Task::Prune { dirs }),
            };
            self.tasks.insert(pid, task);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(tools: &mut Tools, now: Mono) -> Duration {
        let record = Record {
            current: Some("1.0.0".into()),
            ..Record::default()
        };
        let error = "cannot write record: ENOSPC".to_string();
        tools.wait("t", Change::record(record), Op::Load, error, now)
    }

    #[test]
    fn a_waiting_change_is_retried_after_a_doubling_delay_and_refuses_a_reexec() {
        let mut tools = Tools::default();
        assert!(tools.why_not_reexec().is_none());
        let now = Mono(1_000);
        assert_eq!(waiting(&mut tools, now), RETRY_FIRST);
        assert_eq!(waiting(&mut tools, now), RETRY_FIRST * 2);
        for _ in 0..20 {
            waiting(&mut tools, now);
        }
        assert_eq!(tools.pending("t").map(|p| p.delay), Some(RETRY_MAX));
        assert!(tools.retries_due(now).is_empty());
        assert_eq!(
            tools.retries_due(now.plus(RETRY_MAX)),
            vec!["t".to_string()]
        );
        assert!(tools.refuse_while_pending("t").is_err());
        assert!(tools
            .why_not_reexec()
            .is_some_and(|w| w.contains("a change of t")));
        assert!(tools.carried_out("t").is_empty());
        assert!(tools.pending("t").is_none() && tools.why_not_reexec().is_none());
    }

    #[test]
    fn while_a_change_waits_a_start_goes_on_only_on_the_version_it_names() {
        let mut tools = Tools::default();
        assert_eq!(tools.start_while_pending("t", "web", "1.0.0"), None);
        waiting(&mut tools, Mono(0));
        let go = tools.start_while_pending("t", "web", "1.0.0");
        assert_eq!(go, Some(StartGo::AsPlanned));
        let go = tools.start_while_pending("t", "web", "2.0.0");
        assert!(matches!(go, Some(StartGo::Held(why)) if why.contains("2.0.0 does not run")));
        assert_eq!(tools.carried_out("t"), BTreeSet::from(["web".to_string()]));
    }

    #[test]
    fn installs_and_prunes_are_carried_and_a_reexec_check_is_not() {
        let mut tools = Tools::default();
        let file = || Rc::new(File::open("/dev/null").expect("/dev/null"));
        tools.add_task(
            7,
            Task::Install {
                tool: "t".into(),
                version: "1.0.0".into(),
                client: None,
                why: None,
            },
        );
        tools.add_task(
            8,
            Task::Prune {
                dirs: vec!["/x".into()],
            },
        );
        tools.add_task(
            9,
            Task::ReexecCheck {
                binary: "/sbin/supd".into(),
                client: 1,
                id: Value::Null,
                nonce: "n".into(),
                answer: file(),
                by: Mono(5),
                timed_out: false,
                program: file(),
            },
        );
        assert!(tools.installing("t", "1.0.0") && !tools.installing("t", "2.0.0"));
        assert_eq!(
            tools.why_not_reexec().as_deref(),
            Some("another reexec is under way")
        );
        assert_eq!(tools.handshake_deadline(), Some(Mono(5)));
        assert!(tools.handshakes_past(Mono(4)).is_empty());
        assert_eq!(tools.handshakes_past(Mono(5)), vec![9]);
        assert_eq!(tools.handshake_deadline(), None, "cut once");
        let mut new = Tools::default();
        new.adopt(tools.handoff());
        assert_eq!(new.task_pids().collect::<Vec<_>>(), vec![7, 8]);
        assert!(new.installing("t", "1.0.0"));
        assert!(matches!(new.take_task(8), Some(Task::Prune { .. })));
        assert!(!new.is_task(8) && new.is_task(7));
    }
}
