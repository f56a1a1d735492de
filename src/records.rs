//! What supd writes down in `state_dir`: the processes it started (so a new supd can end
//! what a killed one left) and the services an operator stopped (so they stay down).
//!
//! Files are replaced atomically: temp file, rename, and for what must survive a power
//! cut, fsync of the file and of the directory. The pid records are not fsynced on
//! purpose: after a power cut no process survives, so there is nothing to find; they are
//! one fixed-size record per service, rewritten in place by a single `pwrite`, because
//! they change on every restart and a temp file and rename would double its cost. They
//! are opened for each write and closed: supd holds no fd per service.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// `kill_mode` (config): what a stop, a restart, a crash and a new supd end of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum KillMode {
    /// Every process of the run: its cgroup (without cgroups, its process group and
    /// session).
    #[default]
    Cgroup,
    /// Its process group alone.
    Group,
    /// The main process alone: what it started is left running (sshd's sessions).
    Main,
}

/// A process supd started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PidRecord {
    pub service: String,
    /// The pid, which is also the process group (each service leads its own group).
    pub pid: i32,
    /// Start time from /proc (clock ticks since boot): guards against pid reuse.
    pub start_time: u64,
    /// The `kill_mode` the run started under (a third word; none in a record of an
    /// older supd, or a check's): a later supd ends what it left as that says.
    pub mode: Option<KillMode>,
}

/// The directory of pid records: one small file per service.
const PIDS: &str = "pids";
/// The directory of the records of health check commands: one small file per service,
/// naming the process group of its check under way (a check's leader dies with supd,
/// but what it started would stay behind unrecorded).
const CHECKS: &str = "checks";
const DOWN: &str = "down.json";
/// Every record has this size, so a rewrite is one `pwrite` at offset 0: a killed supd
/// leaves either the old record or the new one, never half of each.
const RECORD_LEN: usize = 48;

/// One service's pid record file. It is not kept open: supd would hold an fd per
/// service, and every child it forks would close them all one by one before its exec
/// (10,000 services made each spawn cost milliseconds). Each write opens the path,
/// rewrites the record with one `pwrite` and closes it; the identity (device and inode)
/// of the file last written is remembered, so that a file, or a state directory,
/// removed or replaced since is noticed (`is_current`) as it was with the file open.
pub struct PidFile {
    path: std::path::PathBuf,
    /// Device and inode of the file as last opened.
    id: std::cell::Cell<(u64, u64)>,
}

impl PidFile {
    /// Opens (creating) the record of `service`.
    pub fn open(state_dir: &Path, service: &str) -> io::Result<PidFile> {
        PidFile::open_in(state_dir, PIDS, service)
    }

    /// Opens (creating) the record of the health check command of `service`.
    pub fn open_check(state_dir: &Path, service: &str) -> io::Result<PidFile> {
        PidFile::open_in(state_dir, CHECKS, service)
    }

    fn open_in(state_dir: &Path, sub: &str, service: &str) -> io::Result<PidFile> {
        let dir = state_dir.join(sub);
        create_dirs(&dir, PRIVATE_DIR)?;
        let f = PidFile {
            path: dir.join(service),
            id: std::cell::Cell::new((0, 0)),
        };
        f.file(true)?;
        Ok(f)
    }

    /// Opens (creating it if `create`) the file at its path, close-on-exec, and
    /// remembers which file it is.
    fn file(&self, create: bool) -> io::Result<File> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let file = fs::OpenOptions::new()
            .write(true)
            .create(create)
            .truncate(false)
            .mode(PRIVATE_FILE)
            .open(&self.path)?;
        let meta = file.metadata()?;
        self.id.set((meta.dev(), meta.ino()));
        Ok(file)
    }

    /// Whether the file last written is still the one at its path: false once the
    /// file, or the state directory, was removed or replaced (the record would be
    /// missing, or another's, where a later supd looks).
    pub fn is_current(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id.get())
    }

    /// Records the process now running (or none): one `pwrite` of the whole record at
    /// offset 0, in the file at its path. A record is made again if its file was
    /// removed (not its directory: `is_current` tells the caller to open it anew); none
    /// is cleared by doing nothing where there is no file.
    pub fn set(&self, pid: Option<(i32, u64)>) -> io::Result<()> {
        let text = match pid {
            Some((pid, start)) => format!("{pid} {start}"),
            None => String::new(),
        };
        self.write(pid.is_some(), &text)
    }

    /// Records a service's run: its pid and start time, and the `kill_mode` it started
    /// under.
    pub fn set_run(&self, pid: i32, start: u64, mode: KillMode) -> io::Result<()> {
        self.write(true, &format!("{pid} {start} {}", mode_word(mode)))
    }

    fn write(&self, some: bool, text: &str) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut rec = [b' '; RECORD_LEN];
        rec[..text.len().min(RECORD_LEN - 1)]
            .copy_from_slice(&text.as_bytes()[..text.len().min(RECORD_LEN - 1)]);
        rec[RECORD_LEN - 1] = b'\n';
        match self.file(some) {
            Ok(f) => f.write_all_at(&rec, 0),
            Err(e) if !some && e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Makes `dir` and any missing parent; each directory made gets `mode` exactly (the
/// umask aside), and one that exists is left as it is: its mode is its owner's choice.
pub fn create_dirs(dir: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dirs(parent, mode)?;
    }
    match fs::create_dir(dir) {
        Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(mode)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes the record of a service that is gone from the config.
pub fn remove_pid_file(state_dir: &Path, service: &str) {
    for sub in [PIDS, CHECKS] {
        let _ = fs::remove_file(state_dir.join(sub).join(service));
    }
}

/// Reads the records a previous supd left: every service's file that names a process,
/// of its runs and of its health checks (each `service` is the service's name).
/// Unreadable or malformed files are skipped (and said).
pub fn read_pids(state_dir: &Path) -> Vec<PidRecord> {
    let mut out: Vec<PidRecord> = [PIDS, CHECKS]
        .into_iter()
        .flat_map(|sub| read_dir_pids(&state_dir.join(sub)))
        .collect();
    out.sort_by_key(|r| r.pid);
    out
}

fn read_dir_pids(dir: &Path) -> Vec<PidRecord> {
    let Ok(dir) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in dir.filter_map(|e| e.ok()) {
        let service = entry.file_name().to_string_lossy().into_owned();
        let Ok(text) = fs::read_to_string(entry.path()) else {
            continue;
        };
        let mut words = text.split_whitespace();
        match (
            words.next().map(str::parse::<i32>),
            words.next().map(str::parse::<u64>),
        ) {
            (None, _) => {}
            (Some(Ok(pid)), Some(Ok(start_time))) => out.push(PidRecord {
                service,
                pid,
                start_time,
                mode: words.next().and_then(word_mode),
            }),
            _ => log::warn!("{} is corrupt; ignoring it", entry.path().display()),
        }
    }
    out
}

fn mode_word(mode: KillMode) -> &'static str {
    match mode {
        KillMode::Cgroup => "cgroup",
        KillMode::Group => "group",
        KillMode::Main => "main",
    }
}

fn word_mode(word: &str) -> Option<KillMode> {
    [KillMode::Cgroup, KillMode::Group, KillMode::Main]
        .into_iter()
        .find(|m| mode_word(*m) == word)
}

/// Forgets every record (after their processes were ended).
pub fn clear_pids(state_dir: &Path) {
    for sub in [PIDS, CHECKS] {
        for r in read_dir_pids(&state_dir.join(sub)) {
            if let Ok(f) = PidFile::open_in(state_dir, sub, &r.service) {
                let _ = f.set(None);
            }
        }
    }
}

/// The mode of what supd keeps in `state_dir`: readable by root and the `sup` group
/// only. The state directory lets others through (mode 0751) to reach `tools_dir`
/// inside it, so what it holds is kept private by the files' own modes.
pub const PRIVATE_FILE: u32 = 0o640;
/// The mode of the private directories supd makes in `state_dir` (`pids`).
pub const PRIVATE_DIR: u32 = 0o750;
/// The mode of `state_dir` when supd makes it: others may pass through, not look in.
pub const STATE_DIR: u32 = 0o751;

/// Replaces `path` with `bytes` atomically, as a private file (`PRIVATE_FILE`);
/// `durable` adds the fsyncs.
pub fn atomic_write(path: &Path, bytes: &[u8], durable: bool) -> io::Result<()> {
    atomic_write_mode(path, bytes, durable, PRIVATE_FILE)
}

/// `atomic_write` with the new file's mode (less the umask).
pub fn atomic_write_mode(path: &Path, bytes: &[u8], durable: bool, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("state");
    let tmp = dir.join(format!(".{name}.tmp"));
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(bytes)?;
    if durable {
        f.sync_all()?;
    }
    drop(f);
    fs::rename(&tmp, path)?;
    if durable {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Writes the set of services an operator stopped (durably).
pub fn write_down(state_dir: &Path, down: &BTreeSet<String>) -> io::Result<()> {
    let bytes = serde_json::to_vec(down).map_err(io::Error::other)?;
    atomic_write(&state_dir.join(DOWN), &bytes, true)
}

/// Reads the set of services an operator stopped.
pub fn read_down(state_dir: &Path) -> BTreeSet<String> {
    read_json(&state_dir.join(DOWN)).unwrap_or_default()
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            log::warn!("cannot read {}: {e}", path.display());
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(v) => Some(v),
        Err(e) => {
            log::warn!("{} is corrupt ({e}); ignoring it", path.display());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_survives_corruption() {
        let dir = crate::scratch::Scratch::new("records");
        assert!(read_pids(&dir).is_empty());
        let a = PidFile::open(&dir, "a").expect("open");
        a.set(Some((42, 7))).expect("set");
        PidFile::open(&dir, "b")
            .expect("open")
            .set(Some((1234567, 99999999)))
            .expect("set");
        a.set(Some((43, 8))).expect("set");
        PidFile::open(&dir, "c")
            .expect("open")
            .set_run(9, 10, KillMode::Main)
            .expect("set");
        assert_eq!(read_pids(&dir)[0].mode, Some(KillMode::Main));
        let _ = std::fs::remove_file(dir.join("pids").join("c"));
        assert_eq!(
            read_pids(&dir),
            vec![
                PidRecord {
                    service: "a".into(),
                    pid: 43,
                    start_time: 8,
                    mode: None
                },
                PidRecord {
                    service: "b".into(),
                    pid: 1234567,
                    start_time: 99999999,
                    mode: None
                }
            ]
        );
        assert_eq!(
            fs::metadata(dir.join("pids/a")).expect("meta").len(),
            RECORD_LEN as u64
        );
        a.set(None).expect("clear");
        assert_eq!(read_pids(&dir).len(), 1);
        fs::write(dir.join("pids/c"), b"12 x").expect("write");
        assert_eq!(read_pids(&dir).len(), 1, "a corrupt record is skipped");
        clear_pids(&dir);
        assert!(read_pids(&dir).is_empty());
        // A removed record is noticed, made again where it is looked for, and clearing
        // one whose directory is gone is no error.
        let b = PidFile::open(&dir, "b").expect("open");
        assert!(b.is_current());
        fs::remove_file(dir.join("pids/b")).expect("rm");
        assert!(!b.is_current(), "a removed record is noticed");
        b.set(Some((5, 6))).expect("set");
        assert!(b.is_current());
        fs::rename(dir.join("pids/a"), dir.join("pids/b")).expect("replace");
        assert!(!b.is_current(), "a replaced record is noticed");
        fs::remove_dir_all(dir.join("pids")).expect("rm");
        b.set(None).expect("nothing to clear");
        assert!(
            b.set(Some((5, 6))).is_err(),
            "its directory is not made behind its back"
        );
        let down: BTreeSet<String> = ["x".to_string()].into();
        write_down(&dir, &down).expect("write");
        assert_eq!(read_down(&dir), down);
        fs::write(dir.join(DOWN), b"{truncated").expect("write");
        assert!(read_down(&dir).is_empty());
    }
}
