//! The end of a system (system mode): after every service is stopped in order, every
//! remaining process gets SIGTERM, a bounded grace, then SIGKILL; the disks are synced;
//! `reboot(2)` powers off, reboots or halts. Only PID 1 ever calls `reboot(2)`: a supd
//! in system mode that is not PID 1 says so and exits.

use crate::signals::Signals;
use crate::time::Mono;
use nix::sys::reboot::RebootMode;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use std::time::Duration;

/// How long the remaining processes have between SIGTERM and SIGKILL.
pub const GRACE: Duration = Duration::from_secs(3);

/// What ends the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Final {
    Poweroff,
    Reboot,
    Halt,
}

impl Final {
    pub fn as_str(self) -> &'static str {
        match self {
            Final::Poweroff => "poweroff",
            Final::Reboot => "reboot",
            Final::Halt => "halt",
        }
    }

    fn mode(self) -> RebootMode {
        match self {
            Final::Poweroff => RebootMode::RB_POWER_OFF,
            Final::Reboot => RebootMode::RB_AUTOBOOT,
            Final::Halt => RebootMode::RB_HALT_SYSTEM,
        }
    }
}

/// At start in system mode as PID 1: ctrl-alt-del sends SIGINT instead of rebooting.
pub fn setup() {
    if std::process::id() == 1 {
        if let Err(e) = nix::sys::reboot::set_cad_enabled(false) {
            log::warn!("cannot route ctrl-alt-del to SIGINT: {e}");
        }
    }
}

/// As PID 1: TERM, grace, KILL to every remaining process; sync; `reboot(2)`; never
/// returns (if `reboot(2)` fails it reaps forever). Elsewhere it returns at once.
pub fn end(action: Final, signals: &mut Signals) {
    // Only PID 1 signals processes it did not start: elsewhere the services are down,
    // and that is all of supd's to end.
    if std::process::id() != 1 {
        log::warn!(
            "{}: supd is not PID 1: its services are stopped; not signalling any other process, not calling reboot(2); exiting",
            action.as_str()
        );
        return;
    }
    log::warn!(
        "{}: sending TERM to every remaining process",
        action.as_str()
    );
    kill_all(Signal::SIGTERM, GRACE, signals);
    log::warn!("{}: sending KILL to what is left", action.as_str());
    kill_all(Signal::SIGKILL, Duration::from_secs(2), signals);
    nix::unistd::sync();
    log::warn!("{}: synced; calling reboot(2)", action.as_str());
    // What waits for the console is said before the machine goes (for a bounded time).
    crate::logging::finish_stderr(Duration::from_secs(1));
    let Err(e) = nix::sys::reboot::reboot(action.mode());
    log::error!("reboot(2) failed: {e}; reaping forever");
    loop {
        reap_all();
        let _ = nix::poll::poll(
            &mut [nix::poll::PollFd::new(
                signals.fd(),
                nix::poll::PollFlags::POLLIN,
            )],
            nix::poll::PollTimeout::NONE,
        );
        signals.drain();
    }
}

/// Sends `sig` to everyone else and reaps until nobody is left or `grace` passed.
fn kill_all(sig: Signal, grace: Duration, signals: &mut Signals) {
    if let Err(e) = crate::sys::fork_kill_all(sig as i32) {
        log::error!("cannot fork to send {sig}: {e}");
        return;
    }
    let end = Mono::now().plus(grace);
    loop {
        if reap_all() {
            return; // no child left
        }
        let left = end.since(Mono::now());
        if left.is_zero() {
            return;
        }
        let timeout = nix::poll::PollTimeout::try_from(left.as_millis() as i32 + 1)
            .unwrap_or(nix::poll::PollTimeout::MAX);
        let _ = nix::poll::poll(
            &mut [nix::poll::PollFd::new(
                signals.fd(),
                nix::poll::PollFlags::POLLIN,
            )],
            timeout,
        );
        signals.drain();
    }
}

/// Reaps every exited child; true when there is no child at all.
fn reap_all() -> bool {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return false,
            Err(nix::errno::Errno::ECHILD) => return true,
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
    }
}
