//! The syslog socket: a Unix datagram socket at `[supd] syslog`, mode 0666 as
//! `/dev/log` is, with SO_PASSCRED so each datagram carries its sender's pid. Read
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

    /// The socket a previous image handed over.
    pub fn adopt(fd: OwnedFd, path: PathBuf) -> Listener {
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

    /// The datagrams waiting now, at most [`PER_WAKE`]: each with its sender's pid (0
    /// when supd cannot see it).
    pub fn drain(&self) -> Vec<(i32, Vec<u8>)> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; DATAGRAM_MAX];
        for _ in 0..PER_WAKE {
            let Some((pid, len)) = crate::notify::recv_credited(self.fd.as_fd(), &mut buf) else {
                break;
            };
            let len = len.min(DATAGRAM_MAX);
            out.push((pid, buf[..len].to_vec()));
        }
        out
    }
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
        assert_eq!(
            got,
            vec![(std::process::id() as i32, b"<13>t: one".to_vec())]
        );
        assert!(l.drain().is_empty(), "nothing left, no blocking");
        drop(l);
        assert!(!path.exists(), "its file goes with it");
        std::fs::write(&path, "x").expect("file");
        assert!(
            Listener::bind(&path).is_err(),
            "a file that is no socket is left alone"
        );
    }
}
