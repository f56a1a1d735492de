//! The runners of health checks, in the loop and never blocking: a TCP connect and an
//! HTTP GET over non-blocking sockets polled by the loop, and a command forked like a
//! service (its user looked up in the child), reaped by the loop's child handling. And
//! the supervisor's side: starting and ending checks with their service, their timers,
//! the verdicts.

use super::{Change, CheckState, Health};
use crate::config::{Check, Ready};
use crate::records::PidFile;
use crate::service::{Event, Exit, State};
use crate::supervisor::{unix_ms, Supervisor};
use crate::sys::{self, Io, SpawnSpec};
use crate::time::Mono;
use nix::errno::Errno;
use nix::poll::PollFlags;
use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockType};
use serde_json::json;
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
    fn begin_socket(check: &Check) -> Result<Probe, String> {
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

impl Supervisor {
    /// The health of a service with a `health` check or a `watchdog`, and when it last
    /// became unhealthy; `None` for an unknown service or one with neither. For the
    /// lease rule: a leader-only service that is unhealthy makes its node ineligible.
    pub fn health_of(&self, name: &str) -> Option<HealthView> {
        let s = self.slots.get(name)?;
        (s.cfg.health.is_some() || s.cfg.watchdog.is_some()).then_some(HealthView {
            health: s.check.health,
            unhealthy_since_ms: s.check.unhealthy_since_ms,
        })
    }

    /// Starts the checks and watchdog of services that have just started, ends those of
    /// services that are no longer up. Runs at each settle, over the slots touched this
    /// turn: a service's run begins and ends only through a change to its slot.
    pub fn sync_health(&mut self, now: Mono) {
        let mut ended = Vec::new();
        let touched: Vec<String> = self.slots.touched().iter().cloned().collect();
        for name in touched {
            let Some(slot) = self.slots.get_mut(&name) else {
                continue;
            };
            // A reload may have taken the check away from a service being restarted.
            let checked = slot.cfg.health.is_some() || slot.cfg.watchdog.is_some();
            let up = matches!(slot.svc.state, State::Starting | State::Running);
            let pid = slot.svc.pid.filter(|_| up && checked);
            if pid == slot.health_pid {
                continue;
            }
            if let Some(p) = slot.probe.take() {
                // The run ends with the service's: what it started too (a supd that
                // exits next would not see it reaped).
                if let (Probe::Command { .. }, Some(c)) = (&p, self.cgroups.as_ref()) {
                    crate::cgroup::kill(&c.check_dir(&slot.cfg.name));
                }
                p.cancel();
            }
            slot.health_pid = pid;
            match pid {
                Some(_) => {
                    match &slot.cfg.health {
                        Some(h) => slot.check.start(h, now),
                        // A watchdog alone: unknown until the first ping of this run.
                        None => slot.check.health = Health::Unknown,
                    }
                    if let Some(d) = slot.cfg.watchdog {
                        slot.watchdog.start(d, now);
                    }
                }
                None => {
                    slot.check.stop();
                    slot.watchdog.stop();
                    ended.push(slot.cfg.name.clone());
                }
            }
        }
        for name in ended {
            log::debug!("{name}: its health checks end with its run");
        }
    }

    /// Fires what is due: watchdogs missed, runs timed out, runs to start.
    pub fn fire_health(&mut self, now: Mono) {
        self.sync_health(now);
        let due: Vec<String> = (self.timers.due(now).into_iter())
            .filter(|n| {
                self.slots.get(n).is_some_and(|s| {
                    s.health_pid.is_some()
                        && [s.check.deadline(), s.watchdog.deadline]
                            .into_iter()
                            .flatten()
                            .any(|d| d <= now)
                })
            })
            .collect();
        for name in due {
            let Some(slot) = self.slots.get_mut(&name) else {
                continue;
            };
            match slot.cfg.watchdog {
                Some(d) => {
                    if let Some(why) = slot.watchdog.expired(d, now) {
                        self.watchdog_failed(&name, why, now);
                        continue;
                    }
                }
                None => slot.watchdog.stop(),
            }
            let Some(h) = slot.cfg.health.clone() else {
                slot.check.stop();
                continue;
            };
            if slot.check.timed_out(now) {
                if let Some(p) = slot.probe.take() {
                    p.cancel();
                }
                self.check_done(&name, Err(CheckState::timeout_reason(&h)), now);
                continue;
            }
            if slot.check.due(now) {
                slot.check.begin(&h, now);
                let probe = match &h.check {
                    Check::Command(argv) => self.spawn_check(&name, argv),
                    other => Probe::begin_socket(other),
                };
                match probe {
                    Ok(p) => {
                        if let Some(slot) = self.slots.get_mut(&name) {
                            slot.probe = Some(p);
                        }
                    }
                    Err(why) => self.check_done(&name, Err(why), now),
                }
            }
        }
    }

    /// Forks a check command like the service: its user, cwd, env and tool version, a
    /// process group of its own; its output goes nowhere.
    fn spawn_check(&mut self, name: &str, argv: &[String]) -> Result<Probe, String> {
        let slot = self.slots.get(name).ok_or("gone")?;
        let mut cfg = slot.cfg.clone();
        cfg.command = argv.to_vec();
        cfg.ready = Ready::Started;
        let plan = crate::launch::resolve(&cfg, &self.cfg.supd, None).map_err(|e| match e {
            crate::launch::NotLaunched::NoVersion(w) | crate::launch::NotLaunched::Failed(w) => {
                format!("check command: cannot start: {w}")
            }
        })?;
        let mut program = plan.program;
        // The version the service runs, should `current` have moved since its start.
        if let (Some(tool), Some(v), Some(a0)) = (&cfg.tool, &slot.version, argv.first()) {
            if !a0.starts_with('/') && plan.version.as_ref() != Some(v) {
                program = self
                    .cfg
                    .supd
                    .tools_dir
                    .join(tool)
                    .join(v)
                    .join(a0)
                    .to_string_lossy()
                    .into_owned();
            }
        }
        let spec = SpawnSpec {
            program,
            args: plan.args,
            env: plan.env,
            cwd: plan.cwd,
            stdout: Io::Null,
            stderr: Io::Null,
            creds: plan.creds,
            ready_fd: None,
            give: Vec::new(),
            tuning: plan.tuning,
            own_pid_env: None,
            dies_with_supd: true,
            join: None,
        };
        // Recorded before its program runs, as a service is: the command dies with a
        // killed supd, but what it started would stay; the record lets the next supd
        // end its process group. A record that cannot be written is said, and the check
        // runs all the same: it is no service (nothing runs twice), and failing it
        // would restart a healthy service over a state_dir problem.
        let state_dir = self.cfg.supd.state_dir.clone();
        let slot = self.slots.get_mut(name).ok_or("gone")?;
        if slot.check_file.as_ref().is_some_and(|f| !f.is_current()) {
            slot.check_file = None;
        }
        if slot.check_file.is_none() {
            match PidFile::open_check(&state_dir, name) {
                Ok(f) => slot.check_file = Some(f),
                Err(e) => log::warn!(
                    "{name}: cannot open the pid record of its check in {}: {e}; it runs unrecorded",
                    state_dir.display()
                ),
            }
        }
        let record = slot.check_file.as_ref();
        // Where supd has cgroups, a cgroup holds what the check starts, even a daemon.
        // The command moves itself in (`SpawnSpec::join`); a refused move is said when
        // its report is read.
        let join = self.cgroups.as_ref().and_then(|c| {
            let dir = c.check_dir(name);
            match crate::cgroup::prepare(&dir).and_then(|()| crate::cgroup::procs_file(&dir)) {
                Ok(f) => Some(f),
                Err(e) => {
                    log::warn!(
                        "{name}: cannot use the cgroup of its check {}: {e}; it runs in no cgroup",
                        dir.display()
                    );
                    None
                }
            }
        });
        let spec = SpawnSpec { join, ..spec };
        let (pid, exec) = crate::spawner::spawn_service(spec, |pid| {
            let start_time = crate::proc::stat(pid).map(|s| s.start_time).unwrap_or(0);
            if let Some(Err(e)) = record.map(|r| r.set(Some((pid, start_time)))) {
                log::warn!(
                    "{name}: cannot record the pid of its check in {}: {e}; it runs unrecorded",
                    state_dir.display()
                );
            }
            Ok(())
        })
        .map_err(|e| format!("check command: cannot start: {e}"))?;
        self.check_pids.insert(pid, name.to_string());
        Ok(Probe::Command { pid, exec })
    }

    /// A check command of `name` is reaped (its group killed): its record is cleared.
    fn check_unrecorded(&mut self, name: &str) {
        if let Some(f) = self.slots.get(name).and_then(|s| s.check_file.as_ref()) {
            if let Err(e) = f.set(None) {
                log::warn!("{name}: cannot clear the pid record of its check: {e}");
            }
        }
    }

    /// A check command was reaped: its run's outcome, if it is still the service's run.
    pub fn check_reaped(&mut self, pid: i32, exit: Exit, now: Mono) {
        let Some(name) = self.check_pids.remove(&pid) else {
            return;
        };
        if !self.check_pids.values().any(|n| *n == name) {
            self.check_unrecorded(&name);
        }
        let Some(slot) = self.slots.get_mut(&name) else {
            return;
        };
        let ours = matches!(&slot.probe, Some(Probe::Command { pid: p, .. }) if *p == pid);
        if !ours {
            return; // ended already (timed out, or its service stopped)
        }
        let Some(Probe::Command { mut exec, .. }) = slot.probe.take() else {
            return;
        };
        let outcome = exec.outcome();
        if let Some(e) = exec.cgroup_refused() {
            log::warn!("{name}: its check ran in no cgroup: {e}");
        }
        let result = match (exit, outcome) {
            (_, Some(Err(f))) => Err(format!("check command: cannot start: {}", f.why)),
            (Exit::Code(0), _) => Ok(()),
            (e, _) => Err(format!("check command {e}")),
        };
        self.check_done(&name, result, now);
    }

    /// A socket check's fd is ready.
    pub fn on_health_fd(&mut self, name: &str, now: Mono) {
        let Some(outcome) = self
            .slots
            .get_mut(name)
            .and_then(|s| s.probe.as_mut())
            .and_then(Probe::progress)
        else {
            return;
        };
        if let Some(p) = self.slots.get_mut(name).and_then(|s| s.probe.take()) {
            p.cancel();
        }
        self.check_done(name, outcome, now);
    }

    /// A run ended: the rule decides; a verdict is told and acted on.
    fn check_done(&mut self, name: &str, result: Result<(), String>, now: Mono) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        let Some(h) = slot.cfg.health.as_ref() else {
            return;
        };
        if let Err(why) = &result {
            log::info!(
                "{name}: health check failed ({} of {}): {why}",
                slot.check.failures + 1,
                h.failures
            );
        }
        let Some(change) = slot.check.finish(h, result, now, unix_ms()) else {
            return;
        };
        self.health_changed(name, &change);
        if let (Health::Unhealthy, Some(why)) = (change.to, change.reason) {
            self.apply(name, Event::Unhealthy(why), now);
        }
    }

    /// `WATCHDOG=1` from the service: its deadline moves on (a service with a watchdog
    /// and no check counts as healthy from its first ping).
    pub fn watchdog_ping(&mut self, name: &str, now: Mono) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        let Some(d) = slot.cfg.watchdog else {
            return;
        };
        slot.watchdog.ping(d, now);
        if slot.cfg.health.is_none()
            && slot.health_pid.is_some()
            && slot.check.health != Health::Healthy
        {
            let change = Change {
                from: slot.check.health,
                to: Health::Healthy,
                reason: None,
            };
            slot.check.health = Health::Healthy;
            self.health_changed(name, &change);
        }
    }

    /// A missed watchdog or `WATCHDOG=trigger`: a failure of the service.
    pub fn watchdog_failed(&mut self, name: &str, why: String, now: Mono) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        if slot.health_pid.is_none() {
            return;
        }
        slot.watchdog.stop();
        let wall = unix_ms();
        slot.check.last_failure = Some(super::Failure {
            reason: why.clone(),
            time_ms: wall,
        });
        slot.check.unhealthy_since_ms = Some(wall);
        let change = Change {
            from: slot.check.health,
            to: Health::Unhealthy,
            reason: Some(why.clone()),
        };
        slot.check.health = Health::Unhealthy;
        self.health_changed(name, &change);
        self.apply(name, Event::Unhealthy(why), now);
    }

    fn health_changed(&mut self, name: &str, change: &Change) {
        match &change.reason {
            Some(r) => log::warn!(
                "{name}: {} -> {} ({r})",
                change.from.as_str(),
                change.to.as_str()
            ),
            None => log::info!(
                "{name}: health {} -> {}",
                change.from.as_str(),
                change.to.as_str()
            ),
        }
        let version = self.slots.get(name).and_then(|s| s.version.clone());
        let e = json!({
            "event": "health",
            "service": name,
            "from": change.from.as_str(),
            "to": change.to.as_str(),
            "reason": change.reason,
            "version": version,
            "time": unix_ms(),
        });
        self.server.broadcast(&crate::protocol::line(e));
    }
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
