//! What supd holds about its tools, as types: each tool's state (its record, probation
//! deadlines, a change waiting to be written), the helper processes it waits for, and
//! what a start of a tool's service is told. The coordinator holds them
//! (`Supervisor::tools`, `Supervisor::tasks`); `tools.rs` and its files change them.
//! Outside `tools/` (which re-exports them as `tools::state`) because the coordinator
//! sits below `tools.rs`, which adds methods to it: importing `tools` from
//! `supervisor.rs` would be an import running back up.

use crate::time::Mono;
use crate::upgrade::{Change, Record};
use serde_json::Value;
use std::collections::BTreeSet;
use std::fs::File;
use std::path::PathBuf;
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
