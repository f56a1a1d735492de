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
    fn a_member_without_failing_is_not_failing() {
        let m: Member = serde_json::from_str(
            r#"{"node":"n1","version":"1.0.0","committed":true,"irreversible":false}"#,
        )
        .expect("an older member");
        assert_eq!(m.failing, None);
        assert!(m.healthy);
    }
}
