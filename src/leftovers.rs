//! Ending what a previous supd left running (it was killed, or crashed), before anything
//! starts: no service ever runs twice.
//!
//! A pid record names a process group. Linux never reuses a pid while it is still in use
//! as a process group id, so: if the recorded leader is alive with the recorded start
//! time, or no process has that pid at all, every member of that group is a remnant of
//! the service; if another process now has the pid, the old group is empty.

use crate::records::{self, PidRecord};
use crate::time::Mono;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::path::Path;
use std::time::Duration;

/// Stops the groups recorded in `state_dir`: TERM and CONT, up to `grace` for their
/// members to exit, then KILL, and waits until they are gone. Returns the services that had something left.
pub fn end(state_dir: &Path, grace: Duration) -> Vec<String> {
    let recs = records::read_pids(state_dir);
    let ours: Vec<&PidRecord> = recs.iter().filter(|r| r.pid > 1 && still_ours(r)).collect();
    if ours.is_empty() {
        if !recs.is_empty() {
            records::clear_pids(state_dir);
        }
        return Vec::new();
    }
    let groups: Vec<i32> = ours.iter().map(|r| r.pid).collect();
    for r in &ours {
        log::warn!(
            "{}: process group {} was left by a previous supd; ending it",
            r.service,
            r.pid
        );
        let pg = Pid::from_raw(r.pid);
        let _ = killpg(pg, Signal::SIGTERM);
        let _ = killpg(pg, Signal::SIGCONT);
    }
    wait_members(&groups, grace);
    for g in &groups {
        let _ = killpg(Pid::from_raw(*g), Signal::SIGKILL);
    }
    // SIGKILL cannot be refused, but dying takes a moment: wait until nothing of the old
    // groups is left, so the new instances never overlap the old ones.
    wait_members(&groups, Duration::from_secs(5));
    records::clear_pids(state_dir);
    ours.iter().map(|r| r.service.clone()).collect()
}

/// Waits, in poll on pidfds, until every live member of `groups` has exited, or `grace`.
fn wait_members(groups: &[i32], grace: Duration) {
    let members: Vec<i32> = crate::proc::all()
        .into_iter()
        .filter(|s| groups.contains(&s.pgrp) && s.state != 'Z')
        .map(|s| s.pid)
        .collect();
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
