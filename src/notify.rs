//! The sd_notify socket: a datagram socket passed to `ready = "notify"` services as
//! `NOTIFY_SOCKET`. Each datagram carries the sender's credentials (SO_PASSCRED), so a
//! `READY=1` is accepted only from the service's own process group.

use nix::sys::socket::{
    bind, recvmsg, setsockopt, socket, sockopt, AddressFamily, ControlMessageOwned, MsgFlags,
    SockFlag, SockType, UnixAddr,
};
use std::io::IoSliceMut;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// One datagram: who sent it and its `KEY=value` lines.
#[derive(Debug, PartialEq, Eq)]
pub struct Message {
    pub pid: i32,
    pub fields: Vec<(String, String)>,
}

/// The bound socket.
pub struct NotifySocket {
    fd: OwnedFd,
    pub path: PathBuf,
}

impl NotifySocket {
    /// Binds a fresh socket at `path` (a stale file there is replaced).
    pub fn bind(path: &Path) -> nix::Result<NotifySocket> {
        let fd = socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )?;
        let _ = std::fs::remove_file(path);
        bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &UnixAddr::new(path)?)?;
        setsockopt(&fd, sockopt::PassCred, &true)?;
        Ok(NotifySocket {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The socket of a previous supd image.
    pub fn adopt(fd: OwnedFd, path: PathBuf) -> NotifySocket {
        NotifySocket { fd, path }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Every datagram waiting now (bounded to a few hundred per wake-up).
    pub fn drain(&self) -> Vec<Message> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        for _ in 0..256 {
            let mut cmsg = nix::cmsg_space!(nix::sys::socket::UnixCredentials);
            let mut iov = [IoSliceMut::new(&mut buf)];
            let fd = std::os::fd::AsRawFd::as_raw_fd(&self.fd);
            let Ok(msg) = recvmsg::<()>(fd, &mut iov, Some(&mut cmsg), MsgFlags::MSG_DONTWAIT)
            else {
                break;
            };
            let mut pid = 0;
            if let Ok(cmsgs) = msg.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::ScmCredentials(cred) = c {
                        pid = cred.pid();
                    }
                }
            }
            let len = msg.bytes;
            out.push(Message {
                pid,
                fields: parse(&buf[..len]),
            });
        }
        out
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `KEY=value` lines of one datagram.
pub fn parse(data: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(data)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fields() {
        assert_eq!(
            parse(b"READY=1\nSTATUS=warming up\nbogus\n"),
            vec![
                ("READY".into(), "1".into()),
                ("STATUS".into(), "warming up".into())
            ]
        );
    }

    #[test]
    fn receives_with_the_sender_pid() {
        let path = std::env::temp_dir().join(format!("sup-notify-{}.sock", std::process::id()));
        let sock = NotifySocket::bind(&path).expect("bind");
        let tx = std::os::unix::net::UnixDatagram::unbound().expect("socket");
        tx.send_to(b"READY=1\n", &path).expect("send");
        let got = sock.drain();
        assert_eq!(
            got,
            vec![Message {
                pid: std::process::id() as i32,
                fields: vec![("READY".into(), "1".into())]
            }]
        );
        assert!(sock.drain().is_empty());
    }
}
