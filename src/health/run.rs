//! The runners of health checks, in the loop and never blocking: a TCP connect and an
//! HTTP GET over non-blocking sockets polled by the loop, and a command forked like a
//! service (its user looked up in the child), reaped by the loop's child handling. And
//! the supervisor's side: starting and ending checks with their service, their timers,
//! the verdicts.

use super::Health;
use crate::config::Check;
use crate::sys;
use nix::errno::Errno;
use nix::poll::PollFlags;
use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// The most of an HTTP answer read for its status line.
const HTTP_READ_MAX: usize = 4096;

/// One run of a check under way.
pub enum Probe {
    /// A check command: its process (and group), and how its exec went.
    Command { pid: i32, exec: sys::Exec },
    /// A TCP connect under way.
    Tcp { sock: OwnedFd, addr: SocketAddr },
    /// An HTTP GET under way.
    Http {
        sock: OwnedFd,
        addr: SocketAddr,
        path: String,
        phase: HttpPhase,
    },
}

/// Where an HTTP GET is.
pub enum HttpPhase {
    Connecting,
    /// The request, and how much of it is written.
    Writing(Vec<u8>, usize),
    /// What came of the answer so far.
    Reading(Vec<u8>),
}

/// What a run came to.
pub type Outcome = Option<Result<(), String>>;

/// Starts a non-blocking connect. `Ok(None)`: under way; `Ok(Some(sock))`: connected.
fn connect(addr: SocketAddr) -> Result<(OwnedFd, bool), String> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let sock = socket::socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| format!("cannot make a socket for {addr}: {}", e.desc()))?;
    let raw = std::os::fd::AsRawFd::as_raw_fd(&sock);
    loop {
        let done = match addr {
            SocketAddr::V4(a) => socket::connect(raw, &socket::SockaddrIn::from(a)),
            SocketAddr::V6(a) => socket::connect(raw, &socket::SockaddrIn6::from(a)),
        };
        return match done {
            Ok(()) => Ok((sock, true)),
            Err(Errno::EINPROGRESS) => Ok((sock, false)),
            Err(Errno::EINTR) => continue,
            Err(e) => Err(format!("cannot connect to {addr}: {}", e.desc())),
        };
    }
}

/// Whether a connect under way has ended: `None` while it goes on. No pending error
/// is not enough: a connect under way has none either, and the fd may be looked at
/// before it is ready (the loop's tokens name services by their index, which a reload
/// in the same turn may shift), so a peer is asked for.
fn connected(sock: &OwnedFd, addr: SocketAddr) -> Option<Result<(), String>> {
    match socket::getsockopt(sock, sockopt::SocketError) {
        Ok(0) => match socket::getpeername::<socket::SockaddrStorage>(
            std::os::fd::AsRawFd::as_raw_fd(sock),
        ) {
            Ok(_) => Some(Ok(())),
            Err(Errno::ENOTCONN) => None,
            Err(e) => Some(Err(format!("cannot connect to {addr}: {}", e.desc()))),
        },
        Ok(e) if Errno::from_raw(e) == Errno::EINPROGRESS => None,
        Ok(e) => Some(Err(format!(
            "cannot connect to {addr}: {}",
            Errno::from_raw(e).desc()
        ))),
        Err(e) => Some(Err(format!("cannot connect to {addr}: {}", e.desc()))),
    }
}

/// Reads the status of an HTTP answer from its first line: 2xx is healthy.
pub fn http_verdict(head: &[u8], addr: SocketAddr, path: &str) -> Result<(), String> {
    let line = head.split(|b| *b == b'\n').next().unwrap_or(&[]);
    let line = String::from_utf8_lossy(line);
    let mut words = line.split_whitespace();
    let code = match (words.next(), words.next()) {
        (Some(v), Some(c))
            if v.starts_with("HTTP/") && c.len() == 3 && c.bytes().all(|b| b.is_ascii_digit()) =>
        {
            c.parse::<u16>().ok()
        }
        _ => None,
    };
    match code {
        Some(c) if (200..300).contains(&c) => Ok(()),
        Some(c) => Err(format!("HTTP {c} from {addr}{path}")),
        None => Err(format!("no HTTP status line from {addr}{path}")),
    }
}

impl Probe {
    /// Starts a TCP or HTTP run (a command is started by the supervisor). A run that
    /// ends at once (refused) is its outcome.
    pub(crate) fn begin_socket(check: &Check) -> Result<Probe, String> {
        match check {
            Check::Tcp(addr) => {
                let (sock, _) = connect(*addr)?;
                Ok(Probe::Tcp { sock, addr: *addr })
            }
            Check::Http { addr, path } => {
                let (sock, _) = connect(*addr)?;
                Ok(Probe::Http {
                    sock,
                    addr: *addr,
                    path: path.clone(),
                    phase: HttpPhase::Connecting,
                })
            }
            Check::Command(_) => Err("not a socket check".into()),
        }
    }

    /// The fd to poll and for what (a command has none: its exit is SIGCHLD).
    pub fn poll_fd(&self) -> Option<(BorrowedFd<'_>, PollFlags)> {
        match self {
            Probe::Command { .. } => None,
            Probe::Tcp { sock, .. } => Some((sock.as_fd(), PollFlags::POLLOUT)),
            Probe::Http { sock, phase, .. } => Some((
                sock.as_fd(),
                match phase {
                    HttpPhase::Connecting | HttpPhase::Writing(..) => PollFlags::POLLOUT,
                    HttpPhase::Reading(_) => PollFlags::POLLIN,
                },
            )),
        }
    }

    /// Its fd is ready: goes on as far as it can without blocking.
    pub fn progress(&mut self) -> Outcome {
        match self {
            Probe::Command { .. } => None,
            Probe::Tcp { sock, addr } => connected(sock, *addr),
            Probe::Http {
                sock,
                addr,
                path,
                phase,
            } => loop {
                match phase {
                    HttpPhase::Connecting => match connected(sock, *addr)? {
                        Ok(()) => {
                            let req = format!(
                                "GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: supd\r\nConnection: close\r\n\r\n"
                            );
                            *phase = HttpPhase::Writing(req.into_bytes(), 0);
                        }
                        Err(why) => return Some(Err(why)),
                    },
                    HttpPhase::Writing(buf, off) => {
                        match nix::unistd::write(&*sock, &buf[*off..]) {
                            Ok(n) => {
                                *off += n;
                                if *off >= buf.len() {
                                    *phase = HttpPhase::Reading(Vec::new());
                                }
                            }
                            Err(Errno::EINTR) => {}
                            Err(Errno::EAGAIN) => return None,
                            Err(e) => {
                                return Some(Err(format!(
                                    "cannot send the request to {addr}: {}",
                                    e.desc()
                                )))
                            }
                        }
                    }
                    HttpPhase::Reading(got) => {
                        let mut buf = [0u8; 1024];
                        let room = (HTTP_READ_MAX - got.len()).min(buf.len());
                        match nix::unistd::read(&*sock, &mut buf[..room]) {
                            Ok(0) if got.is_empty() => {
                                return Some(Err(format!(
                                    "{addr}{path} closed the connection without an answer"
                                )))
                            }
                            Ok(0) => return Some(http_verdict(got, *addr, path)),
                            Ok(n) => {
                                got.extend_from_slice(&buf[..n]);
                                if got.contains(&b'\n') || got.len() >= HTTP_READ_MAX {
                                    return Some(http_verdict(got, *addr, path));
                                }
                            }
                            Err(Errno::EINTR) => {}
                            Err(Errno::EAGAIN) => return None,
                            Err(e) => {
                                return Some(Err(format!(
                                    "cannot read the answer of {addr}{path}: {}",
                                    e.desc()
                                )))
                            }
                        }
                    }
                }
            },
        }
    }

    /// Ends the run: a command's process group is killed (it is reaped by the loop),
    /// a socket closed.
    pub fn cancel(self) {
        if let Probe::Command { pid, .. } = self {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Health as `status` shows it and the lease rule reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthView {
    pub health: Health,
    /// When it last became unhealthy (Unix milliseconds).
    pub unhealthy_since_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_http_status_line_decides() {
        let a: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
        assert_eq!(http_verdict(b"HTTP/1.0 200 OK\r\n", a, "/healthz"), Ok(()));
        assert_eq!(http_verdict(b"HTTP/1.1 204 No Content\r\n", a, "/"), Ok(()));
        assert_eq!(
            http_verdict(b"HTTP/1.0 500 Internal Server Error\r\n", a, "/healthz"),
            Err("HTTP 500 from 127.0.0.1:8080/healthz".into())
        );
        assert_eq!(
            http_verdict(b"SSH-2.0-OpenSSH\r\n", a, "/"),
            Err("no HTTP status line from 127.0.0.1:8080/".into())
        );
        // A status is three digits: not a sign and two ("HTTP 20" was said), not four.
        for odd in [
            &b"HTTP/1.1 +20 X\r\n"[..],
            b"HTTP/1.1 2000 OK\r\n",
            b"HTTP/1.1 -99\r\n",
        ] {
            assert_eq!(
                http_verdict(odd, a, "/"),
                Err("no HTTP status line from 127.0.0.1:8080/".into()),
                "{}",
                String::from_utf8_lossy(odd)
            );
        }
    }

    #[test]
    fn a_refused_connect_is_a_failure_that_names_the_address() {
        // A port nobody listens on: bind one, note it, close it.
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        drop(l);
        let outcome = match Probe::begin_socket(&Check::Tcp(addr)) {
            Err(why) => Err(why),
            Ok(mut p) => {
                let (fd, flags) = p.poll_fd().expect("fd");
                let mut fds = [nix::poll::PollFd::new(fd, flags)];
                nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(5000u16)).expect("poll");
                p.progress().expect("done")
            }
        };
        let why = outcome.expect_err("refused");
        assert!(
            why.contains(&addr.to_string()) && why.contains("refused"),
            "{why}"
        );
    }

    /// A connect still under way is not a success, should its fd be looked at before it
    /// is ready (a stale poll token, a wake-up for another service): the port's accept
    /// queue is full, so the kernel drops the SYN and the connect stays under way.
    #[test]
    fn a_connect_still_under_way_is_not_taken_for_a_success() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        // std listens with a backlog of 128: fill the queue of a listener of backlog 0.
        let sock = socket::socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .expect("socket");
        drop(l);
        socket::setsockopt(&sock, sockopt::ReuseAddr, &true).expect("reuse");
        socket::bind(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            &socket::SockaddrIn::from(match addr {
                SocketAddr::V4(a) => a,
                SocketAddr::V6(_) => unreachable!("bound v4"),
            }),
        )
        .expect("bind again");
        socket::listen(&sock, socket::Backlog::new(0).expect("backlog")).expect("listen");
        let _fill: Vec<_> = (0..3)
            .filter_map(|_| {
                std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(200))
                    .ok()
            })
            .collect();
        for check in [
            Check::Tcp(addr),
            Check::Http {
                addr,
                path: "/".into(),
            },
        ] {
            let mut p = Probe::begin_socket(&check).expect("under way");
            assert_eq!(p.progress(), None, "{check:?}: not connected yet");
        }
    }
}
