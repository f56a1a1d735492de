//! Watching `[supd] metrics_file` (issue 28) from outside: its text waited for, each
//! write told apart, and an idle supd checked not to wake for it.
#![allow(dead_code)]

use super::Sandbox;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

/// Waits (within `limit`) until the file at `path` holds `needle`; its text. No event
/// tells that a file was renamed into place: looked at every 20 ms.
pub fn wait_text(sb: &Sandbox, path: &Path, needle: &str, limit: Duration) -> String {
    let end = Instant::now() + limit;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < end,
            "{} never held {needle:?}; it holds:\n{text}\n{}",
            path.display(),
            sb.supd_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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
    std::thread::sleep(Duration::from_millis(500));
    let before = switches(pid);
    let idle_until = last.1 + Duration::from_secs(11);
    while SystemTime::now() < idle_until {
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(stamp(file), Some(last), "rewritten idle");
    }
    let woke = switches(pid) - before;
    assert_eq!(
        woke,
        0,
        "supd woke {woke} times while idle\n{}",
        sb.supd_log()
    );
}

/// supd's voluntary context switches so far: each is a wait begun, so each is a
/// wake-up (preemptions, which load adds, are not supd's own).
fn switches(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches")
}
