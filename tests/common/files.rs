//! Waiting on files written by another process (supd's log writer), by inotify with a
//! deadline: no sleeps, no polling loops.

use super::DEADLINE;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Instant;

/// Waits until the text of `path` satisfies `pred` (the file may not exist yet); returns
/// it. Panics with what it last read after [`DEADLINE`].
pub fn wait_file(path: &Path, pred: impl Fn(&str) -> bool) -> String {
    wait_file_within(path, DEADLINE, pred)
}

/// The same, within `limit`.
pub fn wait_file_within(
    path: &Path,
    limit: std::time::Duration,
    pred: impl Fn(&str) -> bool,
) -> String {
    let ino = watch_dir_of(path);
    let end = Instant::now() + limit;
    loop {
        // Read after the watch is set: nothing written in between is missed.
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if pred(&text) {
            return text;
        }
        let left = end.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "{} did not come as expected within {limit:?}; it holds:\n{text}",
            path.display()
        );
        next_events(&ino, left);
    }
}

/// Waits until a file whose name starts with `prefix` is in `dir`; returns its name.
pub fn wait_file_named(dir: &Path, prefix: &str) -> String {
    let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).expect("inotify");
    ino.add_watch(dir, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
        .expect("watch the directory");
    let end = Instant::now() + DEADLINE;
    loop {
        let found = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .find(|n| n.starts_with(prefix));
        if let Some(n) = found {
            return n;
        }
        let left = end.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no {prefix}* in {} within {DEADLINE:?}",
            dir.display()
        );
        next_events(&ino, left);
    }
}

/// Waits up to `left` for `ino` to have events, and reads them (they only wake the
/// caller, which looks at the files themselves).
/// An inotify watch on the directory of `path` (made if need be) for every way a file
/// comes or changes there: created, written, renamed in or away, removed.
pub fn watch_dir_of(path: &Path) -> Inotify {
    let dir = path.parent().expect("a file in a directory");
    std::fs::create_dir_all(dir).expect("the file's directory");
    let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).expect("inotify");
    ino.add_watch(
        dir,
        AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_CLOSE_WRITE,
    )
    .expect("watch the directory");
    ino
}

/// Waits until `path` is gone (removed or renamed away), within the deadline.
pub fn wait_gone(path: &Path) {
    let ino = watch_dir_of(path);
    let end = Instant::now() + DEADLINE;
    while path.exists() {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{} is still there", path.display());
        next_events(&ino, left);
    }
}

/// Waits for the next events of `ino` (at most `left`), and reads them all.
pub fn next_events(ino: &Inotify, left: std::time::Duration) {
    let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
    let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
    let _ = poll(&mut fds, PollTimeout::from(ms));
    while let Ok(events) = ino.read_events() {
        if events.is_empty() {
            break;
        }
    }
}

/// Sets a path's mode bits.
pub fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A path's mode bits (setuid, setgid and sticky included), the link itself for a link.
pub fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .mode()
        & 0o7777
}

/// The hidden entries (`.`-prefixed: an install's staging, a version being deleted) of a
/// tool's directory.
pub fn hidden_in(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with('.'))
        .collect()
}

/// Waits, within the deadline, until `dir` holds no hidden entry, woken by inotify when
/// an entry goes; whether it came to that.
pub fn wait_no_hidden_in(dir: &Path) -> bool {
    let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).expect("inotify");
    ino.add_watch(
        dir,
        AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM | AddWatchFlags::IN_CREATE,
    )
    .expect("watch the directory");
    let end = Instant::now() + DEADLINE;
    loop {
        // Looked at after the watch is set: nothing removed in between is missed.
        if hidden_in(dir).is_empty() {
            return true;
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        next_events(&ino, left);
    }
}
