//! The thin edge to the kernel that needs `unsafe`: what runs in a forked child before
//! `exec`, and `pidfd_open`. Everything else uses nix's safe wrappers. Each `unsafe`
//! block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// Who the child runs as, resolved in the parent (name lookups allocate and may read
/// files, which a forked child must not do).
#[derive(Clone, Debug)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Everything `spawn` needs, prepared in the parent.
pub struct SpawnSpec {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: std::path::PathBuf,
    pub stdout: Stdio,
    pub stderr: Stdio,
    pub creds: Option<Credentials>,
    /// The write end of the readiness pipe and the fd number it must have in the child.
    pub ready_fd: Option<(RawFd, i32)>,
}

/// The open-files limit supd was started with, given back to every child.
static CHILD_NOFILE: std::sync::OnceLock<libc::rlimit> = std::sync::OnceLock::new();

/// Raises supd's own soft limit of open files to the hard limit: it holds a few fds per
/// service. Children get the original soft limit back (programs that use `select` break
/// beyond 1024).
pub fn raise_nofile() {
    let Ok((soft, hard)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    else {
        return;
    };
    // After a reexec, the limit to give children is the one the first image was given.
    let handed = std::env::var("SUP_CHILD_NOFILE").ok().and_then(|v| {
        let (s, h) = v.split_once(':')?;
        Some(libc::rlimit {
            rlim_cur: s.parse().ok()?,
            rlim_max: h.parse().ok()?,
        })
    });
    let _ = CHILD_NOFILE.set(handed.unwrap_or(libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    }));
    let want = hard.min(1 << 20);
    if want > soft {
        if let Err(e) =
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, want, hard)
        {
            log::warn!("cannot raise the open-files limit from {soft} to {want}: {e}");
        }
    }
}

/// Forks and execs `spec`. The child gets its own session and process group, a clean
/// signal mask and default dispositions, and only fds 0-2 (plus the readiness fd): every
/// fd supd opens is close-on-exec. Returns the pid, or the reason the program could not
/// be started (std reports the child's `exec` errno back through a pipe).
pub fn spawn(spec: SpawnSpec) -> io::Result<i32> {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd)
        .stdin(null_input())
        .stdout(spec.stdout)
        .stderr(spec.stderr);
    let creds = spec.creds.clone();
    let ready = spec.ready_fd;
    let nofile = CHILD_NOFILE.get().copied();
    // SAFETY: supd is single-threaded, so the forked child holds no lock another thread
    // could own. The closure calls only async-signal-safe functions (setsid,
    // sigemptyset, sigprocmask, setrlimit, setgroups, setgid, setuid, dup2, fcntl) on data prepared before the
    // fork, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || child_setup(creds.as_ref(), ready, nofile));
    }
    let child = cmd.spawn()?;
    // The child is reaped by the supervisor's one waitpid(-1) loop, never by `Child`.
    Ok(child.id() as i32)
}

/// Standard input for a service: `/dev/null`, or, before `/dev` exists (an init that has
/// not mounted it yet), the read end of a pipe whose write end is closed: end-of-file at
/// once, as from `/dev/null`.
fn null_input() -> Stdio {
    if let Some(s) = dev_null(false) {
        return s;
    }
    match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok((read, _write)) => Stdio::from(read),
        Err(_) => Stdio::null(),
    }
}

/// `/dev/null` for reading or writing, or `None` before `/dev` exists (an init whose
/// first one-shots have not mounted it yet); callers choose what stands in for it.
pub fn dev_null(write: bool) -> Option<Stdio> {
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .open("/dev/null")
        .ok()
        .map(Stdio::from)
}

/// Runs in the forked child, between fork and exec.
fn child_setup(
    creds: Option<&Credentials>,
    ready: Option<(RawFd, i32)>,
    nofile: Option<libc::rlimit>,
) -> io::Result<()> {
    // SAFETY (whole function): each call is a plain async-signal-safe syscall wrapper on
    // integers or on pointers into memory the parent prepared and still owns.
    unsafe {
        if libc::setsid() < 0 {
            return Err(io::Error::last_os_error());
        }
        // std resets SIGPIPE and (today) the mask; the mask is cleared again here so
        // the child never inherits supd's blocked signals whatever std does. Every other
        // disposition was reset once in supd itself (`reset_dispositions`).
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        if let Some(limit) = nofile {
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
        if let Some((from, to)) = ready {
            if from == to {
                // dup2 onto itself would keep close-on-exec: clear it instead.
                if libc::fcntl(to, libc::F_SETFD, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(from, to) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if let Some(c) = creds {
            if libc::setgroups(c.groups.len(), c.groups.as_ptr()) < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::setgid(c.gid) < 0 || libc::setuid(c.uid) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
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

/// Marks every fd from 3 up close-on-exec: what supd inherited from whoever started it
/// (a shell's saved fds, a leaked pipe) must not reach its services. Called first thing.
pub fn cloexec_inherited() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range takes integers and only changes fd flags; it touches no memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return;
    }
    // Kernels before 5.11: one fcntl per open fd.
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<RawFd> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd >= 3)
        .collect();
    for fd in fds {
        // SAFETY: F_SETFD on an fd number only changes its flags; a closed number fails
        // harmlessly with EBADF.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// A pidfd for `pid`: readable once that process has exited, whoever its parent is.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new fd or -1; nothing is
    // borrowed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Raw fd of anything that has one, for a pre-exec `dup2`.
pub fn raw(fd: &impl AsRawFd) -> RawFd {
    fd.as_raw_fd()
}

/// A C string for a path or name; interior NULs become an error instead of a panic.
pub fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "contains a NUL byte"))
}

/// Takes ownership of an fd number handed over by a previous supd image.
pub fn adopt_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // Refuse what is not an open fd: fcntl(F_GETFD) fails with EBADF.
    nix::fcntl::fcntl(unsafe_borrow(fd), nix::fcntl::FcntlArg::F_GETFD)?;
    // SAFETY: the handoff names this fd as ours (the previous image left it open across
    // exec for us), it is open (checked above), and nothing else in this process owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn unsafe_borrow(fd: RawFd) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: used only for the one fcntl call above, on an fd this process holds for its
    // whole life (it was kept open across exec for us).
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

/// Keeps `fd` open across `exec` (`keep`), or closes it there again.
pub fn keep_across_exec(fd: &impl std::os::fd::AsFd, keep: bool) -> io::Result<()> {
    let flags = if keep {
        nix::fcntl::FdFlag::empty()
    } else {
        nix::fcntl::FdFlag::FD_CLOEXEC
    };
    nix::fcntl::fcntl(fd.as_fd(), nix::fcntl::FcntlArg::F_SETFD(flags))?;
    Ok(())
}

/// The open-files limit children get, as `SUP_CHILD_NOFILE` for a re-executed image.
pub fn child_nofile_env() -> Option<String> {
    CHILD_NOFILE
        .get()
        .map(|l| format!("{}:{}", l.rlim_cur, l.rlim_max))
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
