//! Signals, read from a signalfd. [`Signals::block`] runs first thing in `main`, before
//! any child exists: the handled signals are blocked and arrive as readable data in the
//! one poll. Fault signals (SEGV, BUS, ILL, FPE, ABRT) are left alone. Children get a
//! clean mask and default dispositions (see `sys::child`).

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use std::os::fd::{AsFd, BorrowedFd};

/// The signals supd acts on.
pub const HANDLED: &[Signal] = &[
    Signal::SIGCHLD,
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGQUIT,
    Signal::SIGPWR,
];

/// The signalfd.
pub struct Signals {
    fd: SignalFd,
}

impl Signals {
    /// Resets dispositions to their defaults, blocks [`HANDLED`] and opens a non-blocking
    /// signalfd for them.
    pub fn block() -> nix::Result<Signals> {
        crate::sys::reset_dispositions();
        let mut set = SigSet::empty();
        for s in HANDLED {
            set.add(*s);
        }
        nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
        Ok(Signals { fd })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Every signal pending now, in arrival order (a repeated one may be coalesced),
    /// with the pid that sent it (for SIGCHLD: the child it tells of).
    pub fn drain(&mut self) -> Vec<(Signal, Option<i32>)> {
        let mut out = Vec::new();
        while let Ok(Some(info)) = self.fd.read_signal() {
            if let Ok(sig) = Signal::try_from(info.ssi_signo as i32) {
                out.push((sig, i32::try_from(info.ssi_pid).ok().filter(|p| *p > 0)));
            }
        }
        out
    }
}
