//! The dead-man switch of leader-only services: a run of a leader-only service must not
//! outlive its grant, even when supd (and sup-lease) are killed, and nobody is left to
//! stop it when the grant runs out.
//!
//! supd holds the write end of one pipe, and never writes to it; it keeps it across
//! `reexec` (handed over with the other fds). Each run of a leader-only service gets a
//! guard (`sys::spawn_guard`), forked before the run's program may start: a small
//! process outside the service that holds the read end, a pidfd of the run's leader and
//! the run's `cgroup.kill` (on kernels without pidfds, before 5.3, the leader's
//! `/proc/PID` directory instead of the pidfd; without `cgroup.kill`, before 5.14, its
//! `cgroup.procs`, whose members it kills one by one). When the last supd image holding the write end is gone, the
//! guard reads end-of-file and SIGKILLs the run, at once: a supd that is gone renews
//! nothing, and its successor would end the run anyway. When the run is over, supd kills
//! its guard.
//!
//! Why not `PR_SET_PDEATHSIG` on the leader: it reaches the leader alone (not its
//! children, nor a daemon in its cgroup), it is cleared when the child changes its user,
//! and it ties the switch to a thread rather than to supd's state. The pipe follows supd
//! through `exec` (the same pid, the write end kept open), so a `reexec` does not fire
//! it, and a new image that dies does.

use crate::sys;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;

/// supd's ends of the dead-man pipe.
pub struct Deadman {
    read: OwnedFd,
    write: OwnedFd,
}

impl Deadman {
    /// A new pipe, both ends close-on-exec (services and helpers never hold it).
    pub fn new() -> io::Result<Deadman> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok(Deadman { read, write })
    }

    /// The pipe of a previous image (`reexec`).
    pub fn adopt((read, write): (RawFd, RawFd)) -> io::Result<Deadman> {
        Ok(Deadman {
            read: sys::adopt_fd(read)?,
            write: sys::adopt_fd(write)?,
        })
    }

    /// Both ends, read end first, for the handoff.
    pub fn fds(&self) -> [BorrowedFd<'_>; 2] {
        [self.read.as_fd(), self.write.as_fd()]
    }

    /// Forks the guard of the run led by `pid` (supd's child, not yet reaped, so the
    /// pidfd names it exactly), in `cgroup` if it has one. Returns the guard's pid.
    pub fn arm(&self, pid: i32, cgroup: Option<&Path>) -> Result<i32, String> {
        // Without pidfds (Linux before 5.3), the leader's /proc directory names it as
        // exactly while it is not reaped (`sys::guard_main`).
        let (leader, leader_is_pidfd) = match sys::pidfd_open(pid) {
            Ok(fd) => (fd, true),
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                let dir = std::fs::File::open(format!("/proc/{pid}"))
                    .map_err(|e| format!("cannot open /proc/{pid}: {e}"))?;
                (OwnedFd::from(dir), false)
            }
            Err(e) => return Err(format!("cannot open a pidfd of {pid}: {e}")),
        };
        let cgroup_kill = cgroup.and_then(|d| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(d.join("cgroup.kill"))
                .ok()
                .map(OwnedFd::from)
        });
        // Without `cgroup.kill` (Linux before 5.14), the guard kills each member
        // `cgroup.procs` lists.
        let cgroup_procs = cgroup.filter(|_| cgroup_kill.is_none()).and_then(|d| {
            std::fs::File::open(d.join("cgroup.procs"))
                .ok()
                .map(OwnedFd::from)
        });
        sys::spawn_guard(&sys::GuardTarget {
            deadman: self.read.as_raw_fd(),
            deadman_write: self.write.as_raw_fd(),
            leader: &leader,
            leader_is_pidfd,
            cgroup_kill: cgroup_kill.as_ref(),
            cgroup_procs: cgroup_procs.as_ref(),
            pgid: pid,
        })
        .map_err(|e| format!("cannot fork its dead-man guard: {e}"))
    }
}

/// Ends `guard`, supd's own unreaped child (its run is over, or it is being replaced).
pub fn disarm(guard: i32) {
    use nix::sys::signal::{kill, Signal};
    match kill(nix::unistd::Pid::from_raw(guard), Signal::SIGKILL) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(e) => log::warn!("cannot end the dead-man guard {guard}: {e}"),
    }
}

impl crate::supervisor::Supervisor {
    /// Whether `pid`, just reaped, was a run's guard. A guard that died while its run
    /// goes on (someone killed it) is replaced; one that cannot be is not left
    /// unguarded: the run is killed, and starts again with a guard if it still may.
    pub(crate) fn guard_died(&mut self, pid: i32) -> bool {
        let Some(name) = (self.slots.iter())
            .find(|(_, s)| s.instance.as_ref().is_some_and(|i| i.guard == Some(pid)))
            .map(|(n, _)| n.clone())
        else {
            return false;
        };
        let Some(slot) = self.slots.get_mut(&name) else {
            return false;
        };
        let Some(run) = slot.instance.as_mut() else {
            return false;
        };
        run.guard = None;
        if run.leader_gone() {
            return true; // the rest of the run was killed with its leader already
        }
        let armed = match &self.deadman {
            Some(d) => d.arm(run.pid, run.cgroup.as_deref()),
            None => Err("no dead-man pipe".into()),
        };
        match armed {
            Ok(g) => {
                log::warn!("{name}: its dead-man guard {pid} died; a new one ({g}) guards the run");
                run.guard = Some(g);
            }
            Err(e) => {
                log::error!("{name}: its dead-man guard {pid} died and {e}; killing the run");
                run.kill_all();
            }
        }
        true
    }

    /// Arms a guard for every leader-only run that has none (taken over from a supd
    /// without dead-man switches): its leader is still this process's child.
    pub(crate) fn arm_unguarded(&mut self) {
        let unguarded: Vec<String> = self
            .slots
            .iter()
            .filter(|(_, s)| s.cfg.leader_only.is_some())
            .filter(|(_, s)| {
                s.instance
                    .as_ref()
                    .is_some_and(|i| i.guard.is_none() && !i.leader_gone())
            })
            .map(|(n, _)| n.clone())
            .collect();
        if unguarded.is_empty() {
            return;
        }
        if self.deadman.is_none() {
            match Deadman::new() {
                Ok(d) => self.deadman = Some(d),
                Err(e) => {
                    log::error!(
                        "cannot make the dead-man pipe: {e}; leader-only runs are unguarded"
                    );
                    return;
                }
            }
        }
        for name in unguarded {
            let (Some(d), Some(run)) = (
                self.deadman.as_ref(),
                self.slots.get_mut(&name).and_then(|s| s.instance.as_mut()),
            ) else {
                continue;
            };
            match d.arm(run.pid, run.cgroup.as_deref()) {
                Ok(g) => run.guard = Some(g),
                Err(e) => {
                    log::error!("{name}: {e}; killing the run, which may not go unguarded");
                    run.kill_all();
                }
            }
        }
    }
}
