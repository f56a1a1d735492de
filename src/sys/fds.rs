//! File descriptors: the guards a forked child closes first, closing all but a few
//! (`close_range`, with the fallbacks of old kernels), the open-files limit, fds
//! adopted across `reexec`, and the fd numbers a child `dup2`s from.

use super::raw::{errno_now, MISSING, PRESENT, UNKNOWN};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};
/// The fds that keep a second supd out (the state lock, the listening socket): a forked
/// child closes them first thing, so that a child that has not reached `exec` yet never
/// keeps a new supd out after this one died.
pub(super) static GUARDS: [AtomicI32; 3] =
    [AtomicI32::new(-1), AtomicI32::new(-1), AtomicI32::new(-1)];

/// Names the fd of the state lock (-1: none), for every forked child to close first thing.
pub fn set_lock_fd(fd: RawFd) {
    GUARDS[0].store(fd, Ordering::Relaxed);
}

/// Names the fd of the state directory's own lock (`statedir::lock_dir`), likewise.
pub fn set_dir_lock_fd(fd: RawFd) {
    GUARDS[2].store(fd, Ordering::Relaxed);
}

/// Asks the kernel to pass, with each datagram the socket `fd` receives, a pidfd of its
/// sender (SO_PASSPIDFD, Linux 6.5; in an SCM_PIDFD message). Older kernels refuse it.
pub fn pass_pidfd(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: setsockopt reads the `c_int` at `&on`, alive across the call, of the size
    // given; the fd is borrowed open across it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSPIDFD,
            &on as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Names the fd of the listening socket, likewise.
pub fn set_listener_fd(fd: RawFd) {
    GUARDS[1].store(fd, Ordering::Relaxed);
}

/// The open-files limit supd was started with, given back to every child.
pub(super) static CHILD_NOFILE: std::sync::OnceLock<libc::rlimit> = std::sync::OnceLock::new();

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

/// A pipe whose both ends are close-on-exec and numbered at least `floor`.
pub(super) fn pipe_above(floor: RawFd) -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    Ok((above(r, floor)?, above(w, floor)?))
}

/// `fd`, or a close-on-exec copy of it numbered at least `floor`: the child's `dup2`s
/// onto 0-2 and the readiness fd then never overwrite a source still to be used.
pub(super) fn above(fd: OwnedFd, floor: RawFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() >= floor {
        return Ok(fd);
    }
    let n = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(floor))?;
    // SAFETY: fcntl just returned this new fd, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// Closes every fd from `from` up but those of `keep` (sorted; negative ones ignored).
pub(super) fn close_all_but(from: RawFd, keep: &[RawFd]) {
    let mut low = from;
    for &k in keep.iter().filter(|k| **k >= from) {
        if k > low {
            close_range(low, k - 1);
        }
        low = low.max(k + 1);
    }
    close_range(low, RawFd::MAX);
}

/// Whether this kernel has `close_range` (Linux 5.9), once probed.
static CLOSE_RANGE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// The probe of `close_range` (see `sys::probe_kernel`).
pub(super) fn probe_close_range() {
    if CLOSE_RANGE.load(Ordering::Relaxed) == UNKNOWN {
        // SAFETY: close_range on an empty range (from the largest fd number) closes
        // nothing; it takes integers only. It fails with ENOSYS where it is missing.
        let r = unsafe {
            libc::syscall(
                libc::SYS_close_range,
                libc::c_uint::MAX,
                libc::c_uint::MAX,
                0 as libc::c_uint,
            )
        };
        let missing = r < 0 && errno_now() == libc::ENOSYS;
        CLOSE_RANGE.store(if missing { MISSING } else { PRESENT }, Ordering::Relaxed);
        if missing {
            log::info!(
                "no close_range (Linux before 5.9): children close their fds as /proc/self/fd lists them"
            );
        }
    }
}

/// Closes fds `low..=high`: `close_range` where the kernel has it, else (Linux before
/// 5.9) each fd `/proc/self/fd` lists in the range, else (no /proc: an init before it
/// mounts it) every number up to the open-files limit. Async-signal-safe: raw system
/// calls and a buffer on the stack, for forked children.
pub(super) fn close_range(low: RawFd, high: RawFd) {
    if low > high {
        return;
    }
    if CLOSE_RANGE.load(Ordering::Relaxed) != MISSING {
        // SAFETY: close_range takes integers and only closes this process's fds.
        let r = unsafe {
            libc::syscall(
                libc::SYS_close_range,
                low as libc::c_uint,
                high as libc::c_uint,
                0 as libc::c_uint,
            )
        };
        if r == 0 {
            return;
        }
    }
    close_listed(low, high);
}

/// `close_range` without the system call: the fds `/proc/self/fd` lists (read with
/// `getdents64` into a stack buffer, no allocation), or every number up to the soft
/// open-files limit where /proc is not there.
fn close_listed(low: RawFd, high: RawFd) {
    // SAFETY (whole function): open, getdents64, close and getrlimit on integers, a
    // static C string, and buffers on this stack that outlive each call; the records
    // getdents64 wrote are read within the `n` bytes it reported, each record's length
    // taken from its own header.
    unsafe {
        let dir = libc::open(
            c"/proc/self/fd".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if dir < 0 {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
            let top = (lim.rlim_cur.min(1 << 20) as RawFd).min(high.saturating_add(1));
            for fd in low..top {
                libc::close(fd);
            }
            return;
        }
        // u64s: the records' 8-byte fields are aligned.
        let mut buf = [0u64; 512];
        loop {
            let n = libc::syscall(
                libc::SYS_getdents64,
                dir,
                buf.as_mut_ptr(),
                std::mem::size_of_val(&buf),
            );
            if n <= 0 {
                break;
            }
            let bytes = buf.as_ptr().cast::<u8>();
            let mut off = 0usize;
            // struct linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, name.
            while off + 19 < n as usize {
                let reclen = u16::from_ne_bytes([*bytes.add(off + 16), *bytes.add(off + 17)]);
                let mut fd: i64 = 0;
                let mut digits = 0;
                let mut i = off + 19;
                while i < off + reclen as usize && (*bytes.add(i)).is_ascii_digit() {
                    fd = fd * 10 + (*bytes.add(i) - b'0') as i64;
                    digits += 1;
                    i += 1;
                }
                // Closing fds below the directory's position does not disturb it: it
                // lists fds by number.
                if digits > 0 && fd >= low as i64 && fd <= high as i64 && fd != dir as i64 {
                    libc::close(fd as RawFd);
                }
                if reclen == 0 {
                    break;
                }
                off += reclen as usize;
            }
        }
        libc::close(dir);
    }
}

/// Standard input for a service: `/dev/null`, or, before `/dev` exists (an init that has
/// not mounted it yet), the read end of a pipe whose write end is closed: end-of-file at
/// once, as from `/dev/null`.
pub(super) fn null_input() -> io::Result<OwnedFd> {
    if let Some(fd) = dev_null_fd(false) {
        return Ok(fd);
    }
    let (read, _write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    Ok(read)
}

/// `/dev/null` for reading or writing, or `None` before `/dev` exists (an init whose
/// first one-shots have not mounted it yet); callers choose what stands in for it.
pub(super) fn dev_null_fd(write: bool) -> Option<OwnedFd> {
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .open("/dev/null")
        .ok()
        .map(OwnedFd::from)
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

/// Raw fd of anything that has one, for a pre-exec `dup2`.
pub fn raw(fd: &impl AsRawFd) -> RawFd {
    fd.as_raw_fd()
}

/// Takes ownership of an fd number handed to supd: by a previous supd image, or in a
/// message (SCM_RIGHTS, SCM_PIDFD).
pub fn adopt_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // Refuse what is not an open fd: fcntl(F_GETFD) fails with EBADF.
    nix::fcntl::fcntl(unsafe_borrow(fd), nix::fcntl::FcntlArg::F_GETFD)?;
    // SAFETY: the handoff names this fd as ours (the previous image left it open across
    // exec for us), it is open (checked above), and nothing else in this process owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(super) fn unsafe_borrow(fd: RawFd) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: each use is one fcntl call on an fd this process holds open across it (one
    // kept open across exec for us, or the readiness pipe's end its caller owns).
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

/// The file (device, inode) an fd number names now, if it is open: tells a file still
/// held from a new one that took its number.
pub fn file_of_raw(fd: RawFd) -> Option<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a whole `struct stat` into the buffer it is given, which is
    // only read after it says it did; an fd number that is not open is refused (EBADF),
    // not used.
    let rc = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, so the buffer is initialised.
    let st = unsafe { st.assume_init() };
    Some((st.st_dev, st.st_ino))
}

/// Takes fd number `fd` out of an epoll set. The caller has just checked that the number
/// still names the file it registered (`file_of_raw`): nix's `delete` wants a borrowed
/// fd, which a bare number is not.
pub fn epoll_delete_raw(epoll: &nix::sys::epoll::Epoll, fd: RawFd) {
    // SAFETY: EPOLL_CTL_DEL reads no event (a null pointer is allowed since Linux
    // 2.6.9) and only looks the number up; a number not in the set is refused (ENOENT).
    let rc = unsafe {
        libc::epoll_ctl(
            epoll.0.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            fd,
            std::ptr::null_mut(),
        )
    };
    if rc != 0 {
        log::debug!("epoll: fd {fd}: {}", io::Error::last_os_error());
    }
}
