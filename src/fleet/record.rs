//! What lives in the store under `/sup/fleet/TOOL/`:
//!
//! - `target`, no store lease, written only by compare-and-swap, its `epoch` raised by one
//!   on every write (by an operator's `fleet set|halt|resume`, or by a node that halts the
//!   roll): the version the fleet should run, where to get it, how to roll it, whether the
//!   roll is halted, and the versions marked bad for the fleet;
//! - `nodes/NODE`, bound to the node's store lease (gone with the node): its status;
//! - `roster/NODE`, no store lease: made once, when the node first joins (its create
//!   revision is the node's place in the order, stable across restarts), and rewritten
//!   with the node's last status when that changes, so a node that is gone is still
//!   shown with what it last said;
//! - `slots/N` (N below `max_parallel`), no store lease: a node in probation, or about to
//!   be. Made by compare-and-create, so no more than `max_parallel` nodes hold one; given
//!   back only by its holder once its probation is over (a holder that died keeps it until
//!   it returns, or until an operator `fleet forget`s it).

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The prefix of everything about the fleet of `tool`.
pub fn prefix(tool: &str) -> String {
    format!("/sup/fleet/{tool}/")
}

/// `target`: the fleet's desired version.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Target {
    pub epoch: u64,
    /// The version to run (None: no target was ever set).
    pub version: Option<String>,
    /// `http://`, `https://` or `file://` URL of its `.tar.gz`.
    pub url: String,
    /// Its sha256, lowercase hex.
    pub sha256: String,
    /// How many nodes go first; the rest wait until that many committed.
    pub canary: u32,
    /// How many nodes may be in probation at once.
    pub max_parallel: u32,
    /// The operator says the version is irreversible: nodes upgrade with
    /// `--irreversible` (a failed probation stays), and the roll goes on past its first
    /// commit.
    pub irreversible: bool,
    /// The roll goes on past the first commit of an irreversible version (set with
    /// `irreversible`, or by `fleet resume` after the roll paused there).
    pub allow_irreversible: bool,
    /// How many times `--force` started a bad version again.
    pub forced: u32,
    /// Versions an operator's `--force` let nodes start again though they rolled them
    /// back (supd marked them bad there): without it, such a node reports its rollback
    /// (a halt) rather than force the version by itself.
    pub forced_versions: BTreeSet<String>,
    pub halted: Option<Halt>,
    /// Versions marked bad for the whole fleet.
    pub bad: BTreeMap<String, Mark>,
    /// When the target was last set (wall clock, for people).
    pub set_at: String,
}

impl Target {
    /// Whether `version` may not be started by any node now.
    pub fn blocked(&self) -> bool {
        self.halted.is_some()
            || self
                .version
                .as_ref()
                .is_some_and(|v| self.bad.contains_key(v))
    }
}

/// Why a roll stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Halt {
    pub version: String,
    /// The node whose upgrade halted it; None when an operator did.
    pub node: Option<String>,
    pub reason: String,
    pub at: String,
}

/// A version marked bad for the fleet: where and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub node: String,
    pub reason: String,
    pub at: String,
}

/// Where a node stands with the fleet's target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// No target, or one that is halted before this node started it.
    #[default]
    Idle,
    /// Fetching, verifying or installing the target.
    Downloading,
    /// Installed, waiting for its turn.
    Waiting,
    Probation,
    Committed,
    RolledBack,
    /// Failed its probation and stayed (not revertible), or supd refused the upgrade.
    Failed,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Downloading => "downloading",
            Phase::Waiting => "waiting",
            Phase::Probation => "probation",
            Phase::Committed => "committed",
            Phase::RolledBack => "rolled-back",
            Phase::Failed => "failed",
        }
    }
}

/// `nodes/NODE` (and the copy in `roster/NODE`): a node's upgrade status.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Status {
    pub node: String,
    /// The version `current` names on the node.
    pub running: Option<String>,
    /// The version of its last upgrade (in probation, committed, rolled back, failed).
    pub proposed: Option<String>,
    pub phase: Phase,
    /// The last attempt's result, in a few words ("committed", "rolled back",
    /// "download failed", ...), and why.
    pub result: Option<String>,
    pub reason: Option<String>,
    /// When the phase or the result last changed (wall clock, for people).
    pub at: String,
    /// The target epoch this status answers.
    pub epoch: u64,
    /// The running version cannot be gone back from.
    pub irreversible: bool,
    /// The node leads a lease whose tool is this one: it upgrades last.
    pub leader: bool,
    /// While it downloads the target: how far it is (at most once per T).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Transfer>,
    /// In probation (or in its regression window, slot held): what was left of it, in
    /// ms, when this node's status first said so. Once the node is gone, the others say
    /// so after that much and T more (`gone`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probation_left_ms: Option<u64>,
    /// The nodes gone in probation that this node has watched gone longer than their
    /// probation left plus T, each with that limit in ms (see `rule::gone`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub gone: BTreeMap<String, u64>,
}

/// A download under way: the bytes come so far, and the size when it is known.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Transfer {
    pub bytes: u64,
    pub total: Option<u64>,
}

impl Status {
    /// The same status, leaving out when it was said (to tell a change).
    pub fn same_as(&self, other: &Status) -> bool {
        Status {
            at: String::new(),
            ..self.clone()
        } == Status {
            at: String::new(),
            ..other.clone()
        }
    }
}

/// `slots/N`: who holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Slot {
    pub node: String,
    pub version: String,
    /// supd's count of attempts at `version` on that node when the slot was taken: a
    /// higher count means the upgrade was asked for under this slot.
    pub attempts_before: u32,
}
