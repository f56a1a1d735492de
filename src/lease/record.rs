//! What lives in the store under `/sup/lease/L/`: members, the leader, the policy.

use semver::Version;
use serde::{Deserialize, Serialize};

/// The prefix of everything about lease `lease`.
pub fn prefix(lease: &str) -> String {
    format!("/sup/lease/{lease}/")
}

/// `members/NODE`: a candidacy, bound to the node's store lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub node: String,
    /// The version of the lease's tool on that node (absent: none).
    pub version: Option<String>,
    /// The lease has a tool on that node. Without one (plain leader election) there is
    /// no version, and every live member may lead. Absent in records of older
    /// sup-leases, which always had a version to offer: true.
    #[serde(default = "yes")]
    pub versioned: bool,
    /// Past probation.
    pub committed: bool,
    /// Not committed: its version waits in a probation that only leading lets it pass
    /// (the lease's tool runs as a leader-only service of the lease), and the lease is
    /// offered to it on trial, once (sup-lease remembers a trial it had and lost).
    /// Absent in records of older sup-leases: false.
    #[serde(default)]
    pub trial: bool,
    pub irreversible: bool,
    /// None of the lease's leader-only services on that node is unhealthy, or was so
    /// recently (supd holds a node out for the service's `cooldown` after its last
    /// unhealthy verdict). Absent in records of older sup-leases, which knew nothing of
    /// health: true.
    #[serde(default = "yes")]
    pub healthy: bool,
    /// Why it is not healthy: the service and its last failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its leader-only services of the lease cannot run on that node (one failed, is in
    /// its crash-loop cooldown, or is unhealthy; or the node stepped down for that and
    /// stays out for a while): why. Such a member leads only when no member that is not
    /// failing may. Absent in records of older sup-leases: not failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing: Option<String>,
}

fn yes() -> bool {
    true
}

impl Member {
    /// The version, when it is one.
    pub fn semver(&self) -> Option<Version> {
        self.version.as_deref().and_then(|v| Version::parse(v).ok())
    }
}

/// `leader`: who holds the lease, bound to the holder's store lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leader {
    pub node: String,
    pub version: Option<String>,
    /// The policy epoch the holder saw when it became leader.
    pub epoch: u64,
}

/// `leader` as written: the record and the least term it stands for. The term of a
/// leadership is the revision of the write that made it leader, or `min_term` when that
/// is higher: a store that was wiped or replaced counts its revisions from 1 again, and
/// the acquirer writes one more than the highest term it (and the members) saw, so that
/// a term never goes back. Every node reads the same record, so every node computes the
/// same term. Records of older sup-leases have no `min_term`: the revision alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderRecord {
    #[serde(flatten)]
    pub leader: Leader,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_term: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The term of a leadership written at `revision` with `min_term`.
pub fn term(revision: u64, min_term: u64) -> u64 {
    revision.max(min_term)
}

/// How the preferred version is chosen.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    #[default]
    Newest,
    Oldest,
    Pinned,
}

/// `policy`: written only by compare-and-swap, its epoch raised by one on every write.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Policy {
    pub epoch: u64,
    pub strategy: Strategy,
    /// The version when pinned.
    pub target: Option<String>,
    /// No version below this may lead.
    pub floor: Option<String>,
}

impl Policy {
    pub fn target(&self) -> Option<Version> {
        self.target.as_deref().and_then(|v| Version::parse(v).ok())
    }

    pub fn floor(&self) -> Option<Version> {
        self.floor.as_deref().and_then(|v| Version::parse(v).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_record_keeps_its_least_term_and_older_records_read() {
        let old = r#"{"node":"n1","version":"1.0.0","epoch":3}"#;
        let r: LeaderRecord = serde_json::from_str(old).expect("an older record");
        assert_eq!((r.leader.node.as_str(), r.min_term), ("n1", 0));
        assert_eq!(term(5, r.min_term), 5, "the revision, as before");
        let r = LeaderRecord {
            leader: r.leader,
            min_term: 26,
        };
        let text = serde_json::to_string(&r).expect("json");
        assert!(text.contains(r#""min_term":26"#), "{text}");
        let l: Leader = serde_json::from_str(&text).expect("an older sup-lease reads it");
        assert_eq!(l.epoch, 3);
        assert_eq!(term(5, 26), 26, "a wiped store's low revision");
        assert_eq!(term(40, 26), 40, "the revision once it is higher");
    }

    #[test]
    fn a_member_without_failing_is_not_failing() {
        let m: Member = serde_json::from_str(
            r#"{"node":"n1","version":"1.0.0","committed":true,"irreversible":false}"#,
        )
        .expect("an older member");
        assert_eq!(m.failing, None);
        assert!(m.healthy);
    }
}
