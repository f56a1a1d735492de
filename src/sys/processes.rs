//! Processes: pidfds (with the probe for kernels without them), signals sent to every
//! process (PID 1's shutdown), signal dispositions, supd's forked workers, and `exec` of
//! a new image.

use super::fds::{close_range, GUARDS};
use super::raw::{cstring, MISSING, PRESENT, UNKNOWN};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU8, Ordering};
/// As PID 1: ignores SIGTTIN and SIGTTOU, so that a write to (or read from) a terminal
/// supd does not own never stops the init. Children get the defaults back.
pub fn ignore_tty_stops() {
    for sig in [libc::SIGTTIN, libc::SIGTTOU] {
        // SAFETY: sets a disposition to SIG_IGN; no handler, no memory is involved.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
}

/// Resets every signal's disposition to the default, except SIGPIPE (ignored, so a write
/// to a gone client is an error, not a death). Called once at start: supd installs no
/// handlers (it reads signals from a signalfd), so children, which inherit dispositions,
/// start clean without a reset loop between fork and exec. Ignored dispositions inherited
/// from whoever started supd (`nohup`, a shell) are cleared here.
pub fn reset_dispositions() {
    // A kernel `sigaction` for SIG_DFL is all zeros (handler 0, no flags, empty mask),
    // whatever the architecture's field order: 32 zero bytes cover every layout.
    let default_action = [0u64; 4];
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP || sig == libc::SIGPIPE {
            continue;
        }
        // SAFETY: rt_sigaction reads `default_action`, which lives for the call, and
        // writes nothing (old action pointer is null). The raw syscall is used because
        // glibc refuses signals 32 and 33, which a parent may have left ignored.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                default_action.as_ptr(),
                std::ptr::null_mut::<u64>(),
                8usize,
            );
        }
    }
}

/// Whether this kernel has pidfds (Linux 5.3), once learned.
static PIDFD: AtomicU8 = AtomicU8::new(UNKNOWN);

/// The probe of pidfds (see `sys::probe_kernel`).
pub(super) fn probe_pidfd() {
    if PIDFD.load(Ordering::Relaxed) == UNKNOWN {
        if let Ok(fd) = pidfd_open(std::process::id() as i32) {
            drop(fd);
        }
    }
}

/// A copy of fd `fd` of the process `pidfd` names (`pidfd_getfd`, Linux 5.6),
/// close-on-exec. Needs ptrace's permission over it (root has it).
/// The id of the cgroup (in the cgroup v2 hierarchy: its directory's inode number) the
/// process `pidfd` names is in, or was in when it exited, even once it is reaped
/// (`PIDFD_GET_INFO`: Linux 6.13; an exited process's, 6.15). `None` where the kernel
/// cannot say.
pub fn pidfd_cgroup_id(pidfd: std::os::fd::BorrowedFd<'_>) -> Option<u64> {
    /// `struct pidfd_info` as of its first version (`PIDFD_INFO_SIZE_VER0`, 64 bytes):
    /// the kernel fills what the mask asks and it knows, and says which in the mask.
    #[repr(C)]
    struct PidfdInfo {
        mask: u64,
        cgroupid: u64,
        ids: [u32; 11],
        exit_code: i32,
    }
    const PIDFD_INFO_CGROUPID: u64 = 1 << 2;
    const PIDFD_INFO_EXIT: u64 = 1 << 3;
    // _IOWR(PIDFS_IOCTL_MAGIC 0xFF, 11, struct pidfd_info of 64 bytes).
    const PIDFD_GET_INFO: u64 = (3 << 30) | (64 << 16) | (0xFF << 8) | 11;
    let mut info = PidfdInfo {
        mask: PIDFD_INFO_CGROUPID | PIDFD_INFO_EXIT,
        cgroupid: 0,
        ids: [0; 11],
        exit_code: 0,
    };
    // SAFETY: the ioctl reads and writes at most the 64 bytes its number encodes, which
    // `info` is, alive and exclusively borrowed across the call; the pidfd is borrowed
    // open across it. Another fd, or an older kernel, fails it (ENOTTY, EINVAL).
    let r = unsafe {
        libc::ioctl(
            pidfd.as_raw_fd(),
            PIDFD_GET_INFO as _,
            &mut info as *mut PidfdInfo,
        )
    };
    (r == 0 && info.mask & PIDFD_INFO_CGROUPID != 0).then_some(info.cgroupid)
}

pub fn pidfd_getfd(pidfd: &OwnedFd, fd: RawFd) -> io::Result<OwnedFd> {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_getfd takes three integers and returns a new fd or -1; nothing is
    // borrowed beyond the call (the pidfd is held open across it).
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(got as RawFd) })
}

/// A pidfd for `pid`: readable once that process has exited, whoever its parent is.
/// Fails with ENOSYS, without a system call once the kernel said so, on kernels before
/// 5.3 (callers then go by pid and start time: `proc::kill_if_same`).
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    if PIDFD.load(Ordering::Relaxed) == MISSING {
        return Err(io::Error::from_raw_os_error(libc::ENOSYS));
    }
    // SAFETY: pidfd_open takes two integers and returns a new fd or -1; nothing is
    // borrowed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOSYS) if PIDFD.swap(MISSING, Ordering::Relaxed) != MISSING => {
                log::info!(
                    "no pidfds (Linux before 5.3): processes are told apart by pid and start time, and awaited by a timer"
                );
            }
            Some(libc::ESRCH) => PIDFD.store(PRESENT, Ordering::Relaxed),
            // Another refusal (EMFILE) says nothing about the kernel.
            _ => {}
        }
        return Err(e);
    }
    PIDFD.store(PRESENT, Ordering::Relaxed);
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends `sig` to the process of a pidfd: exact even if its pid was taken by another
/// process meanwhile (Linux 5.1).
pub fn pidfd_send_signal(fd: &OwnedFd, sig: i32) -> io::Result<()> {
    // SAFETY: pidfd_send_signal takes an fd we own, a signal number and a null info
    // pointer (the kernel fills in the default); nothing is borrowed beyond the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Replaces this process's image with `argv[0]`, environment kept. Returns only on
/// failure, with the reason.
pub fn exec(argv: &[String]) -> String {
    let args: Result<Vec<CString>, _> = argv.iter().map(|a| cstring(a)).collect();
    let args = match args {
        Ok(a) if !a.is_empty() => a,
        _ => return "bad program name or arguments".into(),
    };
    match nix::unistd::execv(&args[0], &args) {
        Ok(never) => match never {},
        Err(e) => format!("cannot execute {}: {}", argv[0], e.desc()),
    }
}

/// Sends `sig` (then SIGCONT, unless it is SIGKILL) to every process but supd and init,
/// from a forked child: `kill(-1)` spares the caller, and supd must not be the caller
/// when it is not PID 1. Returns the child's pid (reap it).
pub fn fork_kill_all(sig: i32) -> io::Result<i32> {
    // SAFETY: supd is single-threaded; the child calls only kill and _exit, which are
    // async-signal-safe, and touches no memory of the parent.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            // SAFETY: plain syscalls on integers in the forked child, then _exit without
            // running any of the parent's destructors or atexit handlers.
            unsafe {
                libc::kill(-1, sig);
                if sig != libc::SIGKILL {
                    libc::kill(-1, libc::SIGCONT);
                }
                libc::_exit(0)
            }
        }
        child => Ok(child),
    }
}

/// Runs `work` in a forked child, which keeps only the fds in `keep` and ends with
/// `_exit` of what `work` returns (101 if it panics). Returns the child's pid (reap it).
///
/// For work that must not stall the loop (reading a large config): supd is
/// single-threaded, so the child's copy of the heap is consistent and `work` may
/// allocate; it never returns into the parent's code (no destructors, no atexit
/// handlers, no flush of the parent's buffers).
pub fn fork_worker(keep: RawFd, work: impl FnOnce() -> i32) -> io::Result<i32> {
    let parent = std::process::id() as i32;
    // SAFETY: supd has one thread (no lock of another thread is copied held); the child
    // runs `work` and then `_exit`s, below.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            // It dies with supd, and holds none of supd's sockets, pipes or locks (the
            // guards first: a new supd must never find them held).
            for g in &GUARDS {
                let fd = g.load(Ordering::Relaxed);
                if fd >= 0 && fd != keep {
                    // SAFETY: closes an fd number of this (child) process.
                    unsafe { libc::close(fd) };
                }
            }
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            // Named apart from supd in `ps` (and for tests that tell helpers from
            // services' children not yet exec'd).
            // SAFETY: PR_SET_NAME reads a NUL-terminated string from a static.
            unsafe { libc::prctl(libc::PR_SET_NAME, c"supd-worker".as_ptr()) };
            if nix::unistd::getppid().as_raw() != parent {
                // supd died before the death signal was set.
                // SAFETY: ends the child at once.
                unsafe { libc::_exit(1) }
            }
            // Below supd's priority: on a busy machine the loop keeps its CPU.
            // SAFETY: setpriority takes integers and changes only this process.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
            if keep > 3 {
                close_range(3, keep - 1);
            }
            close_range(keep + 1, RawFd::MAX);
            let status =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or(101);
            // SAFETY: ends the child without unwinding into or running the parent's code.
            unsafe { libc::_exit(status) }
        }
        child => Ok(child),
    }
}

/// A client's start-up in place of std's (supctl's own C `main`): standard input, output
/// and error open (were one closed, a socket could take its number and output be
/// written into it), and SIGPIPE ignored (a reader gone is a write error, not a death).
pub fn client_start() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: `fds` is a local array of three pollfd that outlives the call; "/dev/null"
    // is a NUL-terminated literal; signal() with SIG_IGN installs no handler of ours.
    unsafe {
        if libc::poll(fds.as_mut_ptr(), 3, 0) > 0 {
            for p in fds.iter().filter(|p| p.revents & libc::POLLNVAL != 0) {
                // The lowest free number: the closed one, the lowest first.
                let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                if fd != p.fd {
                    libc::abort();
                }
            }
        }
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}
