//! What the store holds for a lease, read in one range (with the store's identity, in
//! one request on etcd), and the policy's compare-and-swap write.

use super::record::{prefix, term, Leader, LeaderRecord, Member, Policy};
use super::store::{Cond, Identity, Kv, LeaseId, Store, StoreError};
use serde_json::Value;

/// What the store holds for a lease, read in one range.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub members: Vec<Member>,
    /// The leader record, the revision of its last write, and its store lease.
    pub leader: Option<(Leader, u64, LeaseId)>,
    pub policy: Policy,
    /// The policy key's last write (0: none yet), for compare-and-swap.
    pub policy_revision: u64,
    /// The node that said it is stepping down (`releasing`), if any.
    pub releasing: Option<String>,
    /// The least term the leader record stands for (0: none said, an older record).
    pub min_term: u64,
    /// The term whose holder released it cleanly (`released`, written with the
    /// deletion of `leader` once its leader-only runs had exited), if any.
    pub released: Option<u64>,
}

impl Snapshot {
    /// The term of the leadership in `leader`: its revision, or its `min_term` when
    /// higher (after a store was wiped).
    pub fn term(&self) -> Option<u64> {
        let (_, revision, _) = self.leader.as_ref()?;
        Some(term(*revision, self.min_term))
    }
}

/// Reads every key of `lease`. Undecodable values are skipped and said.
pub fn snapshot(store: &mut dyn Store, lease: &str) -> Result<Snapshot, StoreError> {
    read(store, lease).map(|(s, _)| s)
}

/// The snapshot and the store's identity, read together (one request on etcd).
pub fn read(store: &mut dyn Store, lease: &str) -> Result<(Snapshot, Identity), StoreError> {
    let p = prefix(lease);
    let mut s = Snapshot::default();
    let (kvs, identity) = store.range_with_identity(&p)?;
    for Kv {
        key,
        value,
        mod_revision,
        lease: id,
        ..
    } in kvs
    {
        let name = &key[p.len()..];
        let bad =
            |e: serde_json::Error| log::warn!("{key}: cannot read its value ({e}); ignoring it");
        if name.starts_with("members/") {
            match serde_json::from_str(&value) {
                Ok(m) => s.members.push(m),
                Err(e) => bad(e),
            }
        } else if name == "leader" {
            match serde_json::from_str::<LeaderRecord>(&value) {
                Ok(r) => {
                    s.leader = Some((r.leader, mod_revision, id));
                    s.min_term = r.min_term;
                }
                Err(e) => bad(e),
            }
        } else if name == "releasing" {
            s.releasing = Some(value.trim().to_string());
        } else if name == "released" {
            match serde_json::from_str::<Value>(&value) {
                Ok(v) => s.released = v["term"].as_u64(),
                Err(e) => bad(e),
            }
        } else if name == "policy" {
            match serde_json::from_str(&value) {
                Ok(pol) => (s.policy, s.policy_revision) = (pol, mod_revision),
                Err(e) => bad(e),
            }
        }
    }
    Ok((s, identity))
}

/// Writes a new policy if nobody wrote it since `revision` was read; the epoch goes up.
pub fn write_policy(
    store: &mut dyn Store,
    lease: &str,
    snap: &Snapshot,
    change: impl FnOnce(&mut Policy),
) -> Result<Policy, String> {
    let mut p = snap.policy.clone();
    change(&mut p);
    p.epoch = snap.policy.epoch + 1;
    let cond = if snap.policy_revision == 0 {
        Cond::Absent
    } else {
        Cond::ModRevision(snap.policy_revision)
    };
    let value = serde_json::to_string(&p).map_err(|e| e.to_string())?;
    match store.put(&format!("{}policy", prefix(lease)), &value, 0, Some(cond)) {
        Ok(Some(_)) => Ok(p),
        Ok(None) => Err(format!("the policy of {lease} was changed by another writer since epoch {}; read it again and retry", snap.policy.epoch)),
        Err(e) => Err(format!("cannot write the policy: {e}")),
    }
}
