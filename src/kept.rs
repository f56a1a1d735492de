//! What supd holds for a service between its runs: the sockets of its `listen` (bound
//! once, handed to every run) and its fd store (fds the service gave supd to keep with
//! `FDSTORE=1`, handed back to its next run). A connection that arrives while no run is
//! there waits in a held socket's backlog, so a restart, an upgrade or a rollback of
//! the service refuses none.
//!
//! Each run gets them as fds 3.. as sd_listen_fds(3) expects: the `listen` sockets in
//! the config's order, then the stored fds in the order they were stored;
//! `LISTEN_FDS`, `LISTEN_FDNAMES` (the service's name for a socket, `FDNAME=` for a
//! stored fd) and `LISTEN_PID` (set by the child itself). They are held while the
//! service is wanted up (across restarts, crash loops, upgrades, rollbacks, a reload
//! that keeps the entry, and `reexec`, which carries them), and let go when it is
//! stopped or removed, or failed or exited for good (unless it is a tool's, which a
//! rollback may start again).
//!
//! The part: a slot's [`Kept`] keeps its sockets and store in private fields; the
//! coordinator asks it for the fds of a run, hands it what a notify message brought,
//! and carries it whole across `reexec`. It imports no part and not the coordinator.

mod bind;
pub mod take;

use crate::config::listen::ListenAddr;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// The name of a stored fd sent without `FDNAME=` (as systemd names it).
pub const DEFAULT_NAME: &str = "stored";

/// One held `listen` socket.
struct Listener {
    addr: ListenAddr,
    fd: OwnedFd,
    /// A Unix socket's file as supd made it (device, inode): removed when let go.
    made: Option<(u64, u64)>,
}

/// One stored fd.
struct Stored {
    name: String,
    fd: OwnedFd,
    /// Dropped when it reports POLLHUP or POLLERR (`FDPOLL=0` says not to watch it).
    poll: bool,
}

/// A service's held sockets and stored fds.
#[derive(Default)]
pub struct Kept {
    listen: Vec<Listener>,
    stored: Vec<Stored>,
    /// Refusals of each kind not told yet, and when that kind was last told: at most
    /// once a second, so that a run flooding its notify socket cannot flood supd's log.
    told: std::collections::BTreeMap<&'static str, crate::time::Throttle>,
}

/// What a run is given: its fds (3.. in this order) and their names.
pub struct ForRun<'a> {
    pub fds: Vec<BorrowedFd<'a>>,
    pub names: Vec<String>,
    /// Unix socket files to give to the run's user.
    pub give: Vec<PathBuf>,
}

/// Why an `FDSTORE=1` was refused (its fds are closed).
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The service has no store (`fd_store = 0`).
    NoStore,
    /// They would take it past `fd_store`.
    Full { have: usize, sent: usize, max: u32 },
    /// `FDNAME=` is not a name sd_listen_fds(3) can pass.
    BadName(String),
}

impl Refused {
    /// Its kind, for telling refusals at most once a second per kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Refused::NoStore => "no store",
            Refused::Full { .. } => "full",
            Refused::BadName(_) => "bad name",
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::NoStore => write!(f, "it has no fd store (set fd_store = N)"),
            Refused::Full { have, sent, max } => write!(
                f,
                "{sent} more would make {}, over fd_store = {max} (it holds {have}; FDSTOREREMOVE=1 drops some, or raise fd_store)",
                have + sent
            ),
            Refused::BadName(n) => write!(
                f,
                "FDNAME={n:?} is not a name (1 to 255 printable ASCII characters, no ':')"
            ),
        }
    }
}

/// Whether `name` may name a stored fd: it goes into `LISTEN_FDNAMES`, ':'-separated.
pub fn valid_name(name: &str) -> bool {
    (1..=255).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_graphic() && b != b':')
}

impl Kept {
    /// Before a start: holds exactly the sockets of `want`, in its order. Those held
    /// already are kept (a reload that keeps an entry keeps its socket and its
    /// backlog), new ones are bound, the others let go. An address that cannot be bound
    /// is the error; what could be bound is held either way.
    pub fn reconcile(&mut self, want: &[ListenAddr]) -> Result<(), String> {
        let mut old = std::mem::take(&mut self.listen);
        let mut first_error = None;
        for addr in want {
            if let Some(i) = old.iter().position(|l| l.addr == *addr) {
                self.listen.push(old.swap_remove(i));
                continue;
            }
            match bind::bind_listen(addr) {
                Ok((fd, made)) => {
                    log::info!("bound {addr}");
                    self.listen.push(Listener {
                        addr: addr.clone(),
                        fd,
                        made,
                    })
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        for l in old {
            log::info!("let go of {} (no longer listed)", l.addr);
            drop(l);
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Whether it holds a socket of `addr`.
    pub fn holds(&self, addr: &ListenAddr) -> bool {
        self.listen.iter().any(|l| l.addr == *addr)
    }

    /// A held socket whose address `addr` cannot be bound beside.
    pub fn clashing(&self, addr: &ListenAddr) -> Option<&ListenAddr> {
        (self.listen.iter())
            .map(|l| &l.addr)
            .find(|a| crate::config::listen::clashes(a, addr))
    }

    /// Sockets taken over from a run a killed supd left (`take.rs`), held as if this
    /// supd had bound them (a Unix socket's file is its own). A Unix socket whose file
    /// is gone (or is no socket now) is reached by no client: it is not taken, and the
    /// next start binds the address anew.
    pub fn take_over(&mut self, taken: Vec<(ListenAddr, OwnedFd)>) {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        for (addr, fd) in taken {
            if self.listen.iter().any(|l| l.addr == addr) {
                continue;
            }
            let made = match &addr {
                ListenAddr::Unix(p) => {
                    let file = std::fs::symlink_metadata(p)
                        .ok()
                        .filter(|m| m.file_type().is_socket());
                    let Some(m) = file else {
                        log::info!("{addr}: its file is gone: bound anew rather than taken over");
                        continue;
                    };
                    Some((m.dev(), m.ino()))
                }
                ListenAddr::Tcp(_) => None,
            };
            self.listen.push(Listener { addr, fd, made });
        }
    }

    /// A refusal of `kind` now: how many of that kind to tell (this one and those not
    /// told since), when a second has passed since that kind was last told; `None` to
    /// keep counting.
    pub fn refused(&mut self, kind: &'static str, now: crate::time::Mono) -> Option<usize> {
        self.told.entry(kind).or_default().hit(1, now)
    }

    /// The fds a run gets, in order, with their names (`service` names the sockets).
    pub fn for_run(&self, service: &str) -> ForRun<'_> {
        let mut run = ForRun {
            fds: Vec::with_capacity(self.listen.len() + self.stored.len()),
            names: Vec::with_capacity(self.listen.len() + self.stored.len()),
            give: Vec::new(),
        };
        for l in &self.listen {
            run.fds.push(l.fd.as_fd());
            run.names.push(service.to_string());
            if let ListenAddr::Unix(p) = &l.addr {
                run.give.push(p.clone());
            }
        }
        for s in &self.stored {
            run.fds.push(s.fd.as_fd());
            run.names.push(s.name.clone());
        }
        run
    }

    /// `FDSTORE=1` with `fds`: kept under `name` (all of them, or none: the message is
    /// refused whole), within `max` (`fd_store`).
    pub fn store(
        &mut self,
        fds: Vec<OwnedFd>,
        name: Option<&str>,
        poll: bool,
        max: u32,
    ) -> Result<usize, Refused> {
        let name = name.unwrap_or(DEFAULT_NAME);
        if max == 0 {
            return Err(Refused::NoStore);
        }
        if !valid_name(name) {
            return Err(Refused::BadName(name.to_string()));
        }
        if self.stored.len() + fds.len() > max as usize {
            return Err(Refused::Full {
                have: self.stored.len(),
                sent: fds.len(),
                max,
            });
        }
        let n = fds.len();
        self.stored.extend(fds.into_iter().map(|fd| Stored {
            name: name.to_string(),
            poll: poll && can_hang_up(fd.as_fd()),
            fd,
        }));
        Ok(n)
    }

    /// `FDSTOREREMOVE=1`: takes the stored fds named `name` out of the store. The caller
    /// takes a watched one out of its epoll set before it closes it (the set watches the
    /// file, which a run may still hold: closed first, it stays there for good).
    #[must_use = "closed unwatched, a stored fd may stay in the epoll set"]
    pub fn remove(&mut self, name: &str) -> Vec<OwnedFd> {
        self.take_stored(|s| s.name == name)
            .into_iter()
            .map(|(_, fd)| fd)
            .collect()
    }

    /// Takes the stored fds that hung up or failed (POLLHUP, POLLERR) out of the store,
    /// with their names (to be taken out of the epoll set, then closed, as `remove`'s).
    #[must_use = "closed unwatched, a stored fd may stay in the epoll set"]
    pub fn drop_hung(&mut self) -> Vec<(String, OwnedFd)> {
        self.take_stored(|s| s.poll && hung_up(s.fd.as_fd()))
    }

    /// Takes the stored fds past the first `max` out of the store (a reload lowered
    /// `fd_store`), with their names, to be taken out of the epoll set and closed.
    #[must_use = "closed unwatched, a stored fd may stay in the epoll set"]
    pub fn trim(&mut self, max: u32) -> Vec<(String, OwnedFd)> {
        let past = self.stored.split_off(self.stored.len().min(max as usize));
        past.into_iter().map(|s| (s.name, s.fd)).collect()
    }

    /// The stored fds for which `out` holds, taken out in order; the others stay.
    fn take_stored(&mut self, out: impl Fn(&Stored) -> bool) -> Vec<(String, OwnedFd)> {
        let (gone, kept) = std::mem::take(&mut self.stored).into_iter().partition(out);
        self.stored = kept;
        gone.into_iter().map(|s: Stored| (s.name, s.fd)).collect()
    }

    /// The stored fds to watch for a hang-up.
    pub fn watched(&self) -> impl Iterator<Item = BorrowedFd<'_>> {
        self.stored.iter().filter(|s| s.poll).map(|s| s.fd.as_fd())
    }

    /// How many fds are stored.
    pub fn stored_count(&self) -> usize {
        self.stored.len()
    }

    /// Everything is let go (the service is stopped or removed): the sockets close (a
    /// Unix socket's file is removed) and the store is emptied: its fds are returned, to
    /// be taken out of the epoll set before they close (as `remove`'s).
    #[must_use = "closed unwatched, a stored fd may stay in the epoll set"]
    pub fn release(&mut self) -> Vec<OwnedFd> {
        for l in self.listen.drain(..) {
            log::info!("let go of {}", l.addr);
        }
        self.take_stored(|_| true)
            .into_iter()
            .map(|(_, fd)| fd)
            .collect()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.listen.is_empty() && self.stored.is_empty()
    }

    /// For `status`: the held sockets' addresses, and each stored fd's name and what it
    /// is.
    pub fn shown(&self) -> (Vec<String>, Vec<(String, String)>) {
        let sockets = self.listen.iter().map(|l| l.addr.to_string()).collect();
        let stored = self
            .stored
            .iter()
            .map(|s| (s.name.clone(), describe(s.fd.as_fd())))
            .collect();
        (sockets, stored)
    }

    /// What a `reexec` carries, naming its fds in `fds`.
    pub fn carry<'a>(&'a self, fds: &mut Vec<BorrowedFd<'a>>) -> Carried {
        let mut c = Carried::default();
        for l in &self.listen {
            fds.push(l.fd.as_fd());
            c.listen.push((l.addr.clone(), l.fd.as_raw_fd(), l.made));
        }
        for s in &self.stored {
            fds.push(s.fd.as_fd());
            c.stored.push((s.name.clone(), s.fd.as_raw_fd(), s.poll));
        }
        c
    }

    /// Takes over what a previous image carried; what could not be taken is named in
    /// the messages (the next start binds a missing socket again).
    pub fn adopt(c: Carried) -> (Kept, Vec<String>) {
        let mut held = Kept::default();
        let mut lost = Vec::new();
        for (addr, fd, made) in c.listen {
            match crate::sys::adopt_fd(fd) {
                Ok(fd) => held.listen.push(Listener { addr, fd, made }),
                Err(e) => lost.push(format!("its socket {addr} (fd {fd}) was lost: {e}")),
            }
        }
        for (name, fd, poll) in c.stored {
            match crate::sys::adopt_fd(fd) {
                Ok(fd) => held.stored.push(Stored {
                    name,
                    poll: poll && can_hang_up(fd.as_fd()),
                    fd,
                }),
                Err(e) => lost.push(format!("its stored fd {name} (fd {fd}) was lost: {e}")),
            }
        }
        (held, lost)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let (ListenAddr::Unix(p), Some(made)) = (&self.addr, self.made) {
            bind::remove_file(p, made);
        }
    }
}

/// A held socket as the handoff carries it: its address, its fd, and the (device,
/// inode) of the Unix socket file supd made.
type CarriedSocket = (ListenAddr, RawFd, Option<(u64, u64)>);

/// A service's kept part as the handoff carries it.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Carried {
    /// Each socket: its address, fd and (Unix) file.
    #[serde(default)]
    listen: Vec<CarriedSocket>,
    /// Each stored fd: its name, fd and whether it is watched.
    #[serde(default)]
    stored: Vec<(String, RawFd, bool)>,
}

impl Carried {
    /// Nothing carried (serde skips it then).
    pub fn is_empty(&self) -> bool {
        self.listen.is_empty() && self.stored.is_empty()
    }
}

/// Whether `fd` can be watched for a hang-up: whether epoll takes it. It refuses what is
/// always ready and never hangs up: a regular file (a memfd among them), a directory, a
/// device without poll (/dev/null, /dev/zero), an `O_PATH` fd. Asked of a set of its
/// own, so that the loop's set is only given fds it takes.
fn can_hang_up(fd: BorrowedFd<'_>) -> bool {
    use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
    Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).is_ok_and(|probe| {
        probe
            .add(fd, EpollEvent::new(EpollFlags::empty(), 0))
            .is_ok()
    })
}

/// Whether `fd` reports POLLHUP or POLLERR now (never waits).
fn hung_up(fd: BorrowedFd<'_>) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut p = [PollFd::new(fd, PollFlags::empty())];
    match poll(&mut p, PollTimeout::ZERO) {
        Ok(n) if n > 0 => p[0].revents().is_some_and(|r| {
            r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL)
        }),
        _ => false,
    }
}

/// What a stored fd is, for `status`: a socket's addresses, else what /proc names it.
fn describe(fd: BorrowedFd<'_>) -> String {
    use nix::sys::socket::{getpeername, getsockname, SockaddrStorage};
    let raw = fd.as_raw_fd();
    let local = getsockname::<SockaddrStorage>(raw).ok();
    if let Some(local) = local {
        let peer = getpeername::<SockaddrStorage>(raw).ok();
        return match peer {
            Some(p) => format!("socket {local} <- {p}"),
            None => format!("socket {local}"),
        };
    }
    match std::fs::read_link(format!("/proc/self/fd/{raw}")) {
        Ok(p) => p.to_string_lossy().into_owned(),
        Err(_) => "an fd".to_string(),
    }
}

#[cfg(test)]
mod tests;
