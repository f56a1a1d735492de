//! The syslog socket: a Unix datagram socket at `[supd] syslog`, mode 0666 as
//! `/dev/log` is, with SO_PASSCRED so each datagram carries its sender's pid, and
//! SO_PASSPIDFD where the kernel has it, so that it carries a pidfd of the sender too,
//! which tells the sender's cgroup even once the sender is reaped (`Datagram`). Read
//! without blocking, a bounded number of datagrams per wake-up. Kept across `reexec`
//! (the handoff names its fd); its file is removed when it is dropped (a reload that
//! moves it, supd's exit).

use nix::sys::socket::{
    bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, UnixAddr,
};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Datagrams read per wake-up at most: a flood cannot starve the loop.
pub const PER_WAKE: usize = 256;
/// The longest datagram read whole (longer ones are cut).
const DATAGRAM_MAX: usize = 8192;

/// One message read, with what the kernel said of its sender.
#[derive(Debug)]
pub struct Datagram {
    /// Its sender's pid (0 when supd cannot see it: another pid namespace).
    pub pid: i32,
    /// The id of its sender's cgroup (v2) as the sender's pidfd tells it, also once the
    /// sender is reaped; `None` on kernels that pass no pidfd (before 6.5) or tell no
    /// reaped process's (before 6.16).
    pub cgroup: Option<u64>,
    pub data: Vec<u8>,
}

/// The bound socket.
pub struct Listener {
    fd: OwnedFd,
    path: PathBuf,
}

impl Listener {
    /// Binds a socket at `path`. A stale socket file there (nobody answers) is replaced;
    /// one another process answers on (a syslog daemon) is refused, as is a file that is
    /// no socket.
    pub fn bind(path: &Path) -> Result<Listener, String> {
        let at = path.display();
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() || m.file_type().is_symlink() => {
                if answers(path) {
                    return Err(format!(
                        "{at} is served by another process ({}): stop it, or set [supd] syslog to another path",
                        holder(path)
                    ));
                }
                std::fs::remove_file(path)
                    .map_err(|e| format!("cannot remove the stale socket {at}: {e}"))?;
            }
            Ok(_) => return Err(format!("{at} exists and is not a socket: it is left alone")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot look at {at}: {e}")),
        }
        let fail = |what: &str, e: nix::Error| format!("cannot {what} {at}: {e}");
        let fd = socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(|e| fail("make a socket for", e))?;
        setsockopt(&fd, sockopt::PassCred, &true).map_err(|e| fail("ask credentials on", e))?;
        ask_pidfds(fd.as_fd());
        let addr = UnixAddr::new(path).map_err(|e| fail("address", e))?;
        bind(fd.as_raw_fd(), &addr).map_err(|e| fail("bind", e))?;
        // From here on, dropping it removes the file.
        let l = Listener {
            fd,
            path: path.to_path_buf(),
        };
        // Every user may log, as to /dev/log (bind's mode is cut by the umask).
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
            .map_err(|e| format!("cannot set the mode of {at}: {e}"))?;
        Ok(l)
    }

    /// The socket a previous image handed over (one bound by an older supd gets its
    /// senders' pidfds from now on).
    pub fn adopt(fd: OwnedFd, path: PathBuf) -> Listener {
        ask_pidfds(fd.as_fd());
        Listener { fd, path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// What a `reexec` carries: its fd (named in `fds`, kept open across the exec) and
    /// its path.
    pub fn carry<'a>(&'a self, fds: &mut Vec<BorrowedFd<'a>>) -> (RawFd, PathBuf) {
        fds.push(self.fd());
        (self.fd.as_raw_fd(), self.path.clone())
    }

    /// The datagrams waiting now, at most [`PER_WAKE`].
    pub fn drain(&self) -> Vec<Datagram> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; DATAGRAM_MAX];
        for _ in 0..PER_WAKE {
            let Some(d) = recv(self.fd.as_fd(), &mut buf) else {
                break;
            };
            out.push(d);
        }
        out
    }
}

/// SO_PASSPIDFD, where the kernel has it (Linux 6.5); without it a sender reaped
/// before its message is read cannot be placed, which is said once.
fn ask_pidfds(fd: BorrowedFd<'_>) {
    if let Err(e) = crate::sys::pass_pidfd(fd) {
        log::info!(
            "syslog: no senders' pidfds ({e}; Linux 6.5 has them): a message whose sender has exited before supd reads it goes to supd's own log"
        );
    }
}

/// One datagram, if one waits: its sender's pid and, through the pidfd that came with it
/// (closed here, as are any fds a sender attached), its sender's cgroup.
fn recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Option<Datagram> {
    let got = crate::notify::recv_unix(fd, buf)?;
    let len = got.len.min(DATAGRAM_MAX);
    Some(Datagram {
        pid: got.pid,
        cgroup: (got.pidfd.as_ref()).and_then(|p| crate::sys::pidfd_cgroup_id(p.as_fd())),
        data: buf[..len].to_vec(),
    })
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether a process answers on the socket at `path` (a connect succeeds).
fn answers(path: &Path) -> bool {
    std::os::unix::net::UnixDatagram::unbound().is_ok_and(|s| s.connect(path).is_ok())
}

/// Which syslog daemon likely holds `path`, in words: systemd-journald when it is the
/// link to journald's socket.
fn holder(path: &Path) -> String {
    match std::fs::read_link(path) {
        Ok(to) if to.to_string_lossy().contains("systemd/journal") => {
            format!("systemd-journald, through the link to {}", to.display())
        }
        _ => "a syslog daemon: rsyslogd, syslog-ng, busybox syslogd or systemd-journald".into(),
    }
}

#[cfg(test)]
mod tests {
    // Test code: an `expect` here fails a test, never supd.
    use super::*;

    fn scratch(name: &str) -> crate::scratch::Scratch {
        crate::scratch::Scratch::new(&format!("syslog-{name}"))
    }

    #[test]
    fn a_stale_socket_is_replaced_a_served_one_refused() {
        let dir = scratch("bind");
        let path = dir.join("log");
        // Stale: bound once, its socket closed, its file left.
        drop(std::os::unix::net::UnixDatagram::bind(&path).expect("bind"));
        let l = Listener::bind(&path).expect("a stale file is replaced");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o666);
        // Another listener there now: refused, naming the path.
        let e = Listener::bind(&path).err().expect("refused");
        assert!(
            e.contains(&path.display().to_string()) && e.contains("served"),
            "{e}"
        );
        let s = std::os::unix::net::UnixDatagram::unbound().expect("socket");
        s.send_to(b"<13>t: one", &path).expect("send");
        let got = l.drain();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].pid, std::process::id() as i32);
        assert_eq!(got[0].data, b"<13>t: one");
        assert!(l.drain().is_empty(), "nothing left, no blocking");
        drop(l);
        assert!(!path.exists(), "its file goes with it");
        std::fs::write(&path, "x").expect("file");
        assert!(
            Listener::bind(&path).is_err(),
            "a file that is no socket is left alone"
        );
    }

    /// Linux `major.minor` of this kernel.
    fn kernel() -> (u32, u32) {
        let r = nix::sys::utsname::uname().expect("uname");
        let r = r.release().to_string_lossy().into_owned();
        let mut n = r
            .split(|c: char| !c.is_ascii_digit())
            .map(|x| x.parse().unwrap_or(0));
        (n.next().unwrap_or(0), n.next().unwrap_or(0))
    }

    /// A sender that has sent, exited and been reaped before its message is read is
    /// still known by its cgroup (the pidfd the kernel passed with the message).
    #[test]
    fn a_reaped_sender_is_known_by_its_cgroup() {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let own = own.lines().find_map(|l| l.strip_prefix("0::"));
        let id = own.and_then(|p| std::fs::metadata(format!("/sys/fs/cgroup{p}")).ok());
        let Some(id) = id.map(|m| std::os::unix::fs::MetadataExt::ino(&m)) else {
            eprintln!("skipped: no cgroup v2 hierarchy at /sys/fs/cgroup");
            return;
        };
        if kernel() < (6, 16) {
            eprintln!(
                "skipped: Linux {:?} passes no pidfd of a reaped sender",
                kernel()
            );
            return;
        }
        let dir = scratch("reaped");
        let path = dir.join("log");
        let l = Listener::bind(&path).expect("bind");
        let mut sender = std::process::Command::new("logger")
            .arg("-u")
            .arg(&path)
            .arg("from-a-reaped-sender")
            .spawn()
            .expect("logger");
        let pid = sender.id() as i32;
        assert!(sender.wait().expect("reaped").success());
        let got = l.drain();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].pid, got[0].cgroup), (pid, Some(id)));
        assert!(String::from_utf8_lossy(&got[0].data).contains("from-a-reaped-sender"));
    }
}
