//! The file store on disk, with no lock: `PATH.d/` holds epochs `e1`, `e2`, ..., each a
//! directory of whole generations `0`, `1`, ... (the store's JSON, written once and
//! never changed). A write is a compare-and-swap by create-if-absent: the new data is
//! linked as the generation after the one it was computed from, which fails (`EEXIST`)
//! when anyone wrote meanwhile; the loser reads again and redoes its change. Nobody
//! waits for anybody, so a writer stopped or frozen anywhere holds nobody up, and its
//! stale write cannot land when it resumes:
//!
//! - generation N+1 of an epoch is made only by one that read N as the latest, and
//!   nothing is removed from a live epoch: slot N+1 is free only while N is the latest;
//! - an epoch ends with a `sealed` generation, linked after the [`ROTATE`]th or a later
//!   one: every slot up to it is taken, so nothing is written into that epoch after
//!   it. Its data, unsealed, is generation 0 of the next epoch, which whoever reads the
//!   seal makes (create-if-absent, from the one seal: every copy is the same);
//! - the epochs before the sealed one are retired: renamed out of the way first (a
//!   frozen writer's link into one then fails with `ENOENT`, never lands in a hole),
//!   then emptied. Every read goes by a name under `PATH.d`, so a reader that listed
//!   an epoch before it was renamed finds its generation gone, and reads again;
//! - the store is made by renaming a directory that already holds `e1/0` onto
//!   `PATH.d`, which fails when `PATH.d` exists: once made it is never empty, and a
//!   retired epoch is made again only by a helper that was frozen while copying its
//!   predecessor's seal, which leaves a stray epoch below the latest (retired with
//!   the others), never a write a caller believes made.
//!
//! Temp files are `PATH.d/tmp.PID.N`, retired epochs `PATH.d/old.E.PID.N`, a store
//! being made `PATH.d.new.PID.N`: a killed writer's are removed after a minute.

use super::{err, Data};
use crate::time::Boot;
use nix::errno::Errno;
use nix::fcntl::{openat, renameat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, mkdirat, Mode};
use nix::unistd::{linkat, unlinkat, UnlinkatFlags};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// A generation at or past this one seals its epoch (the next epoch starts).
pub(super) const ROTATE: u64 = 64;
/// A killed writer's leftovers (temp files, retired epochs) older than this are removed.
const LEFTOVER: Duration = Duration::from_secs(60);

/// The latest generation, as read.
pub(super) struct Head {
    /// `PATH.d`, open; `None` when there is no store yet.
    dir: Option<File>,
    epoch: u64,
    generation: u64,
    pub data: Data,
}

/// The store's directory beside the path it is named by.
pub(super) struct Dirs {
    /// The path the store is named by (`PATH`: an older sup-lease's one file).
    path: PathBuf,
    /// `PATH.d`.
    dir: PathBuf,
}

/// What a look at `PATH.d` found.
enum Look {
    Found(u64, u64, Data),
    /// Changed while it was read (an epoch retired meanwhile), or holds no generation.
    Again(String),
}

fn io(what: impl std::fmt::Display, e: impl std::fmt::Display) -> super::StoreError {
    err(format!("{what}: {e}"))
}

/// `e7` → 7.
pub(super) fn epoch_of(name: &str) -> Option<u64> {
    name.strip_prefix('e').and_then(generation_of)
}

/// `12` → 12 (digits only: not `+1`, not `tmp.1`).
pub(super) fn generation_of(name: &str) -> Option<u64> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

/// A name no other writer uses: this process's id and a count (and the time, for a
/// recycled pid's leftover).
fn unique() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{}.{n}{nanos:08x}", std::process::id())
}

/// The names in directory `name` under `dir` ("." for `dir` itself).
fn names(dir: &File, name: &str) -> Result<Vec<String>, Errno> {
    let mut d = nix::dir::Dir::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e?;
        if let Ok(n) = e.file_name().to_str() {
            if n != "." && n != ".." {
                out.push(n.to_string());
            }
        }
    }
    Ok(out)
}

fn read_at(dir: &File, name: &str) -> Result<Vec<u8>, Errno> {
    let fd = openat(dir, name, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())?;
    let mut bytes = Vec::new();
    File::from(fd)
        .read_to_end(&mut bytes)
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    Ok(bytes)
}

/// fsync of directory `name` under `dir`, at best: a write it would make durable is
/// already made and seen by every reader, and a failure here must not make its
/// writer believe it was not (and do it twice).
fn sync_dir(dir: &File, name: &str) {
    if let Ok(fd) = openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        let _ = File::from(fd).sync_all();
    }
}

/// Whether `name` under `dir` was last changed more than [`LEFTOVER`] ago.
fn stale(dir: &File, name: &str) -> bool {
    let Ok(st) = fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
        return false;
    };
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    now - st.st_mtime > LEFTOVER.as_secs() as i64
}

/// Removes directory `name` under `dir`, generations oldest first, at best (what is
/// left is removed as a leftover later).
fn remove_epoch(dir: &File, name: &str) {
    let Ok(files) = names(dir, name) else { return };
    let mut gens: Vec<(Option<u64>, String)> =
        files.into_iter().map(|f| (generation_of(&f), f)).collect();
    gens.sort();
    for (_, f) in gens {
        let _ = unlinkat(
            dir,
            format!("{name}/{f}").as_str(),
            UnlinkatFlags::NoRemoveDir,
        );
    }
    let _ = unlinkat(dir, name, UnlinkatFlags::RemoveDir);
}

impl Dirs {
    pub(super) fn new(path: PathBuf) -> Dirs {
        let mut dir = path.clone().into_os_string();
        dir.push(".d");
        Dirs {
            path,
            dir: dir.into(),
        }
    }

    /// `PATH.d`.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The epoch directories there are now, for a watch.
    pub(super) fn epochs(&self) -> Vec<PathBuf> {
        let Ok(d) = File::open(&self.dir) else {
            return Vec::new();
        };
        (names(&d, ".").unwrap_or_default().iter())
            .filter(|n| epoch_of(n).is_some())
            .map(|n| self.dir.join(n))
            .collect()
    }

    /// The latest generation. A sealed one is carried into the next epoch first; an
    /// older sup-lease's one-file store at `PATH`, when there is no `PATH.d`, is
    /// imported. Tries again until `deadline` when `PATH.d` changes under the read.
    pub(super) fn latest(&self, deadline: Boot) -> Result<Head, super::StoreError> {
        let t0 = Boot::now();
        let mut why = String::new();
        let mut attempt = 0;
        loop {
            if attempt > 0 && Boot::now() >= deadline {
                return Err(err(format!(
                    "{}: no generation could be read in {} ({why}); if it stays so, move {} away (mv) to start the store anew",
                    self.dir.display(),
                    crate::time::Human(Boot::now().since(t0)),
                    self.dir.display()
                )));
            }
            attempt += 1;
            let d = match File::open(&self.dir) {
                Ok(d) => d,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => match self.old_file()? {
                    Some(old) => {
                        self.create(&old)?;
                        // Imported (by this writer or another): not to be imported again
                        // when PATH.d is moved away.
                        let mut done = self.path.clone().into_os_string();
                        done.push(".imported");
                        let _ = std::fs::rename(&self.path, done);
                        why = "imported".into();
                        continue;
                    }
                    None => {
                        return Ok(Head {
                            dir: None,
                            epoch: 1,
                            generation: 0,
                            data: Data::default(),
                        })
                    }
                },
                Err(e) => return Err(io(self.dir.display(), e)),
            };
            match self.look(&d)? {
                Look::Found(epoch, _, data) if data.sealed => {
                    self.carry(&d, epoch, &data)?;
                    why = format!("e{epoch} sealed");
                }
                Look::Found(epoch, generation, data) => {
                    return Ok(Head {
                        dir: Some(d),
                        epoch,
                        generation,
                        data,
                    })
                }
                Look::Again(w) => why = w,
            }
        }
    }

    /// The latest generation in `PATH.d` (open as `d`): that of the highest epoch
    /// that has one (the one above may be empty: its maker was stopped between making
    /// it and linking its first generation).
    fn look(&self, d: &File) -> Result<Look, super::StoreError> {
        let listed = names(d, ".").map_err(|e| io(self.dir.display(), e))?;
        let mut epochs: Vec<u64> = listed.iter().filter_map(|n| epoch_of(n)).collect();
        epochs.sort_unstable_by(|a, b| b.cmp(a));
        for e in epochs {
            let gens = match names(d, &format!("e{e}")) {
                Ok(g) => g,
                Err(Errno::ENOENT) => return Ok(Look::Again(format!("e{e} retired meanwhile"))),
                Err(x) => return Err(io(self.dir.join(format!("e{e}")).display(), x)),
            };
            let Some(n) = gens.iter().filter_map(|g| generation_of(g)).max() else {
                continue;
            };
            let name = format!("e{e}/{n}");
            let bytes = match read_at(d, &name) {
                Ok(b) => b,
                Err(Errno::ENOENT) => return Ok(Look::Again(format!("e{e} retired meanwhile"))),
                Err(x) => return Err(io(self.dir.join(&name).display(), x)),
            };
            let data = serde_json::from_slice(&bytes).map_err(|x| {
                err(format!(
                    "{} is corrupt: {x}; move {} away (mv) to start the store anew",
                    self.dir.join(&name).display(),
                    self.dir.display()
                ))
            })?;
            return Ok(Look::Found(e, n, data));
        }
        Ok(Look::Again("no generation in any epoch".into()))
    }

    /// Makes generation 0 of the epoch after `epoch`, whose seal holds `sealed`
    /// (create-if-absent: anyone who read the seal may, and every copy is the same).
    fn carry(&self, d: &File, epoch: u64, sealed: &Data) -> Result<(), super::StoreError> {
        let mut data = sealed.clone();
        data.sealed = false;
        let next = format!("e{}", epoch + 1);
        match mkdirat(d, next.as_str(), Mode::from_bits_truncate(0o777)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(Errno::ENOENT) => return Ok(()),
            Err(e) => return Err(io(self.dir.join(&next).display(), e)),
        }
        if self.link(d, &format!("{next}/0"), &data)? {
            sync_dir(d, &next);
            sync_dir(d, ".");
        }
        Ok(())
    }

    /// Writes `data` as the generation after `head`'s: `false` when another writer
    /// wrote first (or `head`'s epoch was retired meanwhile), and the caller is to
    /// read the latest again and redo its change on it.
    pub(super) fn commit(&self, head: &Head, data: &Data) -> Result<bool, super::StoreError> {
        let Some(d) = &head.dir else {
            return self.create(data);
        };
        let mut data = data.clone();
        data.sealed = false;
        let epoch = format!("e{}", head.epoch);
        let n = head.generation + 1;
        if !self.link(d, &format!("{epoch}/{n}"), &data)? {
            return Ok(false);
        }
        sync_dir(d, &epoch);
        if n >= ROTATE {
            self.rotate(d, head.epoch, n, data);
        }
        Ok(true)
    }

    /// Links `data` at `slot` under `PATH.d` (open as `d`) through a temp file:
    /// `false` when the slot is taken or its epoch gone.
    fn link(&self, d: &File, slot: &str, data: &Data) -> Result<bool, super::StoreError> {
        let bytes = serde_json::to_vec(data).map_err(err)?;
        let (tmp, mut file) = loop {
            let tmp = format!("tmp.{}", unique());
            match openat(
                d,
                tmp.as_str(),
                OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o666),
            ) {
                Ok(fd) => break (tmp, File::from(fd)),
                Err(Errno::EEXIST) => continue,
                // PATH.d was removed (not moved) under the writer.
                Err(Errno::ENOENT) => return Ok(false),
                Err(e) => return Err(io(self.dir.join(&tmp).display(), e)),
            }
        };
        let written = file.write_all(&bytes).and_then(|()| file.sync_all());
        drop(file);
        let linked = match written {
            Ok(()) => linkat(d, tmp.as_str(), d, slot, AtFlags::empty()),
            Err(e) => {
                let _ = unlinkat(d, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
                return Err(io(self.dir.join(&tmp).display(), e));
            }
        };
        let _ = unlinkat(d, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
        match linked {
            Ok(()) => Ok(true),
            Err(Errno::EEXIST) | Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(io(self.dir.join(slot).display(), e)),
        }
    }

    /// After generation `n` (at least [`ROTATE`]) of `epoch`: seals the epoch (unless
    /// another writer wrote after `n`: it seals), carries the seal into the next
    /// epoch, retires the epochs before this one and removes old leftovers. At best:
    /// whoever reads the seal next carries it, and the next rotation retires.
    fn rotate(&self, d: &File, epoch: u64, n: u64, mut data: Data) {
        data.sealed = true;
        let _ = self.link(d, &format!("e{epoch}/{}", n + 1), &data);
        let _ = self.latest(Boot::now().plus(Duration::from_millis(100)));
        for e in (names(d, ".").unwrap_or_default().iter()).filter_map(|n| epoch_of(n)) {
            if e < epoch {
                let old = format!("old.{e}.{}", unique());
                if renameat(d, format!("e{e}").as_str(), d, old.as_str()).is_ok() {
                    remove_epoch(d, &old);
                }
            }
        }
        sync_dir(d, ".");
        for name in names(d, ".").unwrap_or_default() {
            if name.starts_with("tmp.") && stale(d, &name) {
                let _ = unlinkat(d, name.as_str(), UnlinkatFlags::NoRemoveDir);
            } else if name.starts_with("old.") && stale(d, &name) {
                remove_epoch(d, &name);
            }
        }
        // A store that was being made by a writer killed meanwhile.
        let (parent, prefix) = self.new_prefix();
        if let Ok(p) = File::open(&parent) {
            for name in names(&p, ".").unwrap_or_default() {
                if name.starts_with(&prefix) && stale(&p, &name) {
                    let _ = std::fs::remove_dir_all(parent.join(name));
                }
            }
        }
    }

    /// The directory a new store is made in, and the start of its name.
    fn new_prefix(&self) -> (PathBuf, String) {
        let parent = match self.dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = self.dir.file_name().unwrap_or_default().to_string_lossy();
        (parent, format!("{name}.new."))
    }

    /// Makes the store with `data` as `e1/0`: a directory that holds it, renamed onto
    /// `PATH.d`; `false` when `PATH.d` exists (another writer made it first).
    fn create(&self, data: &Data) -> Result<bool, super::StoreError> {
        let (parent, prefix) = self.new_prefix();
        let new = parent.join(format!("{prefix}{}", unique()));
        let made = (|| -> std::io::Result<()> {
            std::fs::create_dir(&new)?;
            std::fs::create_dir(new.join("e1"))?;
            let mut data = data.clone();
            data.sealed = false;
            let bytes = serde_json::to_vec(&data)?;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o666)
                .open(new.join("e1/0"))?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            File::open(new.join("e1"))?.sync_all()?;
            File::open(&new)?.sync_all()
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(&new);
            return Err(io(new.display(), e));
        }
        match std::fs::rename(&new, &self.dir) {
            Ok(()) => {
                let _ = File::open(&parent).and_then(|p| p.sync_all());
                Ok(true)
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&new);
                match e.raw_os_error() {
                    Some(libc::EEXIST) | Some(libc::ENOTEMPTY) => Ok(false),
                    _ => Err(io(
                        format!("rename {} to {}", new.display(), self.dir.display()),
                        e,
                    )),
                }
            }
        }
    }

    /// The data of an older sup-lease's one-file store at `PATH`, if there is one.
    fn old_file(&self) -> Result<Option<Data>, super::StoreError> {
        match std::fs::read(&self.path) {
            Ok(b) if b.is_empty() => Ok(None),
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                err(format!(
                    "{} (the store of an older sup-lease, to import into {}) is corrupt: {e}; move it away to start the store anew",
                    self.path.display(),
                    self.dir.display()
                ))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(self.path.display(), e)),
        }
    }
}
