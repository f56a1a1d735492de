//! For the tests of cgroup limits (issue 28): whether a test can run here, the cgroup a
//! process is in for a controller (read from /proc/PID/cgroup and the mounts, as the
//! kernel has it, not as supd says), and a service's status waited for.
#![allow(dead_code)]

use super::{is_root, Sandbox, DEADLINE};
use serde_json::Value;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use sup::cgroup::limits::{have_for_check, Controller, Place};

/// Whether the test cannot run here (said why): not root, or no hierarchy has `c`.
pub fn skip(c: Controller) -> bool {
    if !is_root() {
        eprintln!("skipped: cgroup limits need root");
        return true;
    }
    if have_for_check(true).place(c).is_none() {
        eprintln!(
            "skipped: no cgroup hierarchy here has the {} controller",
            c.v2()
        );
        return true;
    }
    false
}

/// Whether the memory controller is a cgroup v1 hierarchy's here (a hybrid host).
pub fn memory_in_v1() -> bool {
    matches!(
        have_for_check(true).place(Controller::Memory),
        Some(Place::V1(_))
    )
}

/// The cgroup of `pid` in the v1 hierarchy `h` (`memory`, `pids`, ...) as a directory,
/// if it is one of supd's (`.../sup-<id>/<service>.service`).
pub fn v1_cgroup(pid: i32, h: &str) -> Option<PathBuf> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = v1_path(&text, h, |p| p.contains("/sup-"))?;
    Some(PathBuf::from(mount("cgroup", h)?).join(path.trim_start_matches('/')))
}

/// The cgroup of `pid` for the controller `c` as a directory: its v1 hierarchy's cgroup
/// where it is in one below the root, else its cgroup2 cgroup; `None` once it is gone.
pub fn cgroup_dir(pid: i32, c: Controller) -> Option<PathBuf> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let (fstype, path) = match v1_path(&text, c.v1(), |p| p != "/") {
        Some(p) => ("cgroup", p),
        None => ("cgroup2", text.lines().find_map(|l| l.strip_prefix("0::"))?),
    };
    Some(PathBuf::from(mount(fstype, c.v1())?).join(path.trim_start_matches('/')))
}

/// The path, in /proc/PID/cgroup's `text`, of the v1 hierarchy that has `h`, where
/// `which` takes it.
fn v1_path<'a>(text: &'a str, h: &str, which: impl Fn(&str) -> bool) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, subs, path) = (f.next()?, f.next()?, f.next()?);
        (subs.split(',').any(|s| s == h) && which(path)).then_some(path)
    })
}

/// Where the root of the hierarchy of type `fstype` is mounted: the cgroup2 one, or the
/// v1 one that has `h`.
fn mount(fstype: &str, h: &str) -> Option<String> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let (t, _, opts) = (r.next()?, r.next()?, r.next()?);
        let ok = t == fstype && (t == "cgroup2" || opts.split(',').any(|o| o == h));
        let f: Vec<&str> = left.split_whitespace().collect();
        (ok && f.get(3) == Some(&"/")).then(|| f.get(4).map(|m| m.to_string()))?
    })
}

/// The status of `name` once `pred` holds of it, looked at again at each event, within
/// the deadline.
pub fn status_when(sb: &Sandbox, name: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let mut w = sb.watch();
    let end = Instant::now() + DEADLINE;
    loop {
        let s = sb.status(name);
        if pred(&s) {
            return s;
        }
        assert!(
            Instant::now() < end,
            "{name} never got there: {s}\n{}",
            sb.supd_log()
        );
        let _ = w.next_within(Duration::from_millis(200));
    }
}
