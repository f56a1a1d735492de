//! The file store: the store's JSON, written whole as a new generation for every
//! change, under a directory `PATH.d` beside the path it is named by, with no lock
//! (`dirs`: a write is a compare-and-swap by create-if-absent, so a sup-lease stopped
//! or frozen in the middle of one holds nobody up). For one host and for trying
//! sup-lease out; it has etcd's revisions, leases and conditional writes.
//!
//! Lease expiries are kept on `CLOCK_BOOTTIME`, the clock sup-lease dates its renewals
//! and supd its grants by: the wall clock would let a `date -s` or an NTP step end a
//! store lease early (two leaders) or late, and `CLOCK_MONOTONIC` stops during suspend.
//! `CLOCK_BOOTTIME` starts again at every boot, so the data says which boot its
//! expiries belong to; data of another boot (or older data, on the wall clock) has
//! every lease ended at once.

mod dirs;
#[cfg(test)]
mod tests;

use super::store::{Change, Cond, Identity, Kv, LeaseId, Store, StoreError, Watched};
use crate::time::Boot;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
struct Data {
    /// This store's identity, made with the store (older stores get one at their next
    /// use): a store moved away and made anew is another store.
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
    /// The last generation of its epoch: the data goes on in the next (`dirs`).
    sealed: bool,
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

/// A store in a directory of files.
pub struct FileStore {
    dirs: dirs::Dirs,
    /// How long a call goes on reading again and redoing its change while other
    /// writers' changes beat it (each of them one that was made: nobody waits).
    timeout: Duration,
}

fn now_ms() -> u64 {
    crate::time::Boot::now().as_ms()
}

/// This boot's id; empty when unreadable (then no store's leases are trusted across it).
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

impl FileStore {
    /// The store named by `path` (in `PATH.d`).
    pub fn new(path: PathBuf) -> FileStore {
        FileStore::with_timeout(path, Duration::from_secs(2))
    }

    /// The same, whose calls give up after `timeout` of losing to other writers.
    pub fn with_timeout(path: PathBuf, timeout: Duration) -> FileStore {
        FileStore {
            dirs: dirs::Dirs::new(path),
            timeout,
        }
    }

    /// The directory the store is in, `PATH.d`.
    pub fn dir(&self) -> &std::path::Path {
        self.dirs.dir()
    }

    /// The data as the latest generation holds it. Expired leases are not carried out
    /// (that is a write: `with`).
    fn peek<T>(&self, mut f: impl FnMut(&mut Data) -> T) -> Result<T, StoreError> {
        let mut head = self.dirs.latest(Boot::now().plus(self.timeout))?;
        Ok(f(&mut head.data))
    }

    /// Runs `f` on the latest data, expired leases and their keys removed first, and
    /// writes the result as the next generation when it changed. When another writer
    /// wrote that generation first, `f` runs again on the data it made, and so on until
    /// the timeout.
    fn with<T>(&mut self, mut f: impl FnMut(&mut Data) -> T) -> Result<T, StoreError> {
        let t0 = Boot::now();
        let deadline = t0.plus(self.timeout);
        let mut lost = 0u64;
        loop {
            let head = self.dirs.latest(deadline)?;
            let mut data = head.data.clone();
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
            if after == before && expired.is_empty() && !fresh {
                return Ok(out);
            }
            if self.dirs.commit(&head, &data)? {
                return Ok(out);
            }
            lost += 1;
            if Boot::now() >= deadline {
                return Err(err(format!(
                    "{}: other writers wrote first {lost} times in a row in {}; try again",
                    self.dirs.dir().display(),
                    crate::time::Human(Boot::now().since(t0))
                )));
            }
        }
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

    /// inotify on `PATH.d` (new epochs) and on each epoch in it (new generations:
    /// a write links one), set up again before every read of the data, so that no
    /// change is missed, and on the directory `PATH.d` is in (for `PATH.d` made, or
    /// moved away); and a look at the earliest end of a store lease the keys rest on,
    /// since an expiry is carried out by whoever writes next. `after` 0 gives every
    /// key (the store's revisions start at 0). The changes are the keys written after
    /// `after` and the deletions `gone` keeps (a key written twice meanwhile shows its
    /// last write).
    fn watch(&mut self, prefix: &str, after: u64, deadline: Boot) -> Result<Watched, StoreError> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        use std::os::fd::AsFd;
        let store = self.dirs.dir().to_path_buf();
        let parent = match store.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = store.file_name().map(|n| n.to_os_string());
        let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| err(format!("inotify: {e}")))?;
        let dir_changes = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_ONLYDIR;
        let parent_wd = ino
            .add_watch(&parent, dir_changes)
            .map_err(|e| err(format!("inotify {}: {e}", parent.display())))?;
        // (An end already passed makes the first wait below end at once.)
        let mut due = false;
        loop {
            match ino.add_watch(&store, dir_changes) {
                Ok(_) | Err(nix::errno::Errno::ENOENT) => {}
                Err(e) => return Err(err(format!("inotify {}: {e}", store.display()))),
            }
            for epoch in self.dirs.epochs() {
                match ino.add_watch(&epoch, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_ONLYDIR) {
                    Ok(_) | Err(nix::errno::Errno::ENOENT) => {}
                    Err(e) => return Err(err(format!("inotify {}: {e}", epoch.display()))),
                }
            }
            // A read, unless an expiry is due (a write, carried out by `with`).
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
            // Waits for a new generation or epoch, or for PATH.d made or moved: temp
            // files and retired epochs do not count.
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
                    written |= evs.iter().any(|e| {
                        let Some(n) = e.name.as_ref() else {
                            return false;
                        };
                        if e.wd == parent_wd {
                            return Some(n) == name.as_ref();
                        }
                        let n = n.to_string_lossy();
                        dirs::epoch_of(&n).is_some() || dirs::generation_of(&n).is_some()
                    });
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
