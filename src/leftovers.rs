//! Ending what a previous supd left running (it was killed, or crashed), before anything
//! starts: no service ever runs twice, and nothing that was not a service's is touched.
//!
//! What counts as left by a service:
//! - everything in a cgroup the previous supd used for its services (exact);
//! - the process group (and session) a pid record names, while the recorded leader is
//!   alive with the recorded start time: Linux never reuses a pid that still names a
//!   process group or session, so they are the service's;
//! - when the recorded leader is gone, the group's id may since have been taken by an
//!   unrelated process that made a group of its own: then only the members whose
//!   environment names the service (`SUP_SERVICE`, which supd gives every service).
//!
//! Signals go through pidfds, so a member that exits meanwhile, and whose pid is taken by
//! another process, is never signalled by mistake.

use crate::cgroup;
use crate::proc::Stat;
use crate::records::{self, PidRecord};
use crate::time::Mono;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Stops what the records and cgroups of `state_dir` say a previous supd left: TERM and
/// CONT, up to `grace` for it to exit, then KILL, and waits until it is gone. Returns the
/// services that had something left.
pub fn end(state_dir: &Path, grace: Duration) -> Vec<String> {
    let recs: Vec<PidRecord> = records::read_pids(state_dir)
        .into_iter()
        .filter(|r| r.pid > 1)
        .collect();
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
    let found = remnants(&recs, &cgroups);
    if found.is_empty() {
        records::clear_pids(state_dir);
        return Vec::new();
    }
    let mut left: Vec<String> = found.iter().map(|(_, s)| s.clone()).collect();
    left.sort();
    left.dedup();
    for service in &left {
        log::warn!("{service}: a run of it was left by a previous supd; ending it");
    }
    let mut members = open(&found);
    signal(&members, Signal::SIGTERM);
    signal(&members, Signal::SIGCONT);
    wait(&mut members, grace);
    // KILL what is left; a member that forked meanwhile is found by the next look.
    for _ in 0..3 {
        for d in &cgroups {
            cgroup::kill(d);
        }
        let mut members = open(&remnants(&recs, &cgroups));
        if members.is_empty() {
            break;
        }
        signal(&members, Signal::SIGKILL);
        // SIGKILL cannot be refused, but dying takes a moment: the new instances must
        // never overlap the old ones.
        wait(&mut members, Duration::from_secs(5));
    }
    for d in &cgroups {
        if cgroup::populated(d) {
            log::error!("{}: processes are still in it after SIGKILL", d.display());
        }
        cgroup::remove(d);
    }
    records::clear_pids(state_dir);
    left
}

/// The live processes left by services, with the service of each.
fn remnants(recs: &[PidRecord], cgroups: &[PathBuf]) -> Vec<(i32, String)> {
    // For each record: whether its group is surely the service's (the leader lives).
    let groups: Vec<(&PidRecord, bool)> = recs
        .iter()
        .filter_map(|r| match crate::proc::stat(r.pid) {
            Some(s) if s.start_time == r.start_time => Some((r, true)),
            // Another process has the pid now: it cannot be the leader of the old
            // group, and the old group, which would have kept the pid, is empty.
            Some(_) => None,
            None => Some((r, false)),
        })
        .collect();
    let mut out: Vec<(i32, String)> = Vec::new();
    if !groups.is_empty() {
        for s in crate::proc::all().iter().filter(|s| s.state != 'Z') {
            if let Some((r, _)) = groups.iter().find(|(r, owned)| {
                (r.pid == s.pgrp || r.pid == s.session) && (*owned || names_service(s, &r.service))
            }) {
                out.push((s.pid, r.service.clone()));
            }
        }
    }
    for d in cgroups {
        let name = d.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let service = name.trim_end_matches(".service").to_string();
        out.extend(cgroup::members(d).into_iter().map(|p| (p, service.clone())));
    }
    out.sort();
    out.dedup_by_key(|(p, _)| *p);
    out
}

/// Whether the environment a process was started with names `service` as its own.
fn names_service(s: &Stat, service: &str) -> bool {
    let want = format!("SUP_SERVICE={service}");
    std::fs::read(format!("/proc/{}/environ", s.pid))
        .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == want.as_bytes()))
}

/// A process to end: its pid and, where the kernel has them, a pidfd.
struct Member {
    pid: i32,
    fd: Option<OwnedFd>,
}

fn open(found: &[(i32, String)]) -> Vec<Member> {
    found
        .iter()
        .map(|(pid, _)| Member {
            pid: *pid,
            fd: crate::sys::pidfd_open(*pid).ok(),
        })
        .collect()
}

/// Sends `sig` to each member: through its pidfd (exact), or by pid on kernels without
/// pidfds.
fn signal(members: &[Member], sig: Signal) {
    for m in members {
        match &m.fd {
            Some(fd) => {
                let _ = crate::sys::pidfd_send_signal(fd, sig as i32);
            }
            None => {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(m.pid), sig);
            }
        }
    }
}

/// Waits, in poll on the pidfds, until every member has exited, or `grace`.
fn wait(members: &mut Vec<Member>, grace: Duration) {
    members.retain(|m| m.fd.is_some());
    let deadline = Mono::now().plus(grace);
    while !members.is_empty() {
        let left = deadline.since(Mono::now());
        if left.is_zero() {
            break;
        }
        let ms = PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
            .unwrap_or(PollTimeout::MAX);
        let mut fds: Vec<PollFd> = members
            .iter()
            .filter_map(|m| m.fd.as_ref())
            .map(|f| PollFd::new(f.as_fd(), PollFlags::POLLIN))
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
        members.retain(|_| {
            let keep = !exited[i];
            i += 1;
            keep
        });
    }
}
