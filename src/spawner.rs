//! The spawner: a small process that forks services (and checks, and helpers) for supd.
//!
//! A fork copies the page tables and the fd table of the process that forks, and the
//! child's exec tears the copy down again: supd's grow with its services (about 60 MiB
//! and thousands of fds at 10,000 services), so a fork by supd costs in proportion to the
//! number of services. The spawner is supd's own image run afresh (`/proc/self/exe
//! --spawner`): it holds one socket and a few MiB whatever supd holds, so its forks cost
//! the same at 10 services or 10,000.
//!
//! supd sends it a child's whole plan (`sys::plan_message`: program, arguments,
//! environment, user, limits, the fds to give it, and the go-ahead and report pipes of
//! `sys::spawn_service`) and gets back a pid. The spawner forks with `CLONE_PARENT`, so
//! the child is supd's own: it moves itself into its cgroup, and supd records it,
//! releases it and reaps it exactly as one it forked itself. Nothing else changes for
//! the child.
//!
//! If the spawner cannot be started, is gone, or does not answer within two seconds,
//! supd forks the child itself, and starts a new spawner on a later spawn (after a
//! second, doubling up to a minute while it keeps failing).

use crate::time::Mono;
use nix::sys::socket::{
    recv, recvmsg, send, sendmsg, setsockopt, socketpair, sockopt, AddressFamily, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType,
};
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::time::Duration;

/// The argument that runs supd's image as the spawner.
pub const ARG: &str = "--spawner";

/// What the spawner says first: its protocol, which must be supd's.
const HELLO: &[u8] = b"sup-spawner 1";

/// The largest request: a plan with a large environment still fits.
const MAX_REQUEST: usize = 1 << 20;

/// How long supd waits for the spawner's answer before it forks the child itself.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// Restarts of a spawner that failed: the first after a second, doubling up to a minute.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// supd's link to its spawner.
struct Link {
    sock: OwnedFd,
    pid: i32,
    /// Signals it exactly (it is supd's child, but may have been reaped meanwhile).
    pidfd: Option<OwnedFd>,
    start_time: u64,
}

enum State {
    /// Not started yet (started at the first spawn).
    Unstarted,
    Up(Link),
    /// Failed: not tried again before `retry`.
    Down {
        retry: Mono,
        delay: Duration,
    },
    /// Turned off (tests, `SUP_SPAWNER=off`).
    Off,
}

static STATE: Mutex<State> = Mutex::new(State::Unstarted);

/// Forks a child through the spawner: `Some(Ok(pid))`, or `Some(Err(_))` when the
/// spawner's fork failed (as supd's own would); `None` when there is no spawner to ask
/// (supd then forks the child itself).
pub fn fork(msg: &[u8], fds: &[RawFd]) -> Option<io::Result<i32>> {
    let mut state = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let now = Mono::now();
    let delay = match &*state {
        State::Off => return None,
        State::Down { retry, .. } if now < *retry => return None,
        State::Down { delay, .. } => Some(*delay),
        State::Unstarted => None,
        State::Up(_) => Some(Duration::ZERO),
    };
    if !matches!(*state, State::Up(_)) {
        if std::env::var_os("SUP_SPAWNER").is_some_and(|v| v == "off") {
            *state = State::Off;
            return None;
        }
        match start() {
            Ok(link) => {
                match delay {
                    Some(_) => log::info!("the spawner runs again (pid {})", link.pid),
                    None => log::debug!("spawner started: pid {}", link.pid),
                }
                *state = State::Up(link);
            }
            Err(why) => {
                let delay = delay.map_or(RETRY_FIRST, |d| (d * 2).clamp(RETRY_FIRST, RETRY_MAX));
                log::warn!(
                    "cannot start the spawner: {why}; supd forks services itself (trying again in {})",
                    crate::time::Human(delay)
                );
                *state = State::Down {
                    retry: now.plus(delay),
                    delay,
                };
                return None;
            }
        }
    }
    let State::Up(link) = &*state else {
        return None;
    };
    match call(link, msg, fds) {
        Ok(n) if n > 0 => Some(Ok(n as i32)),
        Ok(n) => Some(Err(io::Error::from_raw_os_error(-n as i32))),
        // Too big for one message: this child is forked by supd; the spawner is fine.
        Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => None,
        Err(e) => {
            log::warn!(
                "the spawner (pid {}) did not answer: {e}; supd forks services itself for now",
                link.pid
            );
            end(link);
            *state = State::Down {
                retry: now.plus(RETRY_FIRST),
                delay: RETRY_FIRST,
            };
            None
        }
    }
}

/// The spawner's pid, if one runs.
pub fn pid() -> Option<i32> {
    match &*STATE.lock().unwrap_or_else(|e| e.into_inner()) {
        State::Up(l) => Some(l.pid),
        _ => None,
    }
}

/// One request and its answer: a pid, or minus the errno of the spawner's fork.
fn call(link: &Link, msg: &[u8], fds: &[RawFd]) -> io::Result<i64> {
    let rights = [ControlMessage::ScmRights(fds)];
    sendmsg::<()>(
        link.sock.as_raw_fd(),
        &[IoSlice::new(msg)],
        &rights,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )?;
    let mut answer = [0u8; 8];
    let n = loop {
        match recv(link.sock.as_raw_fd(), &mut answer, MsgFlags::empty()) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other?,
        }
    };
    if n != answer.len() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "it closed its socket",
        ));
    }
    Ok(i64::from_ne_bytes(answer))
}

/// Ends a spawner that no longer answers (through its pidfd, or by pid while its start
/// time is still the one recorded: it may have been reaped and its pid reused).
fn end(link: &Link) {
    let sig = nix::sys::signal::Signal::SIGKILL;
    let sent = link
        .pidfd
        .as_ref()
        .is_some_and(|fd| crate::sys::pidfd_send_signal(fd, sig as i32).is_ok());
    if !sent {
        crate::proc::kill_if_same(link.pid, link.start_time, sig);
    }
}

/// Starts a spawner: supd's own image (even when its file was replaced, so it speaks
/// this protocol), its socket on fd 3, and waits for its hello.
fn start() -> Result<Link, String> {
    let (sock, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| format!("socketpair: {e}"))?;
    let within = nix::sys::time::TimeVal::new(ANSWER_WITHIN.as_secs() as _, 0);
    setsockopt(&sock, sockopt::ReceiveTimeout, &within).map_err(|e| format!("setsockopt: {e}"))?;
    setsockopt(&sock, sockopt::SendTimeout, &within).map_err(|e| format!("setsockopt: {e}"))?;
    // Room for a large plan in one message (root may pass the system's maximum).
    if setsockopt(&sock, sockopt::SndBufForce, &MAX_REQUEST).is_err() {
        let _ = setsockopt(&sock, sockopt::SndBuf, &MAX_REQUEST);
    }
    let exe = std::path::Path::new("/proc/self/exe");
    if !exe.exists() {
        return Err("/proc/self/exe is missing (no /proc yet)".into());
    }
    // It dies with supd (it has nothing to do without it).
    let spec = crate::sys::SpawnSpec {
        dies_with_supd: true,
        ..crate::sys::SpawnSpec::own_helper(exe, vec![ARG.into()], theirs.as_raw_fd())
    };
    let pid = crate::sys::spawn_direct(spec)?;
    drop(theirs);
    let link = Link {
        sock,
        pid,
        pidfd: crate::sys::pidfd_open(pid).ok(),
        start_time: crate::proc::stat(pid).map(|s| s.start_time).unwrap_or(0),
    };
    let mut hello = [0u8; 64];
    match recv(link.sock.as_raw_fd(), &mut hello, MsgFlags::empty()) {
        Ok(n) if hello[..n] == *HELLO => Ok(link),
        Ok(n) => {
            end(&link);
            Err(format!(
                "it said {:?}, not {:?}",
                String::from_utf8_lossy(&hello[..n]),
                String::from_utf8_lossy(HELLO)
            ))
        }
        Err(e) => {
            end(&link);
            Err(format!("no hello: {e}"))
        }
    }
}

/// The spawner's life: says hello, then forks what supd asks until supd closes the
/// socket (supd exited, or re-executed: its end is close-on-exec). Returns its exit
/// status.
pub fn serve() -> u8 {
    crate::sys::probe_kernel();
    let sock = match crate::sys::adopt_fd(3) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("supd {ARG}: no socket on fd 3: {e}");
            return 2;
        }
    };
    let fd = sock.as_raw_fd();
    if let Err(e) = send(fd, HELLO, MsgFlags::MSG_NOSIGNAL) {
        eprintln!("supd {ARG}: {e}");
        return 1;
    }
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        let (n, fds, truncated) = match receive(fd, &mut buf) {
            Ok(Some(r)) => r,
            Ok(None) => return 0,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                eprintln!("supd {ARG}: {e}");
                return 1;
            }
        };
        let answer = if truncated {
            -i64::from(libc::EMSGSIZE)
        } else {
            match crate::sys::fork_for_supd(&buf[..n], fds, fd) {
                Ok(pid) => i64::from(pid),
                Err(e) => -i64::from(e.raw_os_error().unwrap_or(libc::EINVAL)),
            }
        };
        if send(fd, &answer.to_ne_bytes(), MsgFlags::MSG_NOSIGNAL).is_err() {
            return 1;
        }
    }
}

/// One request: its length, its fds, and whether it was cut short; `None` at the end.
fn receive(fd: RawFd, buf: &mut [u8]) -> nix::Result<Option<(usize, Vec<OwnedFd>, bool)>> {
    let mut space = nix::cmsg_space!([RawFd; 16]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(fd, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            fds.extend(raw.into_iter().filter_map(|r| crate::sys::adopt_fd(r).ok()));
        }
    }
    let truncated = msg
        .flags
        .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
    if msg.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    Ok(Some((msg.bytes, fds, truncated)))
}
