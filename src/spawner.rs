//! The spawner: a small process that forks services (and checks, and helpers) for supd.
//!
//! A fork copies the page tables and the fd table of the process that forks, and the
//! child's exec tears the copy down again: supd's grow with its services (about 60 MiB
//! and thousands of fds at 10,000 services), so a fork by supd costs in proportion to the
//! number of services. The spawner is supd's own image run afresh (`/proc/self/exe
//! --spawner`): it holds two sockets and a few MiB whatever supd holds, so its forks cost
//! the same at 10 services or 10,000.
//!
//! supd sends it a child's whole plan (`sys::plan`'s message: program, arguments,
//! environment, user, limits, the fds to give it, and the go-ahead and report pipes of
//! [`spawn_service`]) and gets back a pid. The spawner forks with `CLONE_PARENT`, so
//! the child is supd's own (forked into its cgroup, or moving itself in), and supd records it,
//! releases it and reaps it exactly as one it forked itself. Nothing else changes for
//! the child.
//!
//! Two sockets: on the first (fd 3) supd asks and waits for the answer (checks and
//! helpers: [`fork`]); on the queue, which the spawner makes and hands over with its
//! hello, supd asks for services' children without waiting ([`ask`]) and reads the
//! answers in its loop ([`answers`]). A fork can wait tens of milliseconds behind other
//! processes' cgroup moves (the kernel's lock of every process's cgroup); in the loop,
//! that wait no longer holds up clients, signals and exits. The spawner serves the
//! first socket before the queue, so a waiting supd waits for one fork at most besides
//! its own.
//!
//! If the spawner cannot be started, is gone, or gives no answer for two seconds, supd
//! forks children itself (what it asked for and got no answer to is asked again, of
//! supd's own fork), and starts a new spawner on a later spawn (after a second,
//! doubling up to a minute while it keeps failing).

use crate::sys::{self, child::Prepared, Exec, Pending, SpawnSpec};
use crate::time::Mono;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    recv, recvmsg, send, sendmsg, setsockopt, socketpair, sockopt, AddressFamily, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType,
};
use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The argument that runs supd's image as the spawner.
pub const ARG: &str = "--spawner";

/// What the spawner says first: its protocol, which must be supd's.
/// The most fds one request carries (the kernel passes at most 253 in a message).
const MAX_FDS: usize = 250;

const HELLO: &[u8] = b"sup-spawner 6";

/// The largest request: a plan with a large environment still fits.
const MAX_REQUEST: usize = 1 << 20;

/// How long supd waits for an answer before it takes the spawner for hung: for the
/// answer to its call, or for any answer while the queue holds requests.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// [`ANSWER_WITHIN`], or for tests `SUP_SPAWNER_ANSWER_MS` (as `SUP_HANDSHAKE_DEADLINE_MS`,
/// nobody sets it in production): a test that freezes the spawner and acts meanwhile
/// needs more than 2 s on a loaded machine.
fn answer_within() -> Duration {
    static D: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *D.get_or_init(|| {
        std::env::var("SUP_SPAWNER_ANSWER_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            // 0 would be a socket timeout of none at all: not a bound.
            .filter(|ms: &u64| *ms > 0)
            .map_or(ANSWER_WITHIN, Duration::from_millis)
    })
}

/// Requests on the queue at most: a burst of starts waits in supd beyond it (where a
/// stop or a reload can still change its mind) rather than in the socket.
const QUEUE_MAX: usize = 64;

/// Restarts of a spawner that failed: the first after a second, doubling up to a minute.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(60);

/// A request on the queue, named by the number supd gave it.
pub type Ticket = u64;

/// supd's link to its spawner.
struct Link {
    sock: OwnedFd,
    /// Shared with the loop's poll, which holds it for as long as it polls.
    queue: Arc<OwnedFd>,
    pid: i32,
    /// Signals it exactly (it is supd's child, but may have been reaped meanwhile).
    pidfd: Option<OwnedFd>,
    start_time: u64,
    /// The queue's requests not answered yet, oldest first.
    waiting: VecDeque<Ticket>,
    /// When the queue last moved (an answer, or a request on an empty queue): no answer
    /// for `ANSWER_WITHIN` after it, and the spawner is taken for hung.
    moved: Mono,
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

struct Spawner {
    state: State,
    next: Ticket,
    /// Requests of a spawner that went away before it answered them.
    lost: Vec<Ticket>,
}

static SPAWNER: Mutex<Spawner> = Mutex::new(Spawner {
    state: State::Unstarted,
    next: 1,
    lost: Vec::new(),
});

fn lock() -> std::sync::MutexGuard<'static, Spawner> {
    SPAWNER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Forks a child through the spawner and waits for its pid: `Some(Ok(pid))`, or
/// `Some(Err(_))` when the spawner's fork failed (as supd's own would); `None` when
/// there is no spawner to ask (supd then forks the child itself).
pub fn fork(msg: &[u8], fds: &[RawFd]) -> Option<io::Result<i32>> {
    let mut s = lock();
    let now = Mono::now();
    let link = s.up(now)?;
    match call(link, msg, fds) {
        Ok(n) if n > 0 => Some(Ok(n as i32)),
        Ok(n) => Some(Err(io::Error::from_raw_os_error(-n as i32))),
        // Too big for one message: this child is forked by supd; the spawner is fine.
        Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => None,
        Err(e) => {
            s.down(&format!("did not answer: {e}"), now);
            None
        }
    }
}

/// Forks and execs `spec` with nothing to do in between, and waits for the exec
/// (helpers: copies, deletes; programs of supd's own on local disks).
pub fn spawn(spec: SpawnSpec) -> Result<i32, String> {
    let (pid, exec) = spawn_service(spec, |_| Ok(()))?;
    sys::child::wait_exec(pid, exec)
}

/// Forks `spec` (through the spawner, a small process whose fork copies little; by supd
/// itself when there is none); the child gets its own session and process group, then
/// waits until `admit(pid)` has run in supd (it writes the pid record), and only then
/// clears its signal mask, takes its fds, looks up its user, drops root, enters its
/// directory as its user and execs. So a service's program never runs before it is
/// recorded: if supd dies before `admit` is done, the child reads end-of-file instead
/// of the go-ahead and exits without running anything. An `Err` from `admit` ends the
/// child the same way. Returns at once after the go-ahead, with the pid and the `Exec`
/// whose report says how the exec went: nothing the child does after its release (a
/// user database or a file system that hangs) can stall supd.
pub fn spawn_service(
    spec: SpawnSpec,
    admit: impl FnOnce(i32) -> Result<(), String>,
) -> Result<(i32, Exec), String> {
    let prepared = Prepared::new(spec)?;
    let (msg, fds) = prepared.message();
    let (pid, pending) = match fork(&msg, &fds) {
        Some(Ok(pid)) => (pid, prepared.pending()),
        Some(Err(e)) => return Err(format!("fork: {e}")),
        None => prepared.fork_here()?,
    };
    Ok((pid, pending.release_or_reap(pid, admit)?))
}

/// A service's child as [`begin_service`] left it.
pub enum Begun {
    /// Forked by supd itself (there is no spawner): release it now.
    Forked(i32, Pending),
    /// Asked of the spawner: its pid comes with the ticket's answer.
    Asked(Ticket, Pending),
}

/// Starts `spec` as [`spawn_service`] does, but without waiting for the spawner's fork:
/// the child is released with [`Pending::release`] once its pid is known (dropped
/// instead, it exits without running anything).
pub fn begin_service(spec: SpawnSpec) -> Result<Begun, String> {
    let prepared = Prepared::new(spec)?;
    let (msg, fds) = prepared.message();
    if fds.len() > MAX_FDS {
        // More than one request carries (a large fd store): supd forks it itself.
        let (pid, pending) = prepared.fork_here()?;
        return Ok(Begun::Forked(pid, pending));
    }
    match ask(&msg, &fds) {
        Asked::Queued(ticket) => Ok(Begun::Asked(ticket, prepared.pending())),
        Asked::NoSpawner => {
            let (pid, pending) = prepared.fork_here()?;
            Ok(Begun::Forked(pid, pending))
        }
    }
}

/// What [`ask`] did.
pub enum Asked {
    /// On the queue: its answer comes through [`answers`].
    Queued(Ticket),
    /// No spawner to ask: supd forks the child itself.
    NoSpawner,
}

/// Whether the queue has room for another request (or there is no queue: supd forks).
pub fn room() -> bool {
    match &lock().state {
        State::Up(l) => l.waiting.len() < QUEUE_MAX,
        _ => true,
    }
}

/// Asks for a child without waiting for its pid.
pub fn ask(msg: &[u8], fds: &[RawFd]) -> Asked {
    let mut s = lock();
    let now = Mono::now();
    let ticket = s.next;
    let Some(link) = s.up(now) else {
        return Asked::NoSpawner;
    };
    let head = ticket.to_ne_bytes();
    let rights = [ControlMessage::ScmRights(fds)];
    // Blocking, with the socket's timeout: `QUEUE_MAX` requests fit in its buffer but
    // for huge environments.
    let sent = sendmsg::<()>(
        link.queue.as_raw_fd(),
        &[IoSlice::new(&head), IoSlice::new(msg)],
        &rights,
        MsgFlags::MSG_NOSIGNAL,
        None,
    );
    match sent {
        Ok(_) => {
            if link.waiting.is_empty() {
                link.moved = now;
            }
            link.waiting.push_back(ticket);
            s.next += 1;
            Asked::Queued(ticket)
        }
        Err(nix::errno::Errno::EMSGSIZE) => Asked::NoSpawner,
        Err(e) => {
            s.down(&format!("does not take requests: {e}"), now);
            Asked::NoSpawner
        }
    }
}

/// The queue while it has requests to answer (for the loop's poll).
pub fn queue() -> Option<Arc<OwnedFd>> {
    match &lock().state {
        State::Up(l) if !l.waiting.is_empty() => Some(l.queue.clone()),
        _ => None,
    }
}

/// When [`answers`] must be called without the queue being readable: at once when
/// requests were lost, else when a spawner with requests is taken for hung.
pub fn deadline() -> Option<Mono> {
    let s = lock();
    if !s.lost.is_empty() {
        return Some(Mono(0));
    }
    match &s.state {
        State::Up(l) if !l.waiting.is_empty() => Some(l.moved.plus(answer_within())),
        _ => None,
    }
}

/// The queue's answers so far, without waiting: for each ticket the child's pid, the
/// spawner's fork's error, or `None` when the spawner went away (or hung) before it
/// answered (supd forks that child itself, if it still wants it).
pub fn answers(now: Mono) -> Vec<(Ticket, Option<io::Result<i32>>)> {
    let mut s = lock();
    let mut got = Vec::new();
    if let State::Up(link) = &mut s.state {
        let mut gone = None;
        while !link.waiting.is_empty() {
            let mut answer = [0u8; 16];
            match recv(link.queue.as_raw_fd(), &mut answer, MsgFlags::MSG_DONTWAIT) {
                Ok(16) => {
                    let (t, n) = answer.split_at(8);
                    let ticket = Ticket::from_ne_bytes(t.try_into().unwrap_or_default());
                    let n = i64::from_ne_bytes(n.try_into().unwrap_or_default());
                    link.waiting.retain(|w| *w != ticket);
                    link.moved = now;
                    got.push((
                        ticket,
                        Some(match n {
                            n if n > 0 => Ok(n as i32),
                            n => Err(io::Error::from_raw_os_error(-n as i32)),
                        }),
                    ));
                }
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                // Gone (with requests unread, the kernel says ECONNRESET).
                Ok(_) | Err(nix::errno::Errno::ECONNRESET) => {
                    gone = Some("closed its queue".to_string());
                    break;
                }
                Err(e) => {
                    gone = Some(format!("cannot be read: {e}"));
                    break;
                }
            }
        }
        if gone.is_none() && !link.waiting.is_empty() && now >= link.moved.plus(answer_within()) {
            gone = Some(format!(
                "did not answer within {}",
                crate::time::Human(answer_within())
            ));
        }
        if let Some(why) = gone {
            s.down(&why, now);
        }
    }
    got.extend(s.lost.drain(..).map(|t| (t, None)));
    got
}

/// The spawner's pid, if one runs.
pub fn pid() -> Option<i32> {
    match &lock().state {
        State::Up(l) => Some(l.pid),
        _ => None,
    }
}

impl Spawner {
    /// The link, started if need be; `None`: supd forks itself for now.
    fn up(&mut self, now: Mono) -> Option<&mut Link> {
        let delay = match &self.state {
            State::Off => return None,
            State::Down { retry, .. } if now < *retry => return None,
            State::Down { delay, .. } => Some(*delay),
            State::Unstarted => None,
            State::Up(_) => Some(Duration::ZERO),
        };
        if !matches!(self.state, State::Up(_)) {
            if std::env::var_os("SUP_SPAWNER").is_some_and(|v| v == "off") {
                self.state = State::Off;
                return None;
            }
            match start(now) {
                Ok(link) => {
                    match delay {
                        Some(_) => log::info!("the spawner runs again (pid {})", link.pid),
                        None => log::debug!("spawner started: pid {}", link.pid),
                    }
                    self.state = State::Up(link);
                }
                Err(why) => {
                    let delay =
                        delay.map_or(RETRY_FIRST, |d| (d * 2).clamp(RETRY_FIRST, RETRY_MAX));
                    log::warn!(
                        "cannot start the spawner: {why}; supd forks services itself (trying again in {})",
                        crate::time::Human(delay)
                    );
                    self.state = State::Down {
                        retry: now.plus(delay),
                        delay,
                    };
                    return None;
                }
            }
        }
        match &mut self.state {
            State::Up(link) => Some(link),
            _ => None,
        }
    }

    /// The spawner failed (`why`): it is ended, what it did not answer is lost, and
    /// supd forks itself until a new one is tried, after a second.
    fn down(&mut self, why: &str, now: Mono) {
        if let State::Up(link) = &mut self.state {
            log::warn!(
                "the spawner (pid {}) {why}; supd forks services itself for now",
                link.pid
            );
            end(link);
            self.lost.extend(link.waiting.drain(..));
        }
        self.state = State::Down {
            retry: now.plus(RETRY_FIRST),
            delay: RETRY_FIRST,
        };
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
    kill(link.pidfd.as_ref(), link.pid, link.start_time);
}

fn kill(pidfd: Option<&OwnedFd>, pid: i32, start_time: u64) {
    let sig = nix::sys::signal::Signal::SIGKILL;
    let sent = pidfd.is_some_and(|fd| sys::pidfd_send_signal(fd, sig as i32).is_ok());
    if !sent {
        crate::proc::kill_if_same(pid, start_time, sig);
    }
}

/// Both sockets time out: a hung spawner never holds supd longer than that.
fn time_out(sock: &OwnedFd) -> Result<(), String> {
    let within = nix::sys::time::TimeVal::new(
        answer_within().as_secs() as _,
        answer_within().subsec_micros() as _,
    );
    setsockopt(sock, sockopt::ReceiveTimeout, &within).map_err(|e| format!("setsockopt: {e}"))?;
    setsockopt(sock, sockopt::SendTimeout, &within).map_err(|e| format!("setsockopt: {e}"))?;
    // Room for a large plan in one message (root may pass the system's maximum).
    if setsockopt(sock, sockopt::SndBufForce, &MAX_REQUEST).is_err() {
        let _ = setsockopt(sock, sockopt::SndBuf, &MAX_REQUEST);
    }
    Ok(())
}

/// Starts a spawner: supd's own image (even when its file was replaced, so it speaks
/// this protocol), its socket on fd 3, and waits for its hello, which brings the queue.
fn start(now: Mono) -> Result<Link, String> {
    let (sock, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| format!("socketpair: {e}"))?;
    time_out(&sock)?;
    let exe = std::path::Path::new("/proc/self/exe");
    if !exe.exists() {
        return Err("/proc/self/exe is missing (no /proc yet)".into());
    }
    // It dies with supd (it has nothing to do without it).
    let spec = SpawnSpec {
        dies_with_supd: true,
        ..SpawnSpec::own_helper(exe, vec![ARG.into()], theirs.as_raw_fd())
    };
    let pid = sys::spawn_direct(spec)?;
    drop(theirs);
    // Its children inherit its nice value, which stays while supd's changes.
    sys::note_spawner_nice(pid);
    let pidfd = sys::pidfd_open(pid).ok();
    let start_time = crate::proc::stat(pid).map(|s| s.start_time).unwrap_or(0);
    let fail = |why: String| {
        kill(pidfd.as_ref(), pid, start_time);
        Err(why)
    };
    let mut hello = [0u8; 64];
    let (n, mut fds) = match receive(sock.as_raw_fd(), &mut hello) {
        Ok(Some((n, fds, false))) => (n, fds),
        Ok(_) => return fail("no hello".into()),
        Err(e) => return fail(format!("no hello: {e}")),
    };
    if hello[..n] != *HELLO {
        return fail(format!(
            "it said {:?}, not {:?}",
            String::from_utf8_lossy(&hello[..n]),
            String::from_utf8_lossy(HELLO)
        ));
    }
    let Some(queue) = fds.pop().filter(|_| fds.is_empty()) else {
        return fail("its hello brought no queue".into());
    };
    if let Err(why) = time_out(&queue) {
        return fail(why);
    }
    Ok(Link {
        sock,
        queue: Arc::new(queue),
        pid,
        pidfd,
        start_time,
        waiting: VecDeque::new(),
        moved: now,
    })
}

/// The spawner's life: says hello (handing over the queue), then forks what supd asks
/// until supd closes either socket (supd exited, or re-executed: its ends are
/// close-on-exec). Returns its exit status.
pub fn serve() -> u8 {
    sys::probe_kernel();
    let sock = match sys::adopt_fd(3) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("supd {ARG}: no socket on fd 3: {e}");
            return 2;
        }
    };
    let (queue, theirs) = match socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    ) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("supd {ARG}: socketpair: {e}");
            return 1;
        }
    };
    let rights = [theirs.as_raw_fd()];
    if let Err(e) = sendmsg::<()>(
        sock.as_raw_fd(),
        &[IoSlice::new(HELLO)],
        &[ControlMessage::ScmRights(&rights)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    ) {
        eprintln!("supd {ARG}: {e}");
        return 1;
    }
    drop(theirs);
    let own = [sock.as_raw_fd(), queue.as_raw_fd()];
    let mut buf = vec![0u8; MAX_REQUEST];
    loop {
        let mut fds = [
            PollFd::new(sock.as_fd(), PollFlags::POLLIN),
            PollFd::new(queue.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                eprintln!("supd {ARG}: poll: {e}");
                return 1;
            }
        }
        let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
        // The waiting supd first.
        let from = match (ready(&fds[0]), ready(&fds[1])) {
            (true, _) => 0,
            (false, true) => 1,
            (false, false) => continue,
        };
        match serve_one(own[from], from == 1, &mut buf, &own) {
            Ok(true) => {}
            Ok(false) => return 0,
            Err(code) => return code,
        }
    }
}

/// Serves one request on `fd` (its answer led by its ticket on the queue): `Ok(false)`
/// when supd closed the socket.
fn serve_one(fd: RawFd, queued: bool, buf: &mut [u8], own: &[RawFd]) -> Result<bool, u8> {
    let (n, fds, truncated) = match receive(fd, buf) {
        Ok(Some(r)) => r,
        Ok(None) => return Ok(false),
        Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => return Ok(true),
        Err(e) => {
            eprintln!("supd {ARG}: {e}");
            return Err(1);
        }
    };
    let (ticket, plan) = match queued {
        true if n < 8 => return Ok(true),
        true => buf[..n].split_at(8),
        false => (&[][..], &buf[..n]),
    };
    let result = if truncated {
        -i64::from(libc::EMSGSIZE)
    } else {
        match sys::fork_for_supd(plan, fds, own) {
            Ok(pid) => i64::from(pid),
            Err(e) => -i64::from(e.raw_os_error().unwrap_or(libc::EINVAL)),
        }
    };
    let mut answer = ticket.to_vec();
    answer.extend_from_slice(&result.to_ne_bytes());
    match send(fd, &answer, MsgFlags::MSG_NOSIGNAL) {
        Ok(_) => Ok(true),
        Err(_) => Err(1),
    }
}

/// One request: its length, its fds, and whether it was cut short; `None` at the end.
fn receive(fd: RawFd, buf: &mut [u8]) -> nix::Result<Option<(usize, Vec<OwnedFd>, bool)>> {
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(fd, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            fds.extend(raw.into_iter().filter_map(|r| sys::adopt_fd(r).ok()));
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
