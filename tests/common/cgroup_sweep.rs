//! After a sandbox's supd is gone: the cgroups it made (its root, recorded in
//! `state/cgroup`, and the roots of the same name in the cgroup v1 hierarchies of its
//! limits), removed. A supd killed with SIGKILL leaves them, and each sandbox's state
//! directory names another root: without this, every test run leaves hundreds behind.
//! What still runs in them is the test's (a run a supd killed with SIGKILL left, a
//! process `kill_mode = "main"` let live on): ended by its pid first.

use std::fs;
use std::path::{Path, PathBuf};

/// Removes the cgroups of the supd whose state directory is `state`.
pub fn sweep(state: &Path) {
    let Ok(text) = fs::read_to_string(state.join("cgroup")) else {
        return;
    };
    let root = PathBuf::from(text.trim());
    // Only a root supd made for a sandbox (`sup-<id>`): never a cgroup of others.
    let Some(name) = root
        .file_name()
        .filter(|n| n.to_string_lossy().starts_with("sup-"))
        .map(|n| n.to_os_string())
    else {
        return;
    };
    let mut trees = vec![root];
    trees.extend(v1_dirs().into_iter().map(|d| d.join(&name)));
    for t in &trees {
        end_members(t);
    }
    for t in &trees {
        remove_tree(t);
    }
}

/// SIGKILL to every process in `dir` and the cgroups below it, and a wait (with a
/// deadline) for each to be gone.
fn end_members(dir: &Path) {
    let mut pids = Vec::new();
    members(dir, &mut pids);
    for &pid in &pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    for pid in pids {
        let _ = super::wait_exit(pid, std::time::Duration::from_secs(5));
    }
}

fn members(dir: &Path, out: &mut Vec<i32>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(
            text.lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
                .filter(|p| *p > 1),
        );
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                members(&e.path(), out);
            }
        }
    }
}

/// This process's cgroup in each mounted cgroup v1 hierarchy (where supd, started by
/// it, made its limits' roots).
fn v1_dirs() -> Vec<PathBuf> {
    let (Ok(own), Ok(mountinfo)) = (
        fs::read_to_string("/proc/self/cgroup"),
        fs::read_to_string("/proc/self/mountinfo"),
    ) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in own.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(subs), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if subs.is_empty() || subs.starts_with("name=") {
            continue;
        }
        let mount = mountinfo.lines().find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut r = right.split_whitespace();
            let (t, _, opts) = (r.next()?, r.next()?, r.next()?);
            let ours = t == "cgroup" && subs.split(',').all(|s| opts.split(',').any(|o| o == s));
            let f: Vec<&str> = left.split_whitespace().collect();
            (ours && f.get(3) == Some(&"/")).then(|| f.get(4).map(|m| m.to_string()))?
        });
        if let Some(m) = mount {
            out.push(Path::new(&m).join(path.trim_start_matches('/')));
        }
    }
    out
}

/// rmdir of `dir` and the cgroups below it, deepest first.
fn remove_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}
