//! After a sandbox's supd is gone: the cgroups it made (its root, recorded in
//! `state/cgroup`, and the roots of the same name in the cgroup v1 hierarchies of its
//! limits), removed. A supd killed with SIGKILL leaves them, and each sandbox's state
//! directory names another root: without this, every test run leaves hundreds behind.
//! Only empty cgroups go (rmdir): a populated one is left as it is.

use std::fs;
use std::path::{Path, PathBuf};

/// Removes the cgroups of the supd whose state directory is `state`.
pub fn sweep(state: &Path) {
    let Ok(text) = fs::read_to_string(state.join("cgroup")) else {
        return;
    };
    let root = PathBuf::from(text.trim());
    let Some(name) = root.file_name().map(|n| n.to_os_string()) else {
        return;
    };
    remove_tree(&root);
    for dir in v1_dirs() {
        remove_tree(&dir.join(&name));
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
