//! The services' fds (output pipes, readiness pipes, notify sockets, exec reports, health
//! check sockets, leaders' pidfds, stored fds) in one epoll set, which sits in the loop's `poll` as
//! a single fd. A slot's fds are registered again only when the slot was touched, so a
//! turn costs the same with ten services or ten thousand.
//!
//! Closed fds leave an epoll set by themselves (once no process holds them: a child
//! between fork and exec may, for a moment), and their numbers are soon taken by new
//! files. So each registration remembers its file (device and inode), and a number is
//! only removed from the set while it still names that file.

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

/// Which of a service's fds is ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ServiceFd {
    /// Its output pipe.
    Output,
    /// Its stderr pipe, when stderr is kept apart.
    OutputErr,
    /// Its `fd:N` readiness pipe.
    Ready,
    /// Its notify socket.
    Notify,
    /// The report of its child's exec.
    Exec,
    /// The socket of its health check under way.
    Health,
    /// The pidfd of its run's leader: readable once the leader has exited.
    Leader,
    /// A stored fd (watched for POLLHUP and POLLERR only).
    Stored,
}

const KINDS: [ServiceFd; 8] = [
    ServiceFd::Output,
    ServiceFd::OutputErr,
    ServiceFd::Ready,
    ServiceFd::Notify,
    ServiceFd::Exec,
    ServiceFd::Health,
    ServiceFd::Leader,
    ServiceFd::Stored,
];

/// One fd a slot wants watched: for what, and for which events (`POLLIN` or `POLLOUT`).
pub type Wanted<'a> = (BorrowedFd<'a>, ServiceFd, EpollFlags);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reg {
    token: u64,
    flags: EpollFlags,
    file: (u64, u64),
}

/// The epoll set and what is in it.
pub struct FdSet {
    epoll: Epoll,
    by_fd: BTreeMap<RawFd, Reg>,
    of_slot: BTreeMap<u32, Vec<RawFd>>,
    events: Vec<EpollEvent>,
}

fn token(id: u32, kind: ServiceFd) -> u64 {
    (u64::from(id) << 8) | kind as u64
}

/// The slot id and fd kind of a token.
fn untoken(t: u64) -> Option<(u32, ServiceFd)> {
    let kind = *KINDS.get((t & 0xff) as usize)?;
    Some(((t >> 8) as u32, kind))
}

impl FdSet {
    /// An empty set.
    pub fn new() -> nix::Result<FdSet> {
        Ok(FdSet {
            epoll: Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?,
            by_fd: BTreeMap::new(),
            of_slot: BTreeMap::new(),
            events: vec![EpollEvent::empty(); 256],
        })
    }

    /// The fd to poll: readable while some fd in the set is ready.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.epoll.0.as_fd()
    }

    /// Makes the set hold exactly `wanted` for slot `id` (nothing for a slot that is gone).
    pub fn sync(&mut self, id: u32, wanted: &[Wanted<'_>]) {
        let old = self.of_slot.remove(&id).unwrap_or_default();
        for fd in old {
            let ours = self
                .by_fd
                .get(&fd)
                .is_some_and(|r| untoken(r.token).is_some_and(|(i, _)| i == id));
            if !ours || wanted.iter().any(|(w, ..)| w.as_raw_fd() == fd) {
                continue;
            }
            if let Some(reg) = self.by_fd.remove(&fd) {
                // Still open as the same file (kept elsewhere): out of the set, or a
                // readable fd nobody reads would wake the loop for ever.
                if crate::sys::file_of_raw(fd) == Some(reg.file) {
                    crate::sys::epoll_delete_raw(&self.epoll, fd);
                }
            }
        }
        let mut now_held = Vec::with_capacity(wanted.len());
        for (fd, kind, flags) in wanted {
            let raw = fd.as_raw_fd();
            let Some(file) = crate::sys::file_of_raw(raw) else {
                continue;
            };
            let reg = Reg {
                token: token(id, *kind),
                flags: *flags,
                file,
            };
            now_held.push(raw);
            match self.by_fd.get(&raw) {
                Some(r) if *r == reg => continue,
                Some(r) if r.file == file => {
                    let mut ev = EpollEvent::new(reg.flags, reg.token);
                    if let Err(e) = self.epoll.modify(fd, &mut ev) {
                        log::warn!("epoll: cannot change fd {raw}: {e}");
                    }
                }
                _ => {
                    let ev = EpollEvent::new(reg.flags, reg.token);
                    match self.epoll.add(fd, ev) {
                        Ok(()) => {}
                        // Held under another token a moment ago (a number that was not
                        // given back to the set).
                        Err(nix::errno::Errno::EEXIST) => {
                            let mut ev = ev;
                            if let Err(e) = self.epoll.modify(fd, &mut ev) {
                                log::warn!("epoll: cannot change fd {raw}: {e}");
                            }
                        }
                        Err(e) => {
                            log::warn!("epoll: cannot watch fd {raw}: {e}");
                            now_held.pop();
                            continue;
                        }
                    }
                }
            }
            self.by_fd.insert(raw, reg);
        }
        if !now_held.is_empty() {
            self.of_slot.insert(id, now_held);
        }
    }

    /// Takes `fd` out of the set before its owner closes it. Needed where another process
    /// may hold the same file (a stored fd, which the run holds too): epoll watches the
    /// file, so a registration whose fd is closed first stays in the set until every
    /// copy is closed, and one that is ready (a hang-up) wakes the loop at every turn.
    pub fn forget(&mut self, fd: BorrowedFd<'_>) {
        let raw = fd.as_raw_fd();
        if let Some(reg) = self.by_fd.remove(&raw) {
            if crate::sys::file_of_raw(raw) == Some(reg.file) {
                crate::sys::epoll_delete_raw(&self.epoll, raw);
            }
        }
    }

    /// The fds that are ready now (without waiting), as slot ids and kinds.
    pub fn ready(&mut self) -> Vec<(u32, ServiceFd, EpollFlags)> {
        let n = match self.epoll.wait(&mut self.events, EpollTimeout::ZERO) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => {
                log::warn!("epoll_wait: {e}");
                0
            }
        };
        self.events[..n]
            .iter()
            .filter_map(|e| untoken(e.data()).map(|(id, k)| (id, k, e.events())))
            .collect()
    }

    /// What slot `id` has in the set, for checks: fd numbers, kinds and events.
    pub fn held(&self, id: u32) -> Vec<(RawFd, ServiceFd, EpollFlags)> {
        let fds = self.of_slot.get(&id).map(Vec::as_slice).unwrap_or(&[]);
        fds.iter()
            .filter_map(|fd| {
                let r = self.by_fd.get(fd)?;
                untoken(r.token).map(|(_, k)| (*fd, k, r.flags))
            })
            .collect()
    }

    /// How many fds the set holds.
    pub fn len(&self) -> usize {
        self.by_fd.len()
    }

    /// The set holds no fd.
    pub fn is_empty(&self) -> bool {
        self.by_fd.is_empty()
    }
}

/// `POLLIN`/`POLLOUT` of a `poll` flag set, for epoll.
pub fn epoll_flags(flags: nix::poll::PollFlags) -> EpollFlags {
    let mut e = EpollFlags::empty();
    if flags.contains(nix::poll::PollFlags::POLLIN) {
        e |= EpollFlags::EPOLLIN;
    }
    if flags.contains(nix::poll::PollFlags::POLLOUT) {
        e |= EpollFlags::EPOLLOUT;
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::unistd::{pipe, write};

    #[test]
    fn tokens_carry_the_slot_and_the_kind() {
        for k in KINDS {
            assert_eq!(untoken(token(0xdead_beef, k)), Some((0xdead_beef, k)));
        }
        assert_eq!(untoken(0xff), None);
    }

    #[test]
    fn a_ready_fd_is_told_with_its_slot_and_a_dropped_one_leaves_the_set() {
        let mut set = FdSet::new().expect("epoll");
        let (r, w) = pipe().expect("pipe");
        let (r2, _w2) = pipe().expect("pipe");
        set.sync(
            7,
            &[
                (r.as_fd(), ServiceFd::Output, EpollFlags::EPOLLIN),
                (r2.as_fd(), ServiceFd::Ready, EpollFlags::EPOLLIN),
            ],
        );
        assert!(set.ready().is_empty());
        write(&w, b"x").expect("write");
        let ready = set.ready();
        assert_eq!(ready.len(), 1);
        assert_eq!((ready[0].0, ready[0].1), (7, ServiceFd::Output));
        // No longer wanted but still open: taken out, so it cannot wake the loop.
        set.sync(7, &[(r2.as_fd(), ServiceFd::Ready, EpollFlags::EPOLLIN)]);
        assert!(set.ready().is_empty());
        assert_eq!(set.held(7).len(), 1);
        set.sync(7, &[]);
        assert!(set.is_empty());
    }

    #[test]
    fn a_number_taken_by_a_new_file_is_watched_anew() {
        let mut set = FdSet::new().expect("epoll");
        let (mut a, _aw) = pipe().expect("pipe");
        set.sync(1, &[(a.as_fd(), ServiceFd::Output, EpollFlags::EPOLLIN)]);
        // Slot 1's file goes and its number now names another pipe, of slot 2.
        let (b, bw) = pipe().expect("pipe");
        nix::unistd::dup2(&b, &mut a).expect("dup2");
        drop(b);
        set.sync(2, &[(a.as_fd(), ServiceFd::Output, EpollFlags::EPOLLIN)]);
        // Slot 1 learns its fd is gone: it must not take slot 2's registration away.
        set.sync(1, &[]);
        write(&bw, b"x").expect("write");
        let ready: Vec<_> = set.ready().iter().map(|e| (e.0, e.1)).collect();
        assert_eq!(ready, [(2, ServiceFd::Output)]);
        assert_eq!(set.len(), 1);
    }
}
