//! Watching `[supd] metrics_file` (issue 28) from outside: its text waited for, each
//! write told apart, and an idle supd checked not to wake for it.
#![allow(dead_code)]

use super::{voluntary_switches, Sandbox};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// Waits (within `limit`) until the file at `path` holds `needle` (inotify on its
/// directory: a write renames a file into place); its text.
pub fn wait_text(path: &Path, needle: &str, limit: Duration) -> String {
    super::files::wait_file_within(path, limit, |t| t.contains(needle))
}

/// Each write of the file, as (inode, mtime): a write renames a new file into place
/// (whose inode may be the one freed by the write before).
pub fn stamp(path: &Path) -> Option<(u64, SystemTime)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.modified().ok()?))
}

/// Idle from now on (nothing changes), supd neither rewrites `file` nor wakes once
/// until 11 s past its last write `last` (when a deadline armed without a change would
/// have come).
pub fn assert_idle_past(sb: &Sandbox, file: &Path, last: (u64, SystemTime)) {
    let pid = sb.supd_pid();
    // Counted from when supd is back in its wait (the turn that wrote the file may still
    // be syncing its directory when the test sees the rename).
    super::wait_in_poll(pid);
    let before = voluntary_switches(pid);
    // Every change in the file's directory is looked at; none may be a write of it.
    let ino = super::files::watch_dir_of(file);
    let idle_until = last.1 + Duration::from_secs(11);
    while let Ok(left) = idle_until.duration_since(SystemTime::now()) {
        super::files::next_events(&ino, left);
        assert_eq!(stamp(file), Some(last), "rewritten idle");
    }
    let woke = voluntary_switches(pid) - before;
    assert_eq!(
        woke,
        0,
        "supd woke {woke} times while idle\n{}",
        sb.supd_log()
    );
}
