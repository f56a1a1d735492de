//! Taking a killed supd's sockets over: before the next supd ends what the killed one
//! left running, it copies the `listen` sockets out of each left run's main process
//! (`pidfd_getfd`, Linux 5.6), so that the socket the clients connect to is never closed:
//! the left run serves on it until it is ended, the next run gets the very same socket,
//! and a connection that arrives in between waits in its backlog. Where the kernel or
//! the process's owner does not allow it, the address is bound anew once the left run
//! is gone (and clients are refused in between, as without supd's sockets).

use crate::config::listen::ListenAddr;
use nix::sys::socket::{getsockname, getsockopt, sockopt, SockaddrStorage};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// The `listen` sockets of the runs a previous supd of `state_dir` left, by service:
/// each address of `want` (a service's `listen`) found listening in its recorded main
/// process, while that is the recorded process (its start time).
pub fn from_left_runs(
    state_dir: &std::path::Path,
    want: &BTreeMap<String, Vec<ListenAddr>>,
) -> BTreeMap<String, Vec<(ListenAddr, OwnedFd)>> {
    let mut out = BTreeMap::new();
    for rec in crate::records::read_pids(state_dir) {
        let Some(addrs) = want.get(&rec.service).filter(|a| !a.is_empty()) else {
            continue;
        };
        let taken = from_process(rec.pid, rec.start_time, addrs);
        if !taken.is_empty() {
            log::info!(
                "{}: took over {} from the run (pid {}) a previous supd left",
                rec.service,
                names(&taken),
                rec.pid
            );
            // (One record per service; were there two, each address is taken once.)
            let held: &mut Vec<(ListenAddr, OwnedFd)> = out.entry(rec.service).or_default();
            for (addr, fd) in taken {
                if !held.iter().any(|(a, _)| *a == addr) {
                    held.push((addr, fd));
                }
            }
        }
    }
    out
}

fn names(taken: &[(ListenAddr, OwnedFd)]) -> String {
    let v: Vec<String> = taken.iter().map(|(a, _)| a.to_string()).collect();
    v.join(", ")
}

/// The listening sockets of process `pid` (started at `start_time`) that hold an
/// address of `addrs`, one each.
fn from_process(pid: i32, start_time: u64, addrs: &[ListenAddr]) -> Vec<(ListenAddr, OwnedFd)> {
    let same = || crate::proc::stat(pid).is_some_and(|s| s.start_time == start_time);
    if pid <= 1 || !same() {
        return Vec::new();
    }
    let Ok(pidfd) = crate::sys::pidfd_open(pid) else {
        return Vec::new();
    };
    // The pidfd names the process from here on: still the recorded one?
    if !same() {
        return Vec::new();
    }
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let mut out: Vec<(ListenAddr, OwnedFd)> = Vec::new();
    for entry in dir.flatten() {
        let Some(n) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        let fd = match crate::sys::pidfd_getfd(&pidfd, n) {
            Ok(fd) => fd,
            // Closed since /proc listed it: the others may still be there.
            Err(e) if e.raw_os_error() == Some(libc::EBADF) => continue,
            Err(e) => {
                log::debug!("pid {pid}: its fd {n} cannot be taken over: {e}");
                // Not allowed, or no pidfd_getfd: the others will not be either.
                return out;
            }
        };
        if let Some(addr) = listening_at(&fd, addrs) {
            if !out.iter().any(|(a, _)| *a == addr) {
                out.push((addr, fd));
            }
        }
    }
    out
}

/// Which of `addrs` the socket `fd` listens at, if any.
fn listening_at(fd: &OwnedFd, addrs: &[ListenAddr]) -> Option<ListenAddr> {
    if !getsockopt(fd, sockopt::AcceptConn).unwrap_or(false) {
        return None;
    }
    if getsockopt(fd, sockopt::SockType).ok()? != nix::sys::socket::SockType::Stream {
        return None;
    }
    let local: SockaddrStorage = getsockname(fd.as_fd().as_raw_fd()).ok()?;
    addrs.iter().find(|a| matches(a, &local)).cloned()
}

fn matches(addr: &ListenAddr, local: &SockaddrStorage) -> bool {
    match addr {
        ListenAddr::Tcp(std::net::SocketAddr::V4(a)) => local
            .as_sockaddr_in()
            .is_some_and(|l| std::net::SocketAddrV4::from(*l) == *a),
        ListenAddr::Tcp(std::net::SocketAddr::V6(a)) => local.as_sockaddr_in6().is_some_and(|l| {
            let l = std::net::SocketAddrV6::from(*l);
            l.ip() == a.ip() && l.port() == a.port()
        }),
        ListenAddr::Unix(p) => local
            .as_unix_addr()
            .and_then(|u| u.path())
            .is_some_and(|l| l == p.as_path()),
    }
}

#[cfg(test)]
// A test's expects and unwraps are a test's: a failed one fails the test.
mod tests {
    use super::*;

    #[test]
    fn a_listening_socket_is_told_by_its_address() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let fd = OwnedFd::from(l);
        let mine = ListenAddr::Tcp(format!("127.0.0.1:{port}").parse().expect("addr"));
        let other = ListenAddr::Tcp(format!("127.0.0.1:{}", port ^ 1).parse().expect("addr"));
        assert_eq!(
            listening_at(&fd, &[other.clone(), mine.clone()]),
            Some(mine)
        );
        assert_eq!(listening_at(&fd, &[other]), None);
        // A connected socket is no listener.
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let any = ListenAddr::Unix("/x".into());
        assert_eq!(listening_at(&OwnedFd::from(a), &[any]), None);
    }
}
