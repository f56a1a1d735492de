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
//!
//! A supd that lives but is frozen (SIGSTOP, a hung disk, a paused VM) keeps the pipe
//! open and renews nothing: the grant alone bounds the run. So each lease has a grant
//! *board*, a small shared file (a memfd) that supd rewrites on every grant with the
//! instant on CLOCK_BOOTTIME by which the run must be gone (the grant's end plus its kill
//! grace); each guard holds the board of its run's lease, sleeps on a CLOCK_BOOTTIME
//! timer until that instant, reads the board again and SIGKILLs the run when the
//! instant was not moved, whatever supd is doing. The boards follow supd through
//! `reexec` with the pipe.

use crate::sys;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;

/// supd's ends of the dead-man pipe, and the grant board of each lease.
pub struct Deadman {
    read: OwnedFd,
    write: OwnedFd,
    boards: BTreeMap<String, OwnedFd>,
}

impl Deadman {
    /// A new pipe, both ends close-on-exec (services and helpers never hold it).
    pub fn new() -> io::Result<Deadman> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        Ok(Deadman {
            read,
            write,
            boards: BTreeMap::new(),
        })
    }

    /// The pipe and boards of a previous image (`reexec`); a board that cannot be
    /// taken is left out (its lease gets a new one at its next grant, and its runs'
    /// guards are armed again: `rearm_guards`).
    pub fn adopt((read, write): (RawFd, RawFd), boards: &[(String, RawFd)]) -> io::Result<Deadman> {
        let mut d = Deadman {
            read: sys::adopt_fd(read)?,
            write: sys::adopt_fd(write)?,
            boards: BTreeMap::new(),
        };
        for (lease, fd) in boards {
            match sys::adopt_fd(*fd) {
                Ok(fd) => {
                    d.boards.insert(lease.clone(), fd);
                }
                Err(e) => log::warn!("lease {lease}: its grant board was not handed over ({e})"),
            }
        }
        Ok(d)
    }

    /// Both ends, read end first, for the handoff.
    pub fn fds(&self) -> [BorrowedFd<'_>; 2] {
        [self.read.as_fd(), self.write.as_fd()]
    }

    /// The boards, for the handoff.
    pub fn boards(&self) -> impl Iterator<Item = (&str, BorrowedFd<'_>)> {
        self.boards.iter().map(|(l, f)| (l.as_str(), f.as_fd()))
    }

    /// Whether `lease` has a board.
    pub fn has_board(&self, lease: &str) -> bool {
        self.boards.contains_key(lease)
    }

    /// The end the board of `lease` holds now, if it has a readable one.
    pub fn posted(&self, lease: &str) -> Option<crate::time::Boot> {
        let fd = self.boards.get(lease)?;
        let mut b = [0u8; sys::BOARD_LEN];
        // On the board's own fd (no dup: a renewal must not fail for want of an fd).
        match nix::sys::uio::pread(fd, &mut b, 0) {
            Ok(n) if n == b.len() => sys::board_end(&b).map(crate::time::Boot),
            _ => None,
        }
    }

    /// Writes on the board of `lease` (made if it has none) the instant by which its
    /// runs must be gone. A board that cannot be made or written is said: the runs'
    /// guards then keep the last end they read, and kill the runs there.
    ///
    /// A guard reads the board only when the end it last read comes: an end moved
    /// *earlier* is not seen before the old one. Whoever posts an earlier end replaces
    /// the guards of the lease's runs (`Supervisor::replace_guards`).
    pub fn post(&mut self, lease: &str, end: crate::time::Boot) {
        if !self.boards.contains_key(lease) {
            match sys::board_file() {
                Ok(fd) => {
                    self.boards.insert(lease.to_string(), fd);
                }
                Err(e) => {
                    log::error!("lease {lease}: cannot make its grant board ({e}); its leader-only services cannot start");
                    return;
                }
            }
        }
        let Some(fd) = self.boards.get(lease) else {
            return;
        };
        // One pwrite of the whole record on the board's own fd (no dup: a renewal must
        // not fail for want of an fd; a guard that reads it torn reads it again).
        let record = sys::board_record(end.0);
        match nix::sys::uio::pwrite(fd, &record, 0) {
            Ok(n) if n == record.len() => {}
            Ok(n) => log::error!("lease {lease}: its grant board took {n} of {} bytes; its runs end at the end last written", record.len()),
            Err(e) => log::error!("lease {lease}: cannot write its grant board ({e}); its runs end at the end last written"),
        }
    }

    /// Forks the guard of the run of `lease` led by `pid` (supd's child, not yet reaped,
    /// so the pidfd names it exactly), in `cgroup` if it has one. Returns the guard's
    /// pid. A lease without a board (no grant was ever posted) gets none: its run is
    /// killed at once, as a run without a grant must be.
    pub fn arm(&mut self, lease: &str, pid: i32, cgroup: Option<&Path>) -> Result<i32, String> {
        if !self.has_board(lease) {
            self.post(lease, crate::time::Boot(0));
        }
        let board = self.boards.get(lease);
        if board.is_none() {
            return Err(format!("lease {lease} has no grant board"));
        }
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
            board,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Boot;
    use std::os::unix::fs::FileExt;

    #[test]
    fn a_board_record_reads_back_and_a_torn_one_is_seen() {
        let r = sys::board_record(123_456_789);
        assert_eq!(sys::board_end(&r), Some(123_456_789));
        // Half of a new record over half of the old one: the halves disagree.
        let new = sys::board_record(987_654_321);
        let mut torn = r;
        torn[..8].copy_from_slice(&new[..8]);
        assert_eq!(sys::board_end(&torn), None);
        assert_eq!(sys::board_end(&r[..10]), None, "a short read");
    }

    #[test]
    fn a_posted_end_is_what_the_board_holds_and_a_renewal_moves_it() {
        let mut d = Deadman::new().expect("pipe");
        assert!(!d.has_board("engine"));
        let read = |d: &Deadman| {
            let (_, fd) = d.boards().find(|(l, _)| *l == "engine").expect("a board");
            let f = std::fs::File::from(fd.try_clone_to_owned().expect("dup"));
            let mut b = [0u8; sys::BOARD_LEN];
            f.read_exact_at(&mut b, 0).expect("read the board");
            sys::board_end(&b)
        };
        d.post("engine", Boot(5_000_000_000));
        assert_eq!(read(&d), Some(5_000_000_000));
        d.post("engine", Boot(7_000_000_000));
        assert_eq!(read(&d), Some(7_000_000_000));
        assert_eq!(d.posted("engine"), Some(Boot(7_000_000_000)));
        assert_eq!(d.posted("other"), None, "a lease without a board");
        assert_eq!(d.boards().count(), 1, "one board per lease");
    }
}
