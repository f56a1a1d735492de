//! Noticing that the state directory was removed or replaced while supd runs: its pid
//! records and its lock would otherwise live on in unlinked files, where no later supd
//! looks (a crash then gives two instances, and the lock no longer keeps a second supd
//! out). An inotify watch on the directory wakes the loop; the supervisor then makes the
//! directory anew, takes its lock again and rewrites what it holds.

use crate::records;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use std::fs;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The name of the lock file in the state directory.
pub const LOCK: &str = "supd.lock";

/// A watch on the state directory.
pub struct StateWatch {
    inotify: Inotify,
    dir: PathBuf,
}

/// The events that may mean the directory, or a file supd keeps open in it, is gone.
fn flags() -> AddWatchFlags {
    AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_ONLYDIR
}

impl StateWatch {
    /// Watches `dir`.
    pub fn new(dir: &Path) -> nix::Result<StateWatch> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        inotify.add_watch(dir, flags())?;
        Ok(StateWatch {
            inotify,
            dir: dir.to_path_buf(),
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inotify.as_fd()
    }

    /// Reads what is there (the events only wake the loop: what counts is checked on the
    /// files themselves).
    pub fn drain(&self) {
        while matches!(self.inotify.read_events(), Ok(events) if !events.is_empty()) {}
    }

    /// Watches the directory again (after it was made anew: the old watch went with the
    /// old directory). A watch already there is kept.
    pub fn rewatch(&self) {
        if let Err(e) = self.inotify.add_watch(&self.dir, flags()) {
            log::warn!("cannot watch {}: {e}", self.dir.display());
        }
    }
}

/// Whether `file`, held open, is still the file at `path`.
pub fn same_file(file: &fs::File, path: &Path) -> bool {
    match (fs::metadata(path), file.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Takes the lock, waiting up to `patience` while it is held: at start, a predecessor
/// killed a moment ago may still have a child between fork and its first instruction
/// holding it (the child closes it at once; see `sys::set_lock_fd`). A live supd holds it
/// for good, and is refused after that. The loop passes no patience: nothing waits.
fn lock_briefly(
    mut file: std::fs::File,
    patience: std::time::Duration,
) -> Result<nix::fcntl::Flock<std::fs::File>, (std::fs::File, nix::errno::Errno)> {
    let deadline = std::time::Instant::now() + patience;
    loop {
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if std::time::Instant::now() < deadline => {
                file = f;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// Takes from others what an older supd left readable in `state_dir` (it was made when
/// the directory itself kept everyone out; now others pass through it to reach
/// `tools_dir`): the `pids` directory and its records, the files supd keeps at its top,
/// the tool records (where they are, and where older supds kept them). Only these, by name: `state_dir` may be shared with other files.
pub fn make_private(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let private = |p: &Path| {
        if let Ok(m) = fs::symlink_metadata(p) {
            if m.mode() & 0o007 != 0 && (m.is_dir() || m.is_file()) {
                let mode = m.mode() & 0o7770;
                if let Err(e) = fs::set_permissions(p, fs::Permissions::from_mode(mode)) {
                    log::warn!("cannot make {} private: {e}", p.display());
                }
            }
        }
    };
    let listed = |d: &Path, ext: Option<&str>| -> Vec<PathBuf> {
        fs::read_dir(d)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.path())
                    .filter(|p| p.is_file())
                    .filter(|p| ext.is_none() || p.extension().and_then(|x| x.to_str()) == ext)
                    .collect()
            })
            .unwrap_or_default()
    };
    let top = [LOCK, "down.json", "cgroup", "handoff.json"].map(|n| dir.join(n));
    let pids = dir.join("pids");
    for p in top
        .into_iter()
        .chain([pids.clone()])
        .chain(listed(&pids, None))
        .chain(listed(&dir.join("tools"), Some("json")))
        .chain([crate::versions::records_dir(dir)])
        .chain(listed(&crate::versions::records_dir(dir), Some("json")))
    {
        private(&p);
    }
}

/// Why the state lock was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockError {
    /// Another supd holds it.
    Held(String),
    /// It cannot be opened or locked at all (the file, the errno, what to do).
    Cannot(String),
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Held(m) | LockError::Cannot(m) => f.write_str(m),
        }
    }
}

/// What supd says after a lock it cannot take: it never runs without it.
const WITHOUT: &str =
    "supd does not run without its state lock, which keeps a second supd off this state_dir";

/// "Permission denied" for an errno-carrying error, its text otherwise.
fn desc(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => nix::errno::Errno::from_raw(n).desc().to_string(),
        None => e.to_string(),
    }
}

/// What to do about a lock file that cannot be opened for this errno.
fn advice(dir: &Path, errno: Option<nix::errno::Errno>) -> String {
    use nix::errno::Errno;
    let dir = dir.display();
    match errno {
        Some(Errno::EACCES | Errno::EPERM) => format!(
            "supd's user (uid {}) may not write it: run supd as root, or set state_dir to a directory of its own",
            nix::unistd::geteuid()
        ),
        Some(Errno::EROFS) => format!(
            "{dir} is on a read-only file system, where supd can keep neither its lock nor a record (no service could start): remount it read-write, or set state_dir to a writable directory"
        ),
        Some(Errno::EISDIR | Errno::ENXIO | Errno::ELOOP) => {
            "something other than a file stands there: remove it (supd makes the file anew)".into()
        }
        Some(Errno::ENOSPC | Errno::EDQUOT) => format!("{dir} is full: make room"),
        Some(Errno::ENOENT | Errno::ENOTDIR) => {
            format!("{dir} cannot be made: make it, or set state_dir to a directory that can be")
        }
        _ => format!("make {dir} a writable local directory"),
    }
}

/// Opens (or makes) the lock file, which must be a regular file: never blocks (a FIFO
/// there would, opened for writing with no reader).
fn open_lock(dir: &Path, path: &Path) -> Result<fs::File, LockError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
    let cannot = |what: String, errno: Option<nix::errno::Errno>| {
        LockError::Cannot(format!(
            "cannot open {} ({what}): {}; {WITHOUT}",
            path.display(),
            advice(dir, errno)
        ))
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY)
        .open(path)
        .map_err(|e| {
            let errno = e.raw_os_error().map(nix::errno::Errno::from_raw);
            match errno {
                // What a FIFO with no reader (or a device with nothing behind it) gives.
                Some(nix::errno::Errno::ENXIO) => {
                    cannot(format!("not a regular file: {}", desc(&e)), errno)
                }
                _ => cannot(desc(&e), errno),
            }
        })?;
    let meta = file
        .metadata()
        .map_err(|e| cannot(desc(&e), e.raw_os_error().map(nix::errno::Errno::from_raw)))?;
    if !meta.is_file() {
        let t = meta.file_type();
        let kind = match () {
            _ if t.is_fifo() => "a FIFO",
            _ if t.is_socket() => "a socket",
            _ if t.is_char_device() || t.is_block_device() => "a device",
            _ => "not a regular file",
        };
        return Err(cannot(kind.into(), Some(nix::errno::Errno::EISDIR)));
    }
    // Only root may open it (others pass through state_dir): nobody else can take it
    // and keep supd out. One made by an older supd is made private too.
    let _ = file.set_permissions(std::fs::Permissions::from_mode(0o600));
    Ok(file)
}

/// The lock supd holds on the state directory itself, besides `supd.lock`: a lock
/// file can be removed (by hand, by a cleaner of old files) and made anew, and a second
/// supd would then lock the new file while the first runs on the old one; the directory
/// stays while it is in use. Taken after the file's lock and held beside it; closed
/// in every child (`sys::set_dir_lock_fd`); released by `exec` (its fd is close-on-exec)
/// and taken again by the new image at once, while the file's lock, carried across,
/// keeps others out. A global: it belongs to the process, as the flock does.
static DIR_LOCK: std::sync::Mutex<Option<nix::fcntl::Flock<fs::File>>> =
    std::sync::Mutex::new(None);

/// Takes the lock of the directory `dir` itself (see [`DIR_LOCK`]); a lock held
/// already on that very directory is kept. `Err(true)`: another process holds it.
pub fn lock_dir(dir: &Path) -> Result<(), (bool, String)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut held = DIR_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if held.as_ref().is_some_and(|l| same_file(l, dir)) {
        return Ok(());
    }
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY)
        .open(dir)
        .map_err(|e| {
            (
                false,
                format!("cannot open {}: {}", dir.display(), desc(&e)),
            )
        })?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(l) => {
            crate::sys::set_dir_lock_fd(std::os::fd::AsRawFd::as_raw_fd(&*l));
            *held = Some(l);
            Ok(())
        }
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err((
            true,
            format!(
                "another supd holds {} (its lock file was removed or replaced while it ran); stop it first, or give this one another state_dir",
                dir.display()
            ),
        )),
        Err((_, e)) => Err((false, format!("cannot lock {}: {}", dir.display(), e.desc()))),
    }
}

/// One supd per state directory: its lock, waiting up to `patience` while another
/// holds it. Never runs without it: a lock file that cannot be opened or locked is an
/// error as much as one held by another supd.
pub fn lock(
    dir: &std::path::Path,
    patience: std::time::Duration,
) -> Result<nix::fcntl::Flock<std::fs::File>, LockError> {
    let path = dir.join(LOCK);
    let file = open_lock(dir, &path)?;
    match lock_briefly(file, patience) {
        // The directory's own lock too: a file lock alone is defeated by removing it.
        // (A file system that locks no directory keeps the file's lock alone.)
        Ok(l) => match lock_dir(dir) {
            Ok(()) => Ok(l),
            Err((true, m)) => Err(LockError::Held(m)),
            Err((false, m)) => {
                log::warn!("{m}; the lock file alone keeps a second supd off it");
                Ok(l)
            }
        },
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(LockError::Held(format!(
            "another supd is using {}; stop it first, or give this one another state_dir",
            dir.display()
        ))),
        Err((_, e)) => Err(LockError::Cannot(format!(
            "cannot lock {} ({}): the file system of {} does not lock files; set state_dir to a local directory; {WITHOUT}",
            path.display(),
            e.desc(),
            dir.display()
        ))),
    }
}

/// The lock at a first start: waits up to a second for a predecessor killed a moment
/// ago, and otherwise refuses with the reason. Except as the system's init (`init`),
/// whose exit would end the system: it says why, runs nothing, reaps what it is given,
/// and tries again every second until it holds the lock (and once a minute says so).
pub fn lock_at_start(dir: &Path, init: bool) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    let mut said: Option<std::time::Instant> = None;
    loop {
        let err = match lock(dir, std::time::Duration::from_secs(1)) {
            Ok(l) => {
                if said.is_some() {
                    log::warn!("{}: locked at last; starting", dir.display());
                }
                return Ok(l);
            }
            Err(e) if !init => return Err(e.to_string()),
            Err(e) => e,
        };
        if said.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(60)) {
            log::error!(
                "{err}; as the system's init supd does not exit: it runs nothing and tries again every second"
            );
            said = Some(std::time::Instant::now());
        }
        while matches!(
            nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG)),
            Ok(s) if s != nix::sys::wait::WaitStatus::StillAlive
        ) {}
        std::thread::sleep(std::time::Duration::from_secs(1));
        if let Err(e) = records::create_dirs(dir, records::STATE_DIR) {
            log::debug!("cannot create {}: {e}", dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn what_an_older_supd_left_readable_is_made_private_and_nothing_else() {
        let dir = crate::scratch::Scratch::new("statedir");
        fs::create_dir_all(dir.join("pids")).expect("mkdir");
        fs::create_dir_all(dir.join("tools/agent")).expect("mkdir");
        let paths = [
            "supd.lock",
            "down.json",
            "pids/web",
            "tools/agent.json",
            "other.txt",
        ];
        for p in paths {
            fs::write(dir.join(p), "x").expect("write");
        }
        for p in paths.iter().chain(&["pids", "tools", "tools/agent"]) {
            fs::set_permissions(dir.join(p), fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        make_private(&dir);
        let mode = |p: &str| fs::metadata(dir.join(p)).expect(p).permissions().mode() & 0o777;
        for p in [
            "supd.lock",
            "down.json",
            "pids/web",
            "tools/agent.json",
            "pids",
        ] {
            assert_eq!(mode(p), 0o750, "{p}");
        }
        for p in ["other.txt", "tools", "tools/agent"] {
            assert_eq!(mode(p), 0o755, "{p} is not supd's to close");
        }
    }
}
