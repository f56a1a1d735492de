//! The dead-man guard's forked child (`deadman.rs`): what it holds, its wait on the
//! dead-man pipe and on the grant board's end (a CLOCK_BOOTTIME timer), and the kill.
//! Raw system calls after fork, as the rest of `sys`.

use super::fds::{close_all_but, GUARDS};
use super::raw::errno_now;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;

/// What a dead-man guard ends (`deadman.rs`): one run of a leader-only service, once no
/// supd image holds the write end of the dead-man pipe any more.
pub struct GuardTarget<'a> {
    /// The dead-man pipe's read end: end-of-file once supd is gone.
    pub deadman: RawFd,
    /// The dead-man pipe's write end, which the guard must not keep.
    pub deadman_write: RawFd,
    /// A pidfd of the run's leader, taken while it is supd's unreaped child; on kernels
    /// without pidfds (before 5.3), its `/proc/PID` directory, opened likewise (see
    /// `leader_is_pidfd`).
    pub leader: &'a OwnedFd,
    /// Whether `leader` is a pidfd (else the `/proc/PID` directory).
    pub leader_is_pidfd: bool,
    /// The run's `cgroup.kill`, opened for writing, where it has one.
    pub cgroup_kill: Option<&'a OwnedFd>,
    /// Without `cgroup.kill` (Linux before 5.14): the run's `cgroup.procs`, opened for
    /// reading, whose members the guard SIGKILLs one by one.
    pub cgroup_procs: Option<&'a OwnedFd>,
    /// The run's process group (the leader's pid).
    pub pgid: i32,
    /// The grant's board of the run's lease (`deadman::Board`): the instant, on
    /// CLOCK_BOOTTIME, at which the run must be gone (the grant's end plus its kill
    /// grace), which supd moves on every renewal. None: the dead-man pipe alone.
    pub board: Option<&'a OwnedFd>,
}

/// The size of a grant board's record: the instant (nanoseconds of CLOCK_BOOTTIME) and
/// its complement, both little-endian, so that a read torn by a concurrent write is
/// seen (the two halves do not agree) and read again.
pub const BOARD_LEN: usize = 16;

/// The record of `end_ns` on a board.
pub fn board_record(end_ns: u64) -> [u8; BOARD_LEN] {
    let mut b = [0u8; BOARD_LEN];
    b[..8].copy_from_slice(&end_ns.to_le_bytes());
    b[8..].copy_from_slice(&(!end_ns).to_le_bytes());
    b
}

/// The instant a board's record names, or None when it is torn or short.
pub fn board_end(b: &[u8]) -> Option<u64> {
    let a = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
    let c = u64::from_le_bytes(b.get(8..BOARD_LEN)?.try_into().ok()?);
    (c == !a).then_some(a)
}

/// A new grant board: a memfd (Linux 3.17), else a file of the temp directory (or, if
/// it cannot be written there, of /dev/shm, /run or /tmp) unlinked at once;
/// close-on-exec (a service never holds it; a guard gets it by fork).
pub fn board_file() -> io::Result<OwnedFd> {
    // The system call itself, not glibc's wrapper: that came with glibc 2.27, and the
    // packaged programs link against 2.17 (RHEL 7), where the symbol is missing.
    // SAFETY: memfd_create reads a NUL-terminated name from a static and returns a new
    // fd, which is owned here from then on.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_memfd_create,
            c"supd-grant".as_ptr(),
            libc::MFD_CLOEXEC,
        )
    };
    if fd >= 0 {
        // SAFETY: a new fd that nothing else owns.
        return Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as RawFd) });
    }
    match nix::errno::Errno::last() {
        nix::errno::Errno::ENOSYS => {}
        e => return Err(e.into()),
    }
    // The temp directory may be missing or read-only (a bad TMPDIR, a root still
    // read-only early in a boot): the usual memory-backed places are tried after it.
    let mut last = io::Error::from(io::ErrorKind::NotFound);
    let dirs = [
        std::env::temp_dir(),
        "/dev/shm".into(),
        "/run".into(),
        "/tmp".into(),
    ];
    for (i, dir) in dirs.iter().enumerate() {
        if dirs[..i].contains(dir) {
            continue;
        }
        let path = dir.join(format!("supd-grant-{}-{}", std::process::id(), nanos_now()));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(f) => {
                let _ = std::fs::remove_file(&path);
                return Ok(OwnedFd::from(f));
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn nanos_now() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Forks a guard for `t`: a process of its own session that holds nothing but the fds of
/// `t`, blocks in `read` on the dead-man pipe, and at its end-of-file (every supd image
/// holding the write end is gone: killed, crashed, exited) SIGKILLs the run: its leader
/// through the pidfd, its cgroup (`cgroup.kill`, else each member of `cgroup.procs`),
/// and its process group while the leader is still there
/// (alive or an unreaped zombie, so the group's id cannot name another group). supd kills
/// the guard (its own child) when the run is over. Returns the guard's pid.
pub fn spawn_guard(t: &GuardTarget) -> io::Result<i32> {
    let board = t.board.map_or(-1, |f| f.as_raw_fd());
    let mut keep = [
        t.deadman,
        t.leader.as_raw_fd(),
        t.cgroup_kill.map_or(-1, |f| f.as_raw_fd()),
        t.cgroup_procs.map_or(-1, |f| f.as_raw_fd()),
        board,
    ];
    keep.sort_unstable();
    let guards = GUARDS.each_ref().map(|g| g.load(Ordering::Relaxed));
    let close_first = [t.deadman_write, guards[0], guards[1], guards[2]];
    let kill_fd = t.cgroup_kill.map_or(-1, |f| f.as_raw_fd());
    let procs_fd = t.cgroup_procs.map_or(-1, |f| f.as_raw_fd());
    let leader = t.leader.as_raw_fd();
    // SAFETY: supd is single-threaded, so the child holds no lock another thread could
    // own; it runs `guard_main` only: raw system calls on integers and a static byte,
    // then `_exit`.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => guard_main(
            &close_first,
            &keep,
            (t.deadman, board),
            (leader, t.leader_is_pidfd),
            (kill_fd, procs_fd),
            t.pgid,
        ),
        child => Ok(child),
    }
}

/// The guard's life (in the forked child): drop every other fd (the write end and the
/// guards first, by number, in case `close_range` is missing), leave supd's session,
/// wait for end-of-file or the end its board names, kill, exit.
fn guard_main(
    close_first: &[RawFd; 4],
    keep: &[RawFd; 5],
    (deadman, board): (RawFd, RawFd),
    (leader, is_pidfd): (RawFd, bool),
    (kill_fd, procs_fd): (RawFd, RawFd),
    pgid: i32,
) -> ! {
    // SAFETY (whole function): plain system calls on integers and on a byte on the
    // stack (and a static name); the child ends in `_exit` and never returns into the
    // parent's code.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"supd-guard".as_ptr());
        for &fd in close_first {
            if fd >= 0 {
                libc::close(fd);
            }
        }
        close_all_but(0, keep);
        // Not in supd's process group: a signal to that group (a terminal's ^C) is not
        // for it. supd's blocked signals stay blocked; only SIGKILL ends it.
        libc::setsid();
        guard_wait(deadman, board);
        let leader_there = if is_pidfd {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                leader,
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            ) == 0
        } else {
            // The directory of /proc/PID opened while the leader was supd's unreaped
            // child names that process, not its pid: once it is reaped, nothing in the
            // directory can be looked up any more, even if the pid was taken again. A
            // zombie's can. The group is the leader's own (a session leader cannot
            // leave it), so the group's SIGKILL below ends the leader too.
            libc::faccessat(leader, c"stat".as_ptr(), libc::F_OK, 0) == 0
        };
        if leader_there && pgid > 1 {
            libc::kill(-pgid, libc::SIGKILL);
        }
        if kill_fd >= 0 {
            libc::write(kill_fd, b"1".as_ptr().cast(), 1);
        } else if procs_fd >= 0 {
            kill_listed(procs_fd);
        }
        libc::_exit(0)
    }
}

/// Returns when the run must end: at end-of-file on the dead-man pipe (no supd image is
/// left: nobody renews, nobody stops the run), or once CLOCK_BOOTTIME reaches the end
/// the board names (read again at each wake-up: supd moves it on every renewal, and a
/// supd that is frozen, stalled in a write or gone moves it no more). A board that
/// cannot be read is an end. Raw system calls on integers and stack buffers only.
fn guard_wait(deadman: RawFd, board: RawFd) {
    // SAFETY: timerfd_create, timerfd_settime, clock_gettime, poll, pread and read on
    // integers and on buffers and structs of this stack frame, each sized as passed.
    unsafe {
        // CLOCK_BOOTTIME runs on through a suspend (Linux 3.15 for a timerfd); before,
        // the wall clock does too, with a wake-up on each step of it (the end is read
        // again then). Without either, the poll's own timeout, which a suspend stretches.
        let mut clock = libc::CLOCK_BOOTTIME;
        let mut timer = -1;
        if board >= 0 {
            timer = libc::timerfd_create(libc::CLOCK_BOOTTIME, libc::TFD_CLOEXEC);
            if timer < 0 {
                clock = libc::CLOCK_REALTIME;
                timer = libc::timerfd_create(libc::CLOCK_REALTIME, libc::TFD_CLOEXEC);
            }
        }
        loop {
            let mut wait_ms: libc::c_int = -1;
            if board >= 0 {
                let Some(end) = read_board(board) else {
                    return;
                };
                let now = clock_ns(libc::CLOCK_BOOTTIME);
                if now >= end {
                    return;
                }
                let left = end - now;
                if timer >= 0 {
                    let at = if clock == libc::CLOCK_BOOTTIME {
                        end
                    } else {
                        clock_ns(libc::CLOCK_REALTIME).saturating_add(left)
                    };
                    let spec = libc::itimerspec {
                        it_interval: libc::timespec {
                            tv_sec: 0,
                            tv_nsec: 0,
                        },
                        it_value: libc::timespec {
                            tv_sec: (at / 1_000_000_000) as libc::time_t,
                            tv_nsec: (at % 1_000_000_000) as libc::c_long,
                        },
                    };
                    let flags = if clock == libc::CLOCK_REALTIME {
                        libc::TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET
                    } else {
                        libc::TFD_TIMER_ABSTIME
                    };
                    if libc::timerfd_settime(timer, flags, &spec, std::ptr::null_mut()) < 0 {
                        return;
                    }
                } else {
                    wait_ms = (left / 1_000_000 + 1).min(i32::MAX as u64) as libc::c_int;
                }
            }
            let mut fds = [
                libc::pollfd {
                    fd: deadman,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: timer,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let n = if timer >= 0 { 2 } else { 1 };
            if libc::poll(fds.as_mut_ptr(), n, wait_ms) < 0 {
                if errno_now() == libc::EINTR {
                    continue;
                }
                return;
            }
            if fds[0].revents != 0 {
                let mut byte = 0u8;
                let r = libc::read(deadman, (&mut byte as *mut u8).cast(), 1);
                if !(r > 0 || (r < 0 && errno_now() == libc::EINTR)) {
                    return; // end-of-file, or an error: nobody is left to stop the run
                }
            }
            if n == 2 && fds[1].revents != 0 {
                // Expired, or (ECANCELED) the wall clock was set: the loop reads the end
                // again and arms the timer anew either way.
                let mut ticks = [0u8; 8];
                libc::read(timer, ticks.as_mut_ptr().cast(), ticks.len());
            }
        }
    }
}

/// `TFD_TIMER_CANCEL_ON_SET` (Linux 3.0): a wall-clock timer read fails with ECANCELED
/// when the clock is set.
const TFD_TIMER_CANCEL_ON_SET: libc::c_int = 1 << 1;

/// A clock's reading in nanoseconds (0 if it cannot be read). Raw, for a forked child.
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec on this stack frame.
    if unsafe { libc::clock_gettime(clock, &mut ts) } < 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The end a grant board names, read again while a concurrent write tears it (supd
/// writes the 16 bytes at once; a torn read sees halves that disagree); None when it
/// cannot be read. Raw, for a forked child.
fn read_board(board: RawFd) -> Option<u64> {
    for _ in 0..1000 {
        let mut b = [0u8; BOARD_LEN];
        // SAFETY: pread into the buffer on this stack frame, of its length.
        let n = unsafe { libc::pread(board, b.as_mut_ptr().cast(), BOARD_LEN, 0) };
        if n < 0 && errno_now() == libc::EINTR {
            continue;
        }
        if n != BOARD_LEN as isize {
            return None;
        }
        if let Some(end) = board_end(&b) {
            return Some(end);
        }
    }
    None
}

/// How many times a guard without `cgroup.kill` reads the run's `cgroup.procs`.
const GUARD_KILL_PASSES: usize = 16;

/// `cgroup.kill` by hand, in the guard (Linux before 5.14): SIGKILLs every pid the
/// open `cgroup.procs` lists, and reads it again, until a pass finds nobody or
/// [`GUARD_KILL_PASSES`] are done (a member that forked meanwhile is caught by a later
/// pass; one that cannot die yet is listed again and harmlessly killed again). A pid
/// listed there names a process of the run. Raw system calls and a stack buffer only.
fn kill_listed(procs: RawFd) {
    // SAFETY: lseek, read and kill on integers and on a buffer on this stack, read
    // within the length `read` returned.
    unsafe {
        for _ in 0..GUARD_KILL_PASSES {
            if libc::lseek(procs, 0, libc::SEEK_SET) < 0 {
                return;
            }
            let mut buf = [0u8; 4096];
            let mut pid: i32 = 0;
            let mut found = 0usize;
            loop {
                let n = libc::read(procs, buf.as_mut_ptr().cast(), buf.len());
                if n < 0 && errno_now() == libc::EINTR {
                    continue;
                }
                if n <= 0 {
                    break;
                }
                for &b in &buf[..n as usize] {
                    if b.is_ascii_digit() {
                        pid = pid.saturating_mul(10).saturating_add((b - b'0') as i32);
                    } else {
                        if pid > 1 {
                            libc::kill(pid, libc::SIGKILL);
                            found += 1;
                        }
                        pid = 0;
                    }
                }
            }
            if pid > 1 {
                libc::kill(pid, libc::SIGKILL);
                found += 1;
            }
            if found == 0 {
                return;
            }
        }
    }
}
