//! One run of a service at the kernel's edge, from its fork to the exit of its last
//! process. The promises of "one instance" live here:
//!
//! - it is recorded before its program runs (`sys::spawn_service` holds the child until
//!   the supervisor's record is written; the child moved itself into its cgroup before);
//! - when its leader exits, the whole group (and cgroup) is killed while the leader is
//!   still an unreaped zombie, so the group's id cannot name anything else meanwhile;
//! - it is over only when no process of it is left: only then does its service learn
//!   that it exited (a stopping service becomes `stopped`, a crashed one is restarted),
//!   `stop` answers and a lease is released.

use crate::cgroup;
use crate::service::Exit;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// A service's running (or finishing) processes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    /// The leader, whose pid is also the process group's and session's id.
    pub pid: i32,
    /// The leader's start time (clock ticks since boot), as recorded.
    pub start_time: u64,
    /// Its cgroup, where supd has them.
    pub cgroup: Option<PathBuf>,
    /// How the leader ended, once it was reaped: the service learns it when the rest of
    /// the run is gone too.
    #[serde(default)]
    pub exit: Option<Exit>,
    /// The dead-man guard of a leader-only service's run (`deadman.rs`): supd's own
    /// child, killed when the run is over.
    #[serde(default)]
    pub guard: Option<i32>,
    /// The lease a leader-only run was started under: its guard holds that lease's
    /// grant board, whatever lease a reload names for the service meanwhile. None for
    /// a run of an older image (the config's lease is taken then).
    #[serde(default)]
    pub lease: Option<String>,
    /// When the leader was reaped: since then the run drains, and a process of it that
    /// outlives SIGKILL past `KILL_WAIT` holds the service back (`status` names it).
    #[serde(default)]
    pub reaped_at: Option<crate::time::Mono>,
}

impl Instance {
    /// The stop path: sends `sig` to the process group, then SIGCONT so that a stopped
    /// group acts on it (a stopped process would hold its stop signal until the SIGKILL);
    /// SIGKILL also goes to everything in the cgroup.
    pub fn signal(&self, sig: Signal) {
        if sig == Signal::SIGKILL {
            return self.kill_all();
        }
        if self.leader_gone() {
            // Its group id may name another group by now (`signal_left`).
            return;
        }
        signal_group(self.pid, sig);
        if sig != Signal::SIGCONT {
            signal_group(self.pid, Signal::SIGCONT);
        }
    }

    /// SIGKILL to the cgroup and to the process group; without a cgroup, also to what
    /// left the group but not the session (the leader's `setsid` made its pid the
    /// session's id, which stays taken while any process is in the session). Once the
    /// leader was reaped, to the cgroup alone: the group and session were killed while
    /// its zombie held their id, and that id may name another process's by now.
    pub fn kill_all(&self) {
        if let Some(dir) = &self.cgroup {
            cgroup::kill(dir);
        }
        if self.leader_gone() {
            return;
        }
        signal_group(self.pid, Signal::SIGKILL);
        if self.cgroup.is_none() {
            for s in session_stats(self.pid) {
                // Exact through a pidfd; without pidfds (Linux before 5.3), by pid while
                // it is still the process the scan found.
                let sent = crate::sys::pidfd_open(s.pid).is_ok_and(|fd| {
                    crate::proc::is_same(s.pid, s.start_time)
                        && crate::sys::pidfd_send_signal(&fd, Signal::SIGKILL as i32).is_ok()
                });
                if !sent {
                    crate::proc::kill_if_same(s.pid, s.start_time, Signal::SIGKILL);
                }
            }
        }
    }

    /// `sig` to what is left of a run whose leader was reaped (`supctl signal`,
    /// `reload NAME`): to each member of its cgroup, each through a pidfd opened while
    /// it is a member (a pid the cgroup lists again once the pidfd holds it names that
    /// member; without pidfds, by pid as the cgroup lists it). Never to the process
    /// group id: the leader's pid, free since it was reaped, may lead another group by
    /// now. `None` without a cgroup (nothing is sent: nothing names the rest exactly);
    /// else the pids signalled.
    pub fn signal_left(&self, sig: Signal) -> Option<Vec<i32>> {
        let dir = self.cgroup.as_deref()?;
        let listed = cgroup::members(dir);
        let held: Vec<(i32, Option<std::os::fd::OwnedFd>)> = listed
            .into_iter()
            .map(|p| (p, crate::sys::pidfd_open(p).ok()))
            .collect();
        let still = cgroup::members(dir);
        let mut sent = Vec::new();
        for (pid, fd) in held {
            if !still.contains(&pid) {
                continue;
            }
            let ok = match &fd {
                Some(fd) => crate::sys::pidfd_send_signal(fd, sig as i32).is_ok(),
                None => nix::sys::signal::kill(Pid::from_raw(pid), sig).is_ok(),
            };
            if ok {
                sent.push(pid);
            }
        }
        Some(sent)
    }

    /// The run is over: its dead-man guard, if any, is ended.
    pub fn disarm(&mut self) {
        if let Some(g) = self.guard.take() {
            crate::deadman::disarm(g);
        }
    }

    /// The processes of this run that are still there: the leader until it is reaped,
    /// and the members of its cgroup (or, without one, of its session).
    pub fn pids(&self) -> Vec<i32> {
        let leader = (!self.leader_gone()).then_some(self.pid);
        let rest = match self.cgroup.as_deref() {
            Some(d) => cgroup::members(d),
            None => session_members(self.pid),
        };
        leader.into_iter().chain(rest).collect()
    }

    /// Whether the leader was reaped (what is awaited is the rest of the run).
    pub fn leader_gone(&self) -> bool {
        self.exit.is_some()
    }

    /// Whether no process of this run is left. Only asked once the leader was reaped:
    /// before, the leader itself is a member.
    pub fn is_gone(&self) -> bool {
        let group_gone = matches!(
            killpg(Pid::from_raw(self.pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        group_gone
            && match self.cgroup.as_deref() {
                Some(d) => !cgroup::populated(d),
                None => session_members(self.pid).is_empty(),
            }
    }
}

/// The live processes of session `sid` (a scan of /proc: only without cgroups).
fn session_members(sid: i32) -> Vec<i32> {
    session_stats(sid).into_iter().map(|s| s.pid).collect()
}

/// The same, with what /proc says of each (its start time).
fn session_stats(sid: i32) -> Vec<crate::proc::Stat> {
    crate::proc::all()
        .into_iter()
        .filter(|s| s.session == sid && s.state != 'Z')
        .collect()
}

/// Sends `sig`, and only `sig`, to the process group led by `pid` (`supctl signal SVC
/// STOP` must leave it stopped; the stop path adds its SIGCONT itself). A group that is
/// gone already is not an error.
pub fn signal_group(pid: i32, sig: Signal) {
    match killpg(Pid::from_raw(pid), sig) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => log::warn!(
            "cannot send {} to process group {pid}: {e}",
            crate::config::signal_name(sig)
        ),
    }
}
