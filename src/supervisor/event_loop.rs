//! The one loop: fire due timers, settle, then block in one `poll()` on every fd with the
//! earliest deadline as timeout. With nothing to do, supd sleeps in that `poll` and makes
//! no other system call.

use super::{ServiceFd, Supervisor};
use crate::time::Mono;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use std::os::fd::AsFd;

/// What a polled fd belongs to.
#[derive(Clone, Copy, Debug)]
enum Token {
    Signals,
    Listener,
    /// The one socket handed over by a supd from before per-service sockets.
    LegacyNotify,
    StateDir,
    Cleanup,
    GrantTimer,
    /// The log writer's reports, and its pipe while lines wait for room in it.
    LogReports,
    LogPipe,
    /// The helper reading the config for a reload.
    Reload,
    Client(u64),
    /// The spawner's queue, while it has requests to answer.
    Spawner,
    /// The epoll set of the services' fds.
    Services,
    /// supd's own stderr, while its messages wait for room in it.
    Stderr,
    /// The syslog listener (`[supd] syslog`).
    Syslog,
}

/// How long one turn handles ready service fds (exits, output, readiness) at most.
const SERVICES_TIME: std::time::Duration = std::time::Duration::from_millis(4);

/// Runs until the supervisor sets its exit status; returns it.
pub fn run(sup: &mut Supervisor) -> i32 {
    // When this turn began: poll's return (a stall is a turn longer than 100 ms).
    let mut began = Mono::now();
    loop {
        let now = Mono::now();
        sup.fire_timers(now);
        sup.settle(now);
        sup.control.tick(now);
        sup.control.reap_clients();
        // What this turn logged, for supd's own log file.
        sup.flush_own_log(now);
        // After what this turn changed: the file if due (its deadline is armed below
        // when a change came too soon after the last write; nothing when none came).
        sup.write_metrics_file(now);
        if let Some(code) = sup.exit {
            return code;
        }
        sup.sync_touched();
        let deadline = sup
            .next_deadline()
            .into_iter()
            .chain(sup.control.socket_deadline());
        sup.leases.arm_timer();
        let timeout = timeout_until(deadline.min(), now);
        // One read of the monotonic clock (vDSO: no system call) per turn.
        sup.metrics.turn(Mono::now().since(began));
        let ready = match wait(sup, timeout) {
            Ok(r) => r,
            Err(e) => {
                log::warn!("poll: {e}");
                began = Mono::now();
                continue;
            }
        };
        let now = Mono::now();
        began = now;
        for (token, flags) in ready {
            dispatch(sup, token, flags, now);
        }
    }
}

/// Milliseconds until `deadline` (rounded up, so the timer has come when poll returns).
fn timeout_until(deadline: Option<Mono>, now: Mono) -> PollTimeout {
    match deadline {
        None => PollTimeout::NONE,
        Some(d) => {
            let ns = d.since(now).as_nanos();
            let ms = ns.div_ceil(1_000_000).min(i32::MAX as u128 - 1) as i32;
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
        }
    }
}

/// Polls every fd once; returns the ones with something to do.
fn wait(sup: &Supervisor, timeout: PollTimeout) -> nix::Result<Vec<(Token, PollFlags)>> {
    let input = PollFlags::POLLIN;
    let spawner = crate::spawner::queue();
    let stderr = crate::logging::stderr_waiting();
    let mut tokens = vec![Token::Signals];
    let mut fds = vec![PollFd::new(sup.signals.fd(), input)];
    // Out of the set while paused at the open-files limit (readable, it would spin).
    if sup.control.accepting() {
        tokens.push(Token::Listener);
        fds.push(PollFd::new(sup.control.listener_fd(), input));
    }
    if let Some(fd) = sup.legacy_notify.fd() {
        tokens.push(Token::LegacyNotify);
        fds.push(PollFd::new(fd, input));
    }
    if let Some(fd) = sup.syslog_fd() {
        tokens.push(Token::Syslog);
        fds.push(PollFd::new(fd, input));
    }
    if let Some(w) = sup.state_watch.as_ref() {
        tokens.push(Token::StateDir);
        fds.push(PollFd::new(w.fd(), input));
    }
    if let Some(t) = sup.leases.timer_fd() {
        tokens.push(Token::GrantTimer);
        fds.push(PollFd::new(t, input));
    }
    for fd in sup.cleanup.iter().flat_map(|c| c.fds()) {
        tokens.push(Token::Cleanup);
        fds.push(PollFd::new(fd, input));
    }
    if let Some((reports, pipe)) = sup.log_writer.poll_fds() {
        tokens.push(Token::LogReports);
        fds.push(PollFd::new(reports, input));
        if let Some(pipe) = pipe {
            tokens.push(Token::LogPipe);
            fds.push(PollFd::new(pipe, PollFlags::POLLOUT));
        }
    }
    if let Some(job) = sup.reload_job.as_ref() {
        tokens.push(Token::Reload);
        fds.push(PollFd::new(job.fd(), input));
    }
    if let Some(q) = spawner.as_ref() {
        tokens.push(Token::Spawner);
        fds.push(PollFd::new(q.as_fd(), input));
    }
    for (id, fd, wants_in, wants_out) in sup.control.client_fds() {
        let mut flags = if wants_in { input } else { PollFlags::empty() };
        if wants_out {
            flags |= PollFlags::POLLOUT;
        }
        tokens.push(Token::Client(id));
        fds.push(PollFd::new(fd, flags));
    }
    tokens.push(Token::Services);
    fds.push(PollFd::new(sup.fdset.fd(), input));
    if let Some(err) = stderr.as_ref() {
        tokens.push(Token::Stderr);
        fds.push(PollFd::new(err.as_fd(), PollFlags::POLLOUT));
    }
    match poll(&mut fds, timeout) {
        Ok(_) => {}
        Err(nix::errno::Errno::EINTR) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    }
    Ok(tokens
        .into_iter()
        .zip(fds.iter())
        .filter_map(|(t, fd)| fd.revents().filter(|r| !r.is_empty()).map(|r| (t, r)))
        .collect())
}

fn dispatch(sup: &mut Supervisor, token: Token, flags: PollFlags, now: Mono) {
    match token {
        Token::Signals => {
            for (sig, from) in sup.signals.drain() {
                on_signal(sup, sig, from, now);
            }
        }
        Token::Listener => sup.control.accept(),
        Token::LegacyNotify => sup.on_legacy_notify(now),
        Token::StateDir => sup.on_state_dir(),
        Token::Cleanup => sup.cleanup_step(now),
        Token::GrantTimer => sup.leases.on_timer(),
        Token::LogReports => sup.on_log_reports(now),
        Token::LogPipe => sup.log_writer.flush(now),
        Token::Reload => sup.on_reload_pipe(now),
        Token::Spawner => sup.on_spawner(now),
        Token::Stderr => crate::logging::flush_stderr(),
        Token::Syslog => sup.on_syslog(now),
        Token::Client(id) => {
            if flags.contains(PollFlags::POLLOUT) {
                sup.control.flush(id);
            }
            if flags.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
                sup.control.read(id);
                sup.serve(id, now);
            }
        }
        Token::Services => {
            // For a few milliseconds at most (at least one): what is left is still
            // ready at the next poll (level-triggered), and clients, signals and
            // timers are served in between, as in a storm of thousands of exits.
            let began = Mono::now();
            for (id, kind, _) in sup.fdset.ready() {
                if Mono::now().since(began) >= SERVICES_TIME {
                    break;
                }
                let Some(name) = sup.slots.name_of(id).map(str::to_string) else {
                    continue;
                };
                on_service_fd(sup, &name, kind, now);
            }
        }
    }
}

/// One of a service's fds is ready. The handlers go by the slot's fds of now: one
/// reported for a file the slot no longer has finds nothing to do.
fn on_service_fd(sup: &mut Supervisor, name: &str, kind: ServiceFd, now: Mono) {
    match kind {
        ServiceFd::Output => sup.on_output(name, false),
        ServiceFd::OutputErr => sup.on_output(name, true),
        ServiceFd::Ready => sup.on_ready_pipe(name, now),
        ServiceFd::Notify => sup.on_notify(name, now),
        ServiceFd::Exec => sup.on_exec_report(name, now),
        ServiceFd::Health => sup.on_health_fd(name, now),
        ServiceFd::Leader => sup.on_leader_exit(name, now),
        ServiceFd::Stored => sup.on_stored_hangup(name),
    }
}

/// A signal, and the pid it came from.
fn on_signal(sup: &mut Supervisor, sig: Signal, from: Option<i32>, now: Mono) {
    use crate::pid1::Final;
    match sig {
        Signal::SIGCHLD => sup.on_sigchld(from, now),
        // System mode answers the signals busybox init does (INT: ctrl-alt-del).
        Signal::SIGUSR2 if sup.system => sup.begin_final(Final::Poweroff, now),
        Signal::SIGTERM | Signal::SIGINT if sup.system => sup.begin_final(Final::Reboot, now),
        Signal::SIGUSR1 if sup.system => sup.begin_final(Final::Halt, now),
        // LXC's stop signal for a container's init (lxc.signal.halt defaults to SIGPWR),
        // and sysvinit's power failure: an orderly power-off of a system, an orderly
        // shutdown of a container's init.
        Signal::SIGPWR if sup.system => sup.begin_final(Final::Poweroff, now),
        Signal::SIGPWR if std::process::id() == 1 => {
            log::info!("SIGPWR: stopping (a container's stop)");
            sup.begin_shutdown(0, now);
        }
        Signal::SIGTERM | Signal::SIGINT => {
            log::info!("{}: stopping", crate::config::signal_name(sig));
            sup.begin_shutdown(0, now);
        }
        Signal::SIGHUP => sup.request_reload(None, now),
        other => log::info!("ignoring {}", crate::config::signal_name(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timeouts_round_up_and_none_blocks() {
        let now = Mono(1_000_000_000);
        assert_eq!(timeout_until(None, now), PollTimeout::NONE);
        assert_eq!(
            timeout_until(Some(now.plus(Duration::from_micros(1500))), now),
            PollTimeout::from(2u8)
        );
        assert_eq!(timeout_until(Some(Mono(0)), now), PollTimeout::ZERO);
    }
}
