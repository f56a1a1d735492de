//! What the tools' helper processes run and how supd reads and ends them: an install's
//! copy (`copy.rs`, forked by [`fork_copy`]), the pipe a `reexec` check answers on, what
//! a failed copy said, and a killed helper reaped within a bound. Nothing here holds
//! state: the tools part (`tool_state.rs`) holds what
//! supd knows of its tools and helpers, and the coordinator's side
//! (`supervisor/tools.rs` and its files) carries out upgrades, commits, rollbacks,
//! installs, prunes and the reexec check.

pub mod copy;

use crate::sys;
use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;

/// Forks the copy of `src` into `tmp`; returns its pid and the pipe it says why it
/// failed on (one line, within `PIPE_BUF`: the write never blocks).
pub fn fork_copy(
    src: &std::path::Path,
    tmp: &std::path::Path,
    opts: copy::Options,
) -> std::io::Result<(i32, File)> {
    use nix::fcntl::OFlag;
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
    let keep = write.as_raw_fd();
    let pid = sys::fork_worker(keep, move || match copy::copy_tree(src, tmp, opts) {
        Ok(()) => 0,
        Err(why) => {
            let mut line = why.into_bytes();
            line.truncate(libc::PIPE_BUF - 1);
            let _ = nix::unistd::write(&write, &line);
            1
        }
    })?;
    Ok((pid, File::from(read)))
}

/// The pipe a handshake answers on: the write end its stdout, the read end
/// non-blocking (a process the program left behind may hold the write end open).
pub fn answer_pipe() -> std::io::Result<(File, std::os::fd::OwnedFd)> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    fcntl(&read, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    Ok((File::from(read), write))
}

/// What a copy that ended wrote on its pipe.
pub fn read_why(f: &File) -> Option<String> {
    let mut buf = Vec::new();
    let _ = f.take(libc::PIPE_BUF as u64).read_to_end(&mut buf);
    let s = String::from_utf8_lossy(&buf).trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// Reaps `pid` (a child of supd that was sent SIGKILL) by `deadline`; whether it is
/// gone. A pidfd is waited on where the kernel has them; else the wait is polled.
pub fn reap_by(pid: i32, deadline: std::time::Instant) -> bool {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let p = nix::unistd::Pid::from_raw(pid);
    let pidfd = sys::pidfd_open(pid).ok();
    loop {
        match waitpid(p, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::EINTR) => {}
            // Reaped, or not (or no longer) a child: gone either way for supd.
            Ok(_) | Err(_) => return true,
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        match &pidfd {
            Some(fd) => {
                use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
                use std::os::fd::AsFd;
                let ms = PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
                    .unwrap_or(PollTimeout::MAX);
                let _ = poll(&mut [PollFd::new(fd.as_fd(), PollFlags::POLLIN)], ms);
            }
            None => std::thread::sleep(left.min(std::time::Duration::from_millis(5))),
        }
    }
}
