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
/// leaders to exit, then KILL. Returns the services that had something left.
pub fn end(state_dir: &Path, grace: Duration) -> Vec<String> {
    let recs = records::read_pids(state_dir);
    let ours: Vec<&PidRecord> = recs.iter().filter(|r| r.pid > 1 && still_ours(r)).collect();
    if ours.is_empty() {
        return Vec::new();
    }
    let mut pidfds = Vec::new();
    for r in &ours {
        log::warn!(
            "{}: process group {} was left by a previous supd; ending it",
            r.service,
            r.pid
        );
        let pg = Pid::from_raw(r.pid);
        let _ = killpg(pg, Signal::SIGTERM);
        let _ = killpg(pg, Signal::SIGCONT);
        if let Ok(fd) = crate::sys::pidfd_open(r.pid) {
            pidfds.push(fd);
        }
    }
    // Wait (in poll, not in a sleep) for the leaders to exit, within the grace.
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
    for r in &ours {
        let _ = killpg(Pid::from_raw(r.pid), Signal::SIGKILL);
    }
    if let Err(e) = records::write_pids(state_dir, &[]) {
        log::warn!(
            "cannot clear the pid records in {}: {e}",
            state_dir.display()
        );
    }
    ours.iter().map(|r| r.service.clone()).collect()
}

/// Whether the group of a record may still hold the service's processes.
fn still_ours(r: &PidRecord) -> bool {
    match crate::proc::stat(r.pid) {
        Some(s) => s.start_time == r.start_time,
        None => true,
    }
}
