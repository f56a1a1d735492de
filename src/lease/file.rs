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

use super::store::{Change, Cond, Identity, Kv, LeaseId, Store, StoreError, Watched};
use crate::time::Boot;
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
    /// The last deletions, for watches: (key, revision, its last write's revision).
    gone: Vec<(String, u64, u64)>,
    /// Deletions up to this revision were dropped from `gone`.
    gone_floor: u64,
}

/// How many deletions `gone` keeps.
const GONE: usize = 256;

impl Data {
    /// Notes that `key`, last written at `prev`, was deleted at revision `rev`.
    fn deleted(&mut self, key: &str, rev: u64, prev: u64) {
        self.gone.push((key.to_string(), rev, prev));
        if self.gone.len() > GONE {
            let (_, r, _) = self.gone.remove(0);
            self.gone_floor = self.gone_floor.max(r);
        }
    }
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
    /// How long a call waits for the lock before it gives up (a sup-lease stopped while
    /// holding it must not hang every other node's tick, nor `status`).
    lock_wait: std::time::Duration,
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
        FileStore {
            path,
            lock_wait: std::time::Duration::from_secs(2),
        }
    }

    /// The same, whose calls wait at most `lock_wait` for the lock.
    pub fn with_lock_wait(path: PathBuf, lock_wait: std::time::Duration) -> FileStore {
        FileStore { path, lock_wait }
    }

    /// Takes the lock, waiting at most `lock_wait`: flock has no timeout, so a
    /// non-blocking attempt is made again every few milliseconds until then.
    fn lock(&self) -> Result<nix::fcntl::Flock<std::fs::File>, StoreError> {
        let lock_path = self.path.with_extension("lock");
        let mut lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| err(format!("{}: {e}", lock_path.display())))?;
        let end = Boot::now().plus(self.lock_wait);
        loop {
            match nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(g) => return Ok(g),
                Err((l, nix::errno::Errno::EWOULDBLOCK)) if Boot::now() < end => {
                    lock = l;
                    std::thread::sleep(std::time::Duration::from_millis(5)); // flock has no timeout
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    return Err(err(format!(
                        "{} is held by another process for more than {} (a sup-lease stopped or hung while holding it?)",
                        lock_path.display(),
                        crate::time::Human(self.lock_wait)
                    )))
                }
                Err((_, e)) => return Err(err(format!("lock {}: {e}", lock_path.display()))),
            }
        }
    }

    /// The data as the file holds it now, without the lock: every write is a rename
    /// onto the file, so a read sees one whole write. Expired leases are not carried
    /// out (that takes the lock: `with`).
    fn peek<T>(&self, f: impl FnOnce(&mut Data) -> T) -> Result<T, StoreError> {
        let mut data = self.read_data()?;
        Ok(f(&mut data))
    }

    fn read_data(&self) -> Result<Data, StoreError> {
        match std::fs::read(&self.path) {
            Ok(b) if b.is_empty() => Ok(Data::default()),
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| err(format!("{} is corrupt: {e}", self.path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Data::default()),
            Err(e) => Err(err(format!("{}: {e}", self.path.display()))),
        }
    }

    /// Runs `f` on the data under the lock, expired leases and their keys removed first,
    /// and writes the result back (temp file and rename) when `f` changed it.
    fn with<T>(&mut self, f: impl FnOnce(&mut Data) -> T) -> Result<T, StoreError> {
        let _guard = self.lock()?;
        let mut data = self.read_data()?;
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
    let gone: Vec<(String, u64)> = (d.kvs.iter())
        .filter(|(_, e)| e.lease == id)
        .map(|(k, e)| (k.clone(), e.mod_revision))
        .collect();
    if gone.is_empty() {
        return;
    }
    d.revision += 1;
    let rev = d.revision;
    for (k, prev) in gone {
        d.kvs.remove(&k);
        d.deleted(&k, rev, prev);
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
            let rev = d.revision;
            match d.kvs.remove(key) {
                Some(e) => {
                    d.deleted(key, rev, e.mod_revision);
                    true
                }
                None => false,
            }
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

    fn delete_marking(
        &mut self,
        key: &str,
        cond: Cond,
        marker: &str,
        value: &str,
    ) -> Result<bool, StoreError> {
        self.with(|d| {
            if !holds(d, key, cond) {
                return false;
            }
            d.revision += 1;
            let rev = d.revision;
            if let Some(e) = d.kvs.remove(key) {
                d.deleted(key, rev, e.mod_revision);
            }
            let create = d.kvs.get(marker).map(|e| e.create_revision).unwrap_or(rev);
            d.kvs.insert(
                marker.to_string(),
                Entry {
                    value: value.to_string(),
                    create_revision: create,
                    mod_revision: rev,
                    lease: 0,
                },
            );
            true
        })
    }

    /// inotify on the file's directory (every write is a rename onto the file), set up
    /// before the data is read, so that no change is missed; and a look at the earliest
    /// end of a store lease the keys rest on, since an expiry is carried out by whoever
    /// touches the file next. `after` 0 gives every key (the file's revisions start
    /// at 0). The changes are the keys written after `after` and the
    /// deletions `gone` keeps (a key written twice meanwhile shows its last write).
    fn watch(&mut self, prefix: &str, after: u64, deadline: Boot) -> Result<Watched, StoreError> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        use std::os::fd::AsFd;
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = self.path.file_name().map(|n| n.to_os_string());
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| err(format!("inotify: {e}")))?;
        ino.add_watch(
            &dir,
            AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_CLOSE_WRITE,
        )
        .map_err(|e| err(format!("inotify {}: {e}", dir.display())))?;
        // (An end already passed makes the first wait below end at once.)
        let mut due = false;
        loop {
            // Without the lock, unless an expiry is due (carried out under it): the watch
            // looks at every write of every node, and a lock taken that often by a
            // sup-lease that is then stopped would hang everyone.
            let look = |d: &mut Data| {
                if after > d.revision || after < d.gone_floor {
                    return (
                        Watched::Gap {
                            revision: d.revision,
                        },
                        None,
                    );
                }
                let mut changes: Vec<Change> = Vec::new();
                let mut end: Option<u64> = None;
                for (k, e) in d.kvs.iter().filter(|(k, _)| k.starts_with(prefix)) {
                    if e.mod_revision > after {
                        changes.push(Change {
                            key: k.clone(),
                            revision: e.mod_revision,
                            deleted: false,
                            prev: 0,
                        });
                    }
                    if let Some((_, until)) = d.leases.get(&e.lease) {
                        end = Some(end.map_or(*until, |x| x.min(*until)));
                    }
                }
                for (k, rev, prev) in &d.gone {
                    if *rev > after && k.starts_with(prefix) {
                        changes.push(Change {
                            key: k.clone(),
                            revision: *rev,
                            deleted: true,
                            prev: *prev,
                        });
                    }
                }
                changes.sort_by_key(|c| (c.revision, !c.deleted));
                let revision = d.revision;
                (Watched::Changes { changes, revision }, end)
            };
            let (seen, next_end) = if due {
                self.with(look)?
            } else {
                self.peek(look)?
            };
            let now = Boot::now();
            match seen {
                Watched::Changes { changes, .. } if changes.is_empty() && now < deadline => {}
                Watched::Changes { changes, .. } if changes.is_empty() => {
                    return Ok(Watched::Changes {
                        changes,
                        revision: after,
                    })
                }
                done => return Ok(done),
            }
            let mut until = deadline;
            if let Some(end) = next_end {
                // A millisecond past the end: `with` drops a lease at its end.
                until = until.min(Boot::from_ms(end + 1));
            }
            // Waits for a write of the file itself: the lock file, which every look
            // (this one too) opens for writing, does not count.
            loop {
                let now = Boot::now();
                if now >= until {
                    break;
                }
                let ms = until.since(now).as_millis().clamp(1, 60_000) as i32;
                let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
                match poll(
                    &mut fds,
                    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
                ) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(err(format!("poll: {e}"))),
                }
                let mut written = false;
                while let Ok(evs) = ino.read_events() {
                    if evs.is_empty() {
                        break;
                    }
                    written |= evs.iter().any(|e| e.name.as_ref() == name.as_ref());
                }
                if written {
                    break;
                }
            }
            // A store lease's end passed: the next look carries the expiry out.
            due = next_end.is_some_and(|end| Boot::now().as_ms() > end);
        }
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

    #[test]
    fn a_watch_sees_writes_and_deletions_with_their_last_write_and_wakes_at_an_expiry() {
        let path = std::env::temp_dir().join(format!("sup-filewatch-{}.json", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut s = FileStore::new(path.clone());
        let soon = || Boot::now().plus(Duration::from_millis(50));
        let Watched::Changes { changes, revision } = s.watch("/x/", 0, soon()).expect("watch")
        else {
            panic!("no gap from 0");
        };
        assert!(changes.is_empty());
        let a = s.grant(Duration::from_millis(400)).expect("grant");
        let r1 = s.put("/x/leader", "a", a, None).expect("put").expect("rev");
        let r2 = s
            .put("/x/members/a", "a", a, None)
            .expect("put")
            .expect("rev");
        s.put("/y/other", "o", 0, None).expect("put");
        let Watched::Changes { changes, revision } =
            s.watch("/x/", revision, soon()).expect("watch")
        else {
            panic!("gap");
        };
        let keys: Vec<(&str, u64)> = changes
            .iter()
            .map(|c| (c.key.as_str(), c.revision))
            .collect();
        assert_eq!(keys, [("/x/leader", r1), ("/x/members/a", r2)]);
        // Nothing more: back at the deadline, with nothing.
        let t0 = std::time::Instant::now();
        let w = s.watch("/x/", revision, soon()).expect("watch");
        assert_eq!(
            w,
            Watched::Changes {
                changes: vec![],
                revision
            }
        );
        assert!(t0.elapsed() >= Duration::from_millis(40));
        // The lease runs out with nobody touching the file: the watch sees both keys go
        // in one revision, with their last writes, well before its deadline.
        let t0 = std::time::Instant::now();
        let Watched::Changes { changes, .. } = s
            .watch("/x/", revision, Boot::now().plus(Duration::from_secs(5)))
            .expect("watch")
        else {
            panic!("gap");
        };
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert!(changes
            .iter()
            .all(|c| c.deleted && c.revision == changes[0].revision));
        assert_eq!((changes[0].prev, changes[1].prev), (r1, r2));
        assert!(matches!(
            s.watch("/x/", 1000, soon()),
            Ok(Watched::Gap { .. })
        ));
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(path.with_extension("lock"));
    }

    #[test]
    fn a_lock_held_elsewhere_fails_a_call_in_time_and_does_not_stop_the_watch() {
        let path = std::env::temp_dir().join(format!("sup-filelock-{}.json", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut s = FileStore::with_lock_wait(path.clone(), Duration::from_millis(200));
        let rev = s.put("/x/a", "1", 0, None).expect("put").expect("rev");
        // Another process (a sup-lease stopped while it held the lock) holds it.
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .open(path.with_extension("lock"))
            .expect("open the lock");
        let held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .expect("hold the lock");
        let t0 = std::time::Instant::now();
        let e = s.range("/x/").expect_err("the lock is held");
        assert!(e.0.contains("held by another process"), "{e}");
        assert!(
            t0.elapsed() >= Duration::from_millis(200) && t0.elapsed() < Duration::from_secs(2),
            "{:?}",
            t0.elapsed()
        );
        // The watch reads without it: it sees the store as it is, and waits.
        let w = s
            .watch("/x/", rev, Boot::now().plus(Duration::from_millis(50)))
            .expect("a watch without the lock");
        assert_eq!(
            w,
            Watched::Changes {
                changes: vec![],
                revision: rev
            }
        );
        drop(held);
        assert_eq!(s.range("/x/").expect("the lock is free").len(), 1);
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(path.with_extension("lock"));
    }
}
