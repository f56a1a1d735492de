//! One run of a service at the kernel's edge, from its fork to the exit of its last
//! process. The promises of "one instance" live here:
//!
//! - it is recorded before its program runs (`spawner::spawn_service` holds the child until
//!   the supervisor's record is written; the child was forked into its cgroup, or moved
//!   itself in, before);
//! - when its leader exits, the whole group (and cgroup) is killed while the leader is
//!   still an unreaped zombie, so the group's id cannot name anything else meanwhile;
//! - it is over only when no process of it is left: only then does its service learn
//!   that it exited (a stopping service becomes `stopped`, a crashed one is restarted),
//!   `stop` answers and a lease is released.

use crate::cgroup;
use crate::config::KillMode;
use crate::service::Exit;
use crate::subtree::Leaders;
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
    /// What of the run a stop, a crash and the end of the run address (`kill_mode`, as
    /// the config said when it started: a reload that changes it restarts the run, which
    /// is stopped as it was started). `None` in a run handed over by an image that did
    /// not know it: the config's is taken then (`supervisor/handoff.rs`).
    #[serde(default)]
    pub kill_mode: Option<KillMode>,
    /// How many other processes of the run (as `kill_mode` counts them) were there when
    /// its leader exited: a leader that exits with a success code while they remain
    /// has daemonized.
    #[serde(default)]
    pub left_at_exit: u32,
    /// Whether `left_at_exit` is a lower bound only: a run tracked by its process group
    /// alone is counted after its group was killed (`supervisor/reap.rs`), and what was
    /// still dying then was not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub left_uncounted: bool,
    /// Its memory cgroup's OOM-kill count when it started (`cgroup/limits.rs`): a rise
    /// by the time its leader dies of SIGKILL makes that exit an OOM kill.
    #[serde(default)]
    pub oom_at_start: Option<u64>,
    /// Why its leader died, when the kernel's OOM killer killed it (found at its reap).
    #[serde(default)]
    pub out_of_memory: Option<String>,
}

impl Instance {
    /// The stop path: sends `sig` to the process group, then SIGCONT so that a stopped
    /// group acts on it (a stopped process would hold its stop signal until the SIGKILL);
    /// SIGKILL also goes to everything in the cgroup.
    /// With `kill_mode = "main"`, to the leader alone. `leaders`: those of the runs,
    /// which a walk of a session passes over (`subtree.rs`).
    pub fn signal(&self, sig: Signal, leaders: &dyn Leaders) {
        if sig == Signal::SIGKILL {
            return self.kill_all(leaders);
        }
        if self.leader_gone() {
            // Its group id may name another group by now (`signal_left`).
            return;
        }
        self.signal_leader_or_group(sig);
        if sig != Signal::SIGCONT {
            self.signal_leader_or_group(Signal::SIGCONT);
        }
    }

    /// `sig`, and only `sig`, to what `kill_mode` addresses while the leader is there:
    /// every process of its cgroup (`"cgroup"`: its process group at once, then each
    /// other member of the cgroup; without a cgroup, the process group), its process
    /// group (`"group"`), or the leader alone (`"main"`; it is supd's child, not reaped
    /// yet, so its pid names it). The stop path, `supctl signal`, `reload NAME`.
    pub fn signal_leader_or_group(&self, sig: Signal) {
        match self.mode() {
            KillMode::Cgroup => {
                signal_group(self.pid, sig);
                if let Some(dir) = self.cgroup.as_deref() {
                    let outside = |p: i32| {
                        p != self.pid && crate::proc::stat(p).is_some_and(|s| s.pgrp != self.pid)
                    };
                    signal_members(dir, outside, sig);
                }
            }
            KillMode::Group => signal_group(self.pid, sig),
            KillMode::Main => match nix::sys::signal::kill(Pid::from_raw(self.pid), sig) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(e) => log::warn!(
                    "cannot send {} to process {}: {e}",
                    crate::config::signal_name(sig),
                    self.pid
                ),
            },
        }
    }

    /// SIGKILL to the cgroup and to the process group; without a cgroup, also to what
    /// left the group but not the session, where supd finds it below itself
    /// (`subtree.rs`; the leader's `setsid` made its pid the session's id, which its
    /// process or zombie holds meanwhile). Once the leader was reaped, to the cgroup
    /// alone, or without one to each member of the session found below supd, by its
    /// start time: never to the group's id, which may name another group by now.
    ///
    /// With `kill_mode = "group"`, the process group alone (once the leader was reaped,
    /// the members of the cgroup in that group); with `"main"`, the leader alone (none
    /// once reaped).
    pub fn kill_all(&self, leaders: &dyn Leaders) {
        match self.mode() {
            KillMode::Cgroup => {}
            KillMode::Group => {
                if !self.leader_gone() {
                    signal_group(self.pid, Signal::SIGKILL);
                } else if let Some(dir) = &self.cgroup {
                    for pid in self.in_group(cgroup::members(dir)) {
                        kill_exact(pid, None, Signal::SIGKILL);
                    }
                }
                return;
            }
            KillMode::Main => {
                if !self.leader_gone() {
                    let _ = nix::sys::signal::kill(Pid::from_raw(self.pid), Signal::SIGKILL);
                }
                return;
            }
        }
        if let Some(dir) = &self.cgroup {
            cgroup::kill(dir);
            if !self.leader_gone() {
                signal_group(self.pid, Signal::SIGKILL);
            }
            return;
        }
        // Without a cgroup the session is walked first: a member the group's SIGKILL
        // ends hands its children to supd as it exits, and a walk made after could pass
        // them by. Each is killed exactly (its start time), also once the leader was
        // reaped: the session's id stays taken while any member is left, and a new run
        // whose leader took the number is passed over (`subtree::session_of_run`). So a
        // straggler (a member that forked after the walk) is ended by the next drain.
        let session = self.session(leaders).unwrap_or_default();
        if !self.leader_gone() {
            signal_group(self.pid, Signal::SIGKILL);
        }
        for s in session {
            kill_exact(s.pid, Some(s.start_time), Signal::SIGKILL);
        }
    }

    /// The live processes of the run's session besides its leader, found below supd
    /// (`subtree.rs`); `None` where only the process group is known (a kernel without
    /// the children files).
    fn session(&self, leaders: &dyn Leaders) -> Option<Vec<crate::proc::Stat>> {
        if crate::subtree::tracking() != crate::subtree::Tracking::Session {
            return None;
        }
        let mut found = crate::subtree::session_of_run(self.pid, !self.leader_gone(), leaders);
        found.retain(|s| s.pid != self.pid);
        Some(found)
    }

    /// The members of `pids` in this run's process group (the leader excepted).
    fn in_group(&self, pids: Vec<i32>) -> Vec<i32> {
        pids.into_iter()
            .filter(|p| *p != self.pid)
            .filter(|p| crate::proc::stat(*p).is_some_and(|s| s.pgrp == self.pid && s.state != 'Z'))
            .collect()
    }

    /// How many processes of the run besides its leader are there, as `kill_mode`
    /// counts them (asked when the leader has exited, before the rest is killed): the
    /// other members of its cgroup (without one: of its session, which holds its
    /// process group), of its process group (`"group"`), none (`"main"`: what it
    /// leaves is not the run's). `None` without a cgroup where only the process group
    /// is known: its zombie leader counts as a member of it until reaped, so the group
    /// is looked at after the reap (`supervisor/reap.rs`).
    pub fn others(&self, leaders: &dyn Leaders) -> Option<u32> {
        let n = match (self.mode(), self.cgroup.as_deref()) {
            (KillMode::Main, _) => 0,
            (KillMode::Cgroup, Some(d)) => cgroup::members(d)
                .into_iter()
                .filter(|p| *p != self.pid)
                .count(),
            (KillMode::Cgroup, None) => self.session(leaders)?.len(),
            (KillMode::Group, Some(d)) => self.in_group(cgroup::members(d)).len(),
            (KillMode::Group, None) => (self.session(leaders)?.iter())
                .filter(|s| s.pgrp == self.pid)
                .count(),
        };
        Some(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// `sig` to what is left of a run whose leader was reaped (`supctl signal`,
    /// `reload NAME`): to each member of its cgroup, each through a pidfd opened while
    /// it is a member (a pid the cgroup lists again once the pidfd holds it names that
    /// member; without pidfds, by pid as the cgroup lists it). Never to the process
    /// group id: the leader's pid, free since it was reaped, may lead another group by
    /// now. `None` without a cgroup (nothing is sent: nothing names the rest exactly);
    /// else the pids signalled.
    /// With `kill_mode = "group"`, to the members in its process group; `"main"`:
    /// `None` (nothing of a run is left once its leader is reaped).
    pub fn signal_left(&self, sig: Signal) -> Option<Vec<i32>> {
        let dir = self.cgroup.as_deref()?;
        match self.mode() {
            KillMode::Cgroup => Some(signal_members(dir, |_| true, sig)),
            KillMode::Group => Some(signal_members(
                dir,
                |p| crate::proc::stat(p).is_some_and(|s| s.pgrp == self.pid),
                sig,
            )),
            KillMode::Main => None,
        }
    }

    /// The cgroup a dead-man guard kills: the run's with `kill_mode = "cgroup"`; with a
    /// narrower one none (the guard ends the leader and its group).
    pub fn guard_cgroup(&self) -> Option<&std::path::Path> {
        self.cgroup
            .as_deref()
            .filter(|_| self.mode() == KillMode::Cgroup)
    }

    /// What of the run a stop and its end address (`kill_mode`).
    pub fn mode(&self) -> KillMode {
        self.kill_mode.unwrap_or_default()
    }

    /// The run is over: its dead-man guard, if any, is ended.
    pub fn disarm(&mut self) {
        if let Some(g) = self.guard.take() {
            crate::deadman::disarm(g);
        }
    }

    /// The processes of this run that are still there: the leader until it is reaped,
    /// and the members of its cgroup (or, without one, of its session, where supd
    /// finds it below itself; where only the process group is known, none: they are
    /// not named).
    /// With `kill_mode = "group"`, of its process group; `"main"`: the leader alone.
    pub fn pids(&self, leaders: &dyn Leaders) -> Vec<i32> {
        let leader = (!self.leader_gone()).then_some(self.pid);
        let in_session = || self.session(leaders).unwrap_or_default().into_iter();
        let rest = match (self.mode(), self.cgroup.as_deref()) {
            (KillMode::Main, _) => Vec::new(),
            (KillMode::Group, Some(d)) => self.in_group(cgroup::members(d)),
            (KillMode::Group, None) => in_session()
                .filter(|s| s.pgrp == self.pid)
                .map(|s| s.pid)
                .collect(),
            (KillMode::Cgroup, Some(d)) => cgroup::members(d),
            (KillMode::Cgroup, None) => in_session().map(|s| s.pid).collect(),
        };
        leader.into_iter().chain(rest).collect()
    }

    /// Whether the leader was reaped (what is awaited is the rest of the run).
    pub fn leader_gone(&self) -> bool {
        self.exit.is_some()
    }

    /// Whether no process of this run is left. Only asked once the leader was reaped:
    /// before, the leader itself is a member.
    /// With `kill_mode = "main"` the run is over once its leader was reaped; with
    /// `"group"`, once its process group is gone. Without a cgroup, once its group and
    /// its session (where supd finds it below itself) are.
    pub fn is_gone(&self, leaders: &dyn Leaders) -> bool {
        if self.mode() == KillMode::Main {
            return self.leader_gone();
        }
        let group_gone = matches!(
            killpg(Pid::from_raw(self.pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        group_gone
            && (self.mode() == KillMode::Group
                || match self.cgroup.as_deref() {
                    Some(d) => !cgroup::populated(d),
                    None => self.session(leaders).is_none_or(|s| s.is_empty()),
                })
    }
}

/// `sig` to each member of cgroup `dir` that `pick` takes, each through a pidfd opened
/// while it is a member (a pid the cgroup lists again once the pidfd holds it names that
/// member; without pidfds, by pid as the cgroup lists it); the pids signalled.
fn signal_members(dir: &std::path::Path, pick: impl Fn(i32) -> bool, sig: Signal) -> Vec<i32> {
    let held: Vec<(i32, Option<std::os::fd::OwnedFd>)> = cgroup::members(dir)
        .into_iter()
        .filter(|p| pick(*p))
        .map(|p| (p, crate::sys::pidfd_open(p).ok()))
        .collect();
    if held.is_empty() {
        return Vec::new();
    }
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
    sent
}

/// `sig` to `pid`: exact through a pidfd; without pidfds (Linux before 5.3), by pid
/// while it is still the process found (its start time, when known).
fn kill_exact(pid: i32, start_time: Option<u64>, sig: Signal) {
    let same = |p| start_time.is_none_or(|t| crate::proc::is_same(p, t));
    let sent = crate::sys::pidfd_open(pid)
        .is_ok_and(|fd| same(pid) && crate::sys::pidfd_send_signal(&fd, sig as i32).is_ok());
    if !sent {
        match start_time {
            Some(t) => crate::proc::kill_if_same(pid, t, sig),
            None => {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
            }
        }
    }
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
