//! The file store: one JSON file, read and rewritten under an exclusive lock for every
//! operation. For one host and for trying sup-lease out; it has etcd's revisions, leases
//! and conditional writes.
//!
//! Lease expiries are kept on `CLOCK_BOOTTIME`, the clock sup-lease dates its renewals
//! and supd its grants by: the wall clock would let a `date -s` or an NTP step end a
//! store lease early (two leaders) or late, and `CLOCK_MONOTONIC` stops during suspend.
//! `CLOCK_BOOTTIME` starts again at every boot, so the file says which boot its
//! expiries belong to; a file of another boot (or an older file, on the wall clock)
//! has every lease ended at once.

use super::store::{Cond, Identity, Kv, LeaseId, Store, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
struct Data {
    /// This store's identity, made when the file is (older files get one at their next
    /// use): a deleted and remade file is another store.
    id: String,
    revision: u64,
    next_lease: LeaseId,
    /// The boot whose `CLOCK_BOOTTIME` the expiries are on (absent in older files).
    boot_id: String,
    /// Lease id → (TTL in ms, expiry in ms of `CLOCK_BOOTTIME`).
    leases: BTreeMap<LeaseId, (u64, u64)>,
    kvs: BTreeMap<String, Entry>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    value: String,
    create_revision: u64,
    mod_revision: u64,
    lease: LeaseId,
}

/// A store in a file.
pub struct FileStore {
    path: PathBuf,
}

fn now_ms() -> u64 {
    crate::time::Boot::now().as_ms()
}

/// This boot's id; empty when unreadable (then no file's leases are trusted across it).
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

impl FileStore {
    pub fn new(path: PathBuf) -> FileStore {
        FileStore { path }
    }

    /// Runs `f` on the data under the lock, expired leases and their keys removed first,
    /// and writes the result back (temp file and rename) when `f` changed it.
    fn with<T>(&mut self, f: impl FnOnce(&mut Data) -> T) -> Result<T, StoreError> {
        let lock_path = self.path.with_extension("lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| err(format!("{}: {e}", lock_path.display())))?;
        let _guard = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| err(format!("lock {}: {e}", lock_path.display())))?;
        let mut data: Data = match std::fs::read(&self.path) {
            Ok(b) if b.is_empty() => Data::default(),
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| err(format!("{} is corrupt: {e}", self.path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Data::default(),
            Err(e) => return Err(err(format!("{}: {e}", self.path.display()))),
        };
        let fresh = data.id.is_empty();
        let now = now_ms();
        let boot = boot_id();
        let other_boot = data.boot_id != boot;
        data.boot_id = boot;
        let expired: Vec<LeaseId> = data
            .leases
            .iter()
            .filter(|(_, (_, until))| other_boot || *until <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            drop_lease(&mut data, *id);
        }
        if data.id.is_empty() {
            data.id = new_id();
        }
        let before = serde_json::to_vec(&data).map_err(err)?;
        let out = f(&mut data);
        let after = serde_json::to_vec(&data).map_err(err)?;
        if after != before || !expired.is_empty() || fresh {
            crate::records::atomic_write_mode(&self.path, &after, false, 0o666)
                .map_err(|e| err(format!("{}: {e}", self.path.display())))?;
        }
        Ok(out)
    }
}

/// A new store id: the kernel's random UUID, or the time and pid when it cannot be read.
fn new_id() -> String {
    match std::fs::read_to_string("/proc/sys/kernel/random/uuid") {
        Ok(u) if !u.trim().is_empty() => format!("file:{}", u.trim()),
        _ => format!(
            "file:{}-{}",
            crate::time::Boot::now().as_ms(),
            std::process::id()
        ),
    }
}

fn drop_lease(d: &mut Data, id: LeaseId) {
    d.leases.remove(&id);
    let before = d.kvs.len();
    d.kvs.retain(|_, e| e.lease != id);
    if d.kvs.len() != before {
        d.revision += 1;
    }
}

fn holds(d: &Data, key: &str, cond: Cond) -> bool {
    let e = d.kvs.get(key);
    match cond {
        Cond::Absent => e.is_none(),
        Cond::ModRevision(r) => e.is_some_and(|e| e.mod_revision == r),
        Cond::Lease(id) => e.is_some_and(|e| e.lease == id),
    }
}

impl Store for FileStore {
    fn grant(&mut self, ttl: Duration) -> Result<LeaseId, StoreError> {
        let ms = ttl.as_millis() as u64;
        self.with(|d| {
            d.next_lease += 1;
            d.leases.insert(d.next_lease, (ms, now_ms() + ms));
            d.next_lease
        })
    }

    fn keepalive(&mut self, id: LeaseId) -> Result<bool, StoreError> {
        self.with(|d| match d.leases.get_mut(&id) {
            Some((ttl, until)) => {
                *until = now_ms() + *ttl;
                true
            }
            None => false,
        })
    }

    fn revoke(&mut self, id: LeaseId) -> Result<(), StoreError> {
        self.with(|d| drop_lease(d, id))
    }

    fn range(&mut self, prefix: &str) -> Result<Vec<Kv>, StoreError> {
        self.range_with_identity(prefix).map(|(kvs, _)| kvs)
    }

    fn range_with_identity(&mut self, prefix: &str) -> Result<(Vec<Kv>, Identity), StoreError> {
        self.with(|d| {
            let kvs = d
                .kvs
                .iter()
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(k, e)| Kv {
                    key: k.clone(),
                    value: e.value.clone(),
                    create_revision: e.create_revision,
                    mod_revision: e.mod_revision,
                    lease: e.lease,
                })
                .collect();
            let id = Identity {
                id: d.id.clone(),
                revision: d.revision,
            };
            (kvs, id)
        })
    }

    fn put_when(
        &mut self,
        key: &str,
        value: &str,
        lease: LeaseId,
        conds: &[(&str, Cond)],
    ) -> Result<Option<u64>, StoreError> {
        self.with(|d| {
            if conds.iter().any(|(k, c)| !holds(d, k, *c)) {
                return Err(None);
            }
            if lease != 0 && !d.leases.contains_key(&lease) {
                return Err(Some(err(format!("lease {lease} not found"))));
            }
            d.revision += 1;
            let rev = d.revision;
            let create = d.kvs.get(key).map(|e| e.create_revision).unwrap_or(rev);
            d.kvs.insert(
                key.to_string(),
                Entry {
                    value: value.to_string(),
                    create_revision: create,
                    mod_revision: rev,
                    lease,
                },
            );
            Ok(rev)
        })
        .and_then(|r| match r {
            Ok(rev) => Ok(Some(rev)),
            Err(None) => Ok(None),
            Err(Some(e)) => Err(e),
        })
    }

    fn delete(&mut self, key: &str, cond: Cond) -> Result<bool, StoreError> {
        self.with(|d| {
            if !holds(d, key, cond) {
                return false;
            }
            d.revision += 1;
            d.kvs.remove(key).is_some()
        })
    }

    fn check(&mut self, key: &str, cond: Cond) -> Result<bool, StoreError> {
        self.with(|d| holds(d, key, cond))
    }

    fn identity(&mut self) -> Result<Identity, StoreError> {
        self.with(|d| Identity {
            id: d.id.clone(),
            revision: d.revision,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_keys_and_conditions() {
        let path = std::env::temp_dir().join(format!("sup-filestore-{}.json", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut s = FileStore::new(path.clone());
        let a = s.grant(Duration::from_secs(10)).expect("grant");
        let b = s.grant(Duration::from_millis(300)).expect("grant");
        let r1 = s
            .put("/x/leader", "a", a, Some(Cond::Absent))
            .expect("put")
            .expect("created");
        assert_eq!(
            s.put("/x/leader", "b", b, Some(Cond::Absent)).expect("put"),
            None,
            "compare-and-create fails"
        );
        assert!(s.check("/x/leader", Cond::Lease(a)).expect("check"));
        assert!(!s.check("/x/leader", Cond::Lease(b)).expect("check"));
        let r2 = s
            .put("/x/leader", "a2", a, Some(Cond::ModRevision(r1)))
            .expect("put")
            .expect("cas");
        assert!(r2 > r1);
        assert_eq!(
            s.put("/x/leader", "z", a, Some(Cond::ModRevision(r1)))
                .expect("put"),
            None,
            "stale cas fails"
        );
        s.put("/x/members/b", "b", b, None).expect("put");
        s.put("/y/other", "o", 0, None).expect("put");
        // b's lease expires by the clock: its key goes with it.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while s.range("/x/").expect("range").len() != 1 {
            assert!(std::time::Instant::now() < deadline);
        }
        assert!(!s.keepalive(b).expect("keepalive"));
        assert!(s.keepalive(a).expect("keepalive"));
        let kvs = s.range("/x/").expect("range");
        assert_eq!(
            (
                kvs[0].key.as_str(),
                kvs[0].value.as_str(),
                kvs[0].create_revision,
                kvs[0].mod_revision
            ),
            ("/x/leader", "a2", r1, r2)
        );
        s.revoke(a).expect("revoke");
        assert!(s.range("/x/").expect("range").is_empty());
        assert!(!s.delete("/y/other", Cond::Lease(5)).expect("delete"));
        assert!(s.delete("/y/other", Cond::Lease(0)).expect("delete"));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_file_has_an_id_that_a_new_file_does_not_share() {
        let path = std::env::temp_dir().join(format!("sup-fileid-{}.json", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut s = FileStore::new(path.clone());
        let first = s.identity().expect("identity");
        assert!(first.id.starts_with("file:"), "{first:?}");
        s.put("/x/a", "1", 0, None).expect("put");
        let later = s.identity().expect("identity");
        assert_eq!((later.id.as_str(), later.revision), (first.id.as_str(), 1));
        let (kvs, with_range) = s.range_with_identity("/x/").expect("range");
        assert_eq!((kvs.len(), with_range), (1, later.clone()));
        std::fs::remove_file(&path).expect("wipe");
        let wiped = s.identity().expect("identity");
        assert_ne!(wiped.id, first.id);
        assert_eq!(wiped.revision, 0);
        let _ = std::fs::remove_file(&path);
    }
}
