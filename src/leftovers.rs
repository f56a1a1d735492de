//! Ending what a previous supd left running (it was killed, or crashed), before anything
//! starts: no service ever runs twice.
//!
//! A pid record names a process group. Linux never reuses a pid while it is still in use
//! as a process group id, so: if the recorded leader is alive with the recorded start
//! time, or no process has that pid at all, every member of that group is a remnant of
//! the service; if another process now has the pid, the old group is empty.

use crate::cgroup;
use crate::records::{self, PidRecord};
use crate::time::Mono;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Stops the groups recorded in `state_dir`, and everything in the cgroups a previous
/// supd of it used: TERM and CONT, up to `grace` for their members to exit, then KILL,
/// and waits until they are gone. Returns the services that had something left.
pub fn end(state_dir: &Path, grace: Duration) -> Vec<String> {
    let recs = records::read_pids(state_dir);
    let ours: Vec<&PidRecord> = recs.iter().filter(|r| r.pid > 1 && still_ours(r)).collect();
    let cgroups: Vec<PathBuf> = cgroup::left_by_previous(state_dir)
        .into_iter()
        .filter(|d| {
            let busy = cgroup::populated(d);
            if !busy {
                cgroup::remove(d);
            }
            busy
        })
        .collect();
    if ours.is_empty() && cgroups.is_empty() {
        if !recs.is_empty() {
            records::clear_pids(state_dir);
        }
        return Vec::new();
    }
    let groups: Vec<i32> = ours.iter().map(|r| r.pid).collect();
    let mut left: Vec<String> = Vec::new();
    for r in &ours {
        log::warn!(
            "{}: process group {} was left by a previous supd; ending it",
            r.service,
            r.pid
        );
        left.push(r.service.clone());
        let pg = Pid::from_raw(r.pid);
        let _ = killpg(pg, Signal::SIGTERM);
        let _ = killpg(pg, Signal::SIGCONT);
    }
    for d in &cgroups {
        log::warn!(
            "{}: processes were left in it by a previous supd; ending them",
            d.display()
        );
        let name = d.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        left.push(name.trim_end_matches(".service").to_string());
        for pid in cgroup::members(d) {
            let p = Pid::from_raw(pid);
            let _ = nix::sys::signal::kill(p, Signal::SIGTERM);
            let _ = nix::sys::signal::kill(p, Signal::SIGCONT);
        }
    }
    wait_members(&groups, &cgroups, grace);
    for g in &groups {
        let _ = killpg(Pid::from_raw(*g), Signal::SIGKILL);
    }
    for d in &cgroups {
        cgroup::kill(d);
    }
    // SIGKILL cannot be refused, but dying takes a moment: wait until nothing of the old
    // groups is left, so the new instances never overlap the old ones.
    wait_members(&groups, &cgroups, Duration::from_secs(5));
    for d in &cgroups {
        if cgroup::populated(d) {
            log::error!("{}: processes are still in it after SIGKILL", d.display());
        }
        cgroup::remove(d);
    }
    records::clear_pids(state_dir);
    left.sort();
    left.dedup();
    left
}

/// Waits, in poll on pidfds, until every live member of `groups` and of `cgroups` has
/// exited, or `grace`.
fn wait_members(groups: &[i32], cgroups: &[PathBuf], grace: Duration) {
    let mut members: Vec<i32> = crate::proc::all()
        .into_iter()
        .filter(|s| groups.contains(&s.pgrp) && s.state != 'Z')
        .map(|s| s.pid)
        .collect();
    members.extend(cgroups.iter().flat_map(|d| cgroup::members(d)));
    let mut pidfds: Vec<_> = members
        .iter()
        .filter_map(|p| crate::sys::pidfd_open(*p).ok())
        .collect();
    let deadline = Mono::now().plus(grace);
    while !pidfds.is_empty() {
        let left = deadline.since(Mono::now());
        if left.is_zero() {
            break;
        }
        let ms = PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
            .unwrap_or(PollTimeout::MAX);
        let mut fds: Vec<PollFd> = pidfds
            .iter()
            .map(|f| PollFd::new(std::os::fd::AsFd::as_fd(f), PollFlags::POLLIN))
            .collect();
        if poll(&mut fds, ms).is_err() {
            break;
        }
        let exited: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        let mut i = 0;
        pidfds.retain(|_| {
            let keep = !exited[i];
            i += 1;
            keep
        });
    }
}

/// Whether the group of a record may still hold the service's processes.
fn still_ours(r: &PidRecord) -> bool {
    match crate::proc::stat(r.pid) {
        Some(s) => s.start_time == r.start_time,
        None => true,
    }
}
