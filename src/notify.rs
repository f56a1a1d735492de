//! sd_notify sockets: one datagram socket per `ready = "notify"` service, passed to it as
//! `NOTIFY_SOCKET`, so the socket a datagram arrives on names the service (as nitro's
//! per-service readiness pipe does) and no lookup of the sender is needed to find it.
//!
//! Who may send: the sockets live in `SOCKET.notify.d/` beside the control socket, a
//! directory of supd's user with mode 0711 (others reach a socket whose name they know
//! but cannot list them); each socket file is owned by the user the service runs as,
//! mode 0600, so only that user and root can send at all. The sender's pid
//! (SCM_CREDENTIALS) then only refuses a sender that is alive and provably outside the
//! service: not its main process, not in its process group or session, not one of its
//! descendants. A sender that has exited before supd reads its datagram
//! (`systemd-notify --ready`, a `socat` one-liner) cannot be placed and is accepted: the
//! socket's owner already limits it to the service's user.
//!
//! The sockets are kept across restarts of their service and across `reexec` (the
//! handoff names their fds), and removed with the service.
//!
//! The notify part: each service's `Inbox` (held by its slot) keeps its socket, the last
//! `STATUS=` it sent and the rate of its refusals in private fields; `Legacy` holds the
//! one socket of a supd from before per-service sockets. `supervisor/notify.rs` routes
//! what their messages say. It imports no part and not the coordinator.

use crate::proc::Stat;
use crate::time::Mono;
use nix::sys::socket::{
    bind, recvmsg, setsockopt, socket, sockopt, AddressFamily, ControlMessageOwned, MsgFlags,
    SockFlag, SockType, UnixAddr,
};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};
use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The longest path a socket address holds: `sun_path` is 108 bytes with its NUL, and
/// sd_notify clients refuse a `NOTIFY_SOCKET` that fills it.
pub const PATH_MAX: usize = 107;

/// One datagram: who sent it, its `KEY=value` lines and the fds it carried
/// (SCM_RIGHTS: an `FDSTORE=1`'s; closed unless something keeps them).
#[derive(Debug)]
pub struct Message {
    /// The sender's pid as the kernel saw it at send time (0 when it is in a pid
    /// namespace supd cannot see).
    pub pid: i32,
    pub fields: Vec<(String, String)>,
    pub fds: Vec<OwnedFd>,
    /// The kernel dropped some of its fds (more than supd takes in one message).
    pub fds_cut: bool,
}

impl Message {
    /// The value of `key`, its last if it is there several times.
    pub fn get(&self, key: &str) -> Option<&str> {
        (self.fields.iter().rev())
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// A bound notify socket; its file is removed when it is dropped.
pub struct NotifySocket {
    fd: OwnedFd,
    pub path: PathBuf,
}

impl NotifySocket {
    /// What a `reexec` carries of it: its fd (named in `fds`, kept open across the
    /// exec) and its path.
    fn carry<'a>(&'a self, fds: &mut Vec<BorrowedFd<'a>>) -> (RawFd, PathBuf) {
        fds.push(self.fd());
        (self.fd().as_raw_fd(), self.path.clone())
    }

    /// Binds a fresh socket at `path` (a stale file there is replaced). The file is
    /// created with mode 0600 (set on the socket before `bind`, so it is never open to
    /// others, whatever the umask) and given to `owner` when that is another user.
    pub fn bind(path: &Path, owner: Option<u32>) -> Result<NotifySocket, String> {
        let fail = |what: &str, e: nix::Error| format!("cannot {what} {}: {e}", path.display());
        let fd = socket(
            AddressFamily::Unix,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(|e| fail("make a socket for", e))?;
        setsockopt(&fd, sockopt::PassCred, &true).map_err(|e| fail("ask credentials on", e))?;
        // Linux creates the file with the socket inode's mode (less the umask).
        nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o600))
            .map_err(|e| fail("set the mode of", e))?;
        let addr = UnixAddr::new(path).map_err(|e| fail("address", e))?;
        let _ = std::fs::remove_file(path);
        bind(fd.as_raw_fd(), &addr).map_err(|e| fail("bind", e))?;
        // From here on, dropping the socket removes the file.
        let sock = NotifySocket {
            fd,
            path: path.to_path_buf(),
        };
        if let Some(uid) = owner.filter(|u| *u != nix::unistd::geteuid().as_raw()) {
            nix::unistd::chown(path, Some(uid.into()), None)
                .map_err(|e| format!("cannot give {} to uid {uid}: {e}", path.display()))?;
        }
        Ok(sock)
    }

    /// A socket handed over by a previous supd image.
    pub fn adopt(fd: OwnedFd, path: PathBuf) -> NotifySocket {
        NotifySocket { fd, path }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Whether its file is still in place (a cleaner of /run may have removed it).
    pub(crate) fn in_place(&self) -> bool {
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.file_type().is_socket())
    }

    /// Every datagram waiting now (bounded to a few hundred per wake-up).
    pub fn drain(&self) -> Vec<Message> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        for _ in 0..256 {
            let Some(got) = recv_unix(self.fd.as_fd(), &mut buf) else {
                break;
            };
            out.push(Message {
                pid: got.pid,
                fields: parse(&buf[..got.len]),
                fds: got.fds,
                fds_cut: got.cut,
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

/// A service's notify part: its socket (made at its first start as a notify service),
/// the last `STATUS=` it sent, and its refused messages not told yet.
#[derive(Default)]
pub struct Inbox {
    /// The `NOTIFY_SOCKET` of a notify service.
    socket: Option<NotifySocket>,
    /// The last `STATUS=` of a notify service.
    status_text: Option<String>,
    /// Messages refused and not told yet, and when refusals were last told: at most
    /// once a second, so that a flood cannot flood supd's log in turn.
    refused: crate::time::Throttle,
}

impl Inbox {
    /// Its socket's path, while it has one.
    pub fn path(&self) -> Option<&Path> {
        self.socket.as_ref().map(|s| s.path.as_path())
    }

    /// Its socket's fd, to poll.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.socket.as_ref().map(NotifySocket::fd)
    }

    /// Whether it holds the socket at `path`.
    pub fn holds(&self, path: &Path) -> bool {
        self.path() == Some(path)
    }

    /// Its socket is closed (and its file removed): the service is no notify service now.
    pub fn close(&mut self) {
        self.socket = None;
    }

    /// Before a start: its socket at `path`, still in place, emptied of what was sent
    /// before; how many messages were dropped. `None` when it has none there.
    pub fn reuse(&self, path: &Path) -> Option<usize> {
        let sock = self
            .socket
            .as_ref()
            .filter(|s| s.path == path && s.in_place())?;
        Some(sock.drain().len())
    }

    /// A fresh socket at `path` in `dir` (made ready first), given to `owner`; the one
    /// it had is closed first.
    pub fn bind(&mut self, dir: &Path, path: &Path, owner: u32) -> Result<(), String> {
        self.socket = None;
        prepare_dir(dir, false)?;
        self.socket = Some(NotifySocket::bind(path, Some(owner))?);
        Ok(())
    }

    /// Every datagram waiting on its socket; `None` when it has none.
    pub fn drain(&self) -> Option<Vec<Message>> {
        self.socket.as_ref().map(NotifySocket::drain)
    }

    /// The last `STATUS=` it sent.
    pub fn status_text(&self) -> Option<&str> {
        self.status_text.as_deref()
    }

    /// `STATUS=text`.
    pub fn set_status(&mut self, text: String) {
        self.status_text = Some(text);
    }

    /// `n` messages were refused now: how many to tell since the last telling, when a
    /// second has passed since it (then told at `now`); `None` to keep counting.
    pub fn refused(&mut self, n: usize, now: Mono) -> Option<usize> {
        self.refused.hit(n, now)
    }

    /// What a `reexec` carries, naming its socket's fd in `fds`.
    pub fn carry<'a>(&'a self, fds: &mut Vec<BorrowedFd<'a>>) -> Carried {
        let notify = self.socket.as_ref().map(|n| n.carry(fds));
        Carried {
            status_text: self.status_text.clone(),
            notify,
        }
    }

    /// Takes over what a previous image carried, and why its socket could not be
    /// taken over, if it could not (it has none then).
    pub fn adopt(c: Carried) -> (Inbox, Option<std::io::Error>) {
        let mut lost = None;
        let socket = c
            .notify
            .and_then(|(fd, path)| match crate::sys::adopt_fd(fd) {
                Ok(fd) => Some(NotifySocket::adopt(fd, path)),
                Err(e) => {
                    lost = Some(e);
                    None
                }
            });
        let inbox = Inbox {
            socket,
            status_text: c.status_text,
            refused: Default::default(),
        };
        (inbox, lost)
    }
}

/// A service's notify part as the handoff carries it: flattened into its
/// `ServiceState`, under the names of every format.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Carried {
    /// The last `STATUS=`.
    #[serde(default)]
    status_text: Option<String>,
    /// Its socket and the socket's path (format 2).
    #[serde(default)]
    notify: Option<(RawFd, PathBuf)>,
}

/// The single socket of a supd from before per-service sockets, handed over by its
/// `reexec`: the services it started still send there.
#[derive(Default)]
pub struct Legacy {
    socket: Option<NotifySocket>,
}

impl Legacy {
    pub fn new(socket: Option<NotifySocket>) -> Legacy {
        Legacy { socket }
    }

    /// Its fd, to poll, while there is one.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.socket.as_ref().map(NotifySocket::fd)
    }

    /// Every datagram waiting; `None` when there is no such socket.
    pub fn drain(&self) -> Option<Vec<Message>> {
        self.socket.as_ref().map(NotifySocket::drain)
    }

    /// What a `reexec` carries (the handoff's `notify`), naming its fd in `fds`.
    pub fn carry<'a>(&'a self, fds: &mut Vec<BorrowedFd<'a>>) -> Option<(RawFd, PathBuf)> {
        self.socket.as_ref().map(|n| n.carry(fds))
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

/// The directory of the services' sockets, beside the control socket.
pub fn dir_for(control_socket: &Path) -> PathBuf {
    let mut d = control_socket.as_os_str().to_owned();
    d.push(".notify.d");
    PathBuf::from(d)
}

/// The socket of service `name` in `dir`: `dir/NAME`, or `dir/+HASH` (16 hex digits of
/// FNV-1a; `+` is never in a service name) when that would not fit in a socket address.
pub fn socket_path(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let plain = dir.join(name);
    if plain.as_os_str().len() <= PATH_MAX {
        return Ok(plain);
    }
    let hashed = dir.join(format!("+{:016x}", fnv1a(name.as_bytes())));
    if hashed.as_os_str().len() <= PATH_MAX {
        return Ok(hashed);
    }
    Err(format!(
        "its notify socket cannot be made: {} is too long for a socket address \
         ({PATH_MAX} bytes with a 17-byte name); give supd a shorter socket path",
        dir.display()
    ))
}

/// FNV-1a, 64 bits: stable across versions of supd and Rust, unlike `DefaultHasher`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Makes `dir` ready to hold the sockets: a directory of supd's user with mode 0711. What
/// else is there under that name (a file, a symlink, a directory of someone else) is
/// removed first, and with `clear` so is every socket a previous supd left in it.
pub fn prepare_dir(dir: &Path, clear: bool) -> Result<(), String> {
    let me = nix::unistd::geteuid().as_raw();
    let fail = |what: &str, e: std::io::Error| format!("cannot {what} {}: {e}", dir.display());
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() && m.uid() == me && !clear => {}
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(dir).map_err(|e| fail("clear", e))?,
        Ok(_) => std::fs::remove_file(dir).map_err(|e| fail("remove", e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail("look at", e)),
    }
    match std::fs::DirBuilder::new().mode(0o711).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(fail("create", e)),
    }
    // The umask may have taken bits away from 0711, or an older directory had others.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
        .map_err(|e| fail("set the mode of", e))
}

/// Where the sender of a datagram stands relative to the service it was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender {
    /// Alive and inside: the main process, its process group or session, or below it.
    Inside,
    /// Exited before supd looked (its pid names nobody now): it cannot be placed.
    Gone,
    /// Alive (or a pid supd cannot see) and not inside: refused.
    Outside,
}

/// Places `pid` relative to the service whose main process `leader` leads its process
/// group and session. `stat` looks a process up (in /proc); the ancestry walk is bounded.
pub fn place(pid: i32, leader: i32, stat: impl Fn(i32) -> Option<Stat>) -> Sender {
    if pid <= 0 {
        return Sender::Outside;
    }
    let Some(first) = stat(pid) else {
        return Sender::Gone;
    };
    let mut s = first;
    for _ in 0..64 {
        if s.pid == leader || s.pgrp == leader || s.session == leader {
            return Sender::Inside;
        }
        match (s.ppid > 1).then(|| stat(s.ppid)).flatten() {
            Some(parent) => s = parent,
            None => break,
        }
    }
    Sender::Outside
}

/// The most fds supd takes from one notify message (the kernel's own bound, SCM_MAX_FD).
const FDS_PER_MESSAGE: usize = 253;

/// SCM_PIDFD (`<linux/socket.h>`): the control message of SO_PASSPIDFD.
const SCM_PIDFD: i32 = 4;

/// One datagram read from a Unix socket, with what the kernel passed beside it. Every fd
/// the kernel put in supd's table is owned here (close-on-exec), so that a caller that
/// wants none of them closes them by dropping this: a sender cannot leak fds into supd.
pub(crate) struct Received {
    /// The sender's pid from SCM_CREDENTIALS (0 when the kernel did not say).
    pub pid: i32,
    /// The datagram's length in the buffer.
    pub len: usize,
    /// The fds it carried (SCM_RIGHTS).
    pub fds: Vec<OwnedFd>,
    /// The sender's pidfd (SCM_PIDFD), on a socket with SO_PASSPIDFD.
    pub pidfd: Option<OwnedFd>,
    /// Whether the kernel had to drop some of what came with it.
    pub cut: bool,
}

/// One datagram waiting on `fd` (never waits); `None` when nothing is there, or on an
/// error. The notify sockets and the syslog listener read this way.
pub(crate) fn recv_unix(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Option<Received> {
    let mut cmsg = nix::cmsg_space!(
        nix::sys::socket::UnixCredentials,
        [RawFd; FDS_PER_MESSAGE],
        RawFd
    );
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        fd.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .ok()?;
    let mut got = Received {
        pid: 0,
        len: msg.bytes,
        fds: Vec::new(),
        pidfd: None,
        cut: msg.flags.contains(MsgFlags::MSG_CTRUNC),
    };
    if let Ok(cmsgs) = msg.cmsgs() {
        for c in cmsgs {
            match c {
                ControlMessageOwned::ScmCredentials(cred) => got.pid = cred.pid(),
                ControlMessageOwned::ScmRights(raw) => {
                    (got.fds).extend(raw.into_iter().filter_map(|r| crate::sys::adopt_fd(r).ok()))
                }
                ControlMessageOwned::Unknown(u)
                    if u.cmsg_header.cmsg_level == libc::SOL_SOCKET
                        && u.cmsg_header.cmsg_type == SCM_PIDFD =>
                {
                    let raw = u.data_bytes.get(..4).and_then(|b| b.try_into().ok());
                    got.pidfd = raw.and_then(|b| crate::sys::adopt_fd(i32::from_ne_bytes(b)).ok());
                }
                _ => {}
            }
        }
    }
    Some(got)
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
    fn sockets_are_named_after_their_service_beside_the_control_socket() {
        let dir = dir_for(Path::new("/run/sup/sup.sock"));
        assert_eq!(dir, Path::new("/run/sup/sup.sock.notify.d"));
        assert_eq!(
            socket_path(&dir, "web@0"),
            Ok(PathBuf::from("/run/sup/sup.sock.notify.d/web@0"))
        );
    }

    #[test]
    fn a_name_too_long_for_sun_path_is_hashed_short_and_stable() {
        // 80 bytes of directory: a 64-byte name does not fit, 17 bytes do.
        let dir = PathBuf::from(format!("/{}", "d".repeat(79)));
        let long = "n".repeat(64);
        let p = socket_path(&dir, &long).expect("a hashed path");
        assert_eq!(p, dir.join(format!("+{:016x}", fnv1a(long.as_bytes()))));
        assert!(p.as_os_str().len() <= PATH_MAX);
        assert_eq!(socket_path(&dir, &long), Ok(p.clone()), "stable");
        let other = socket_path(&dir, &"m".repeat(64)).expect("hashed");
        assert_ne!(p, other, "names hash apart");
        // A name that fits stays plain, up to exactly PATH_MAX bytes.
        let fits = "x".repeat(PATH_MAX - 81);
        assert_eq!(socket_path(&dir, &fits), Ok(dir.join(&fits)));
        assert_eq!(dir.join(&fits).as_os_str().len(), PATH_MAX);
        // FNV-1a's published test vector: the hash is the algorithm, not a Rust detail.
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn a_directory_too_long_even_for_a_hash_is_an_error_that_says_what_to_do() {
        let dir = PathBuf::from(format!("/{}", "d".repeat(95)));
        let e = socket_path(&dir, &"n".repeat(40)).expect_err("too long");
        assert!(e.contains("shorter socket path"), "{e}");
    }

    fn stat(pid: i32, ppid: i32, pgrp: i32, session: i32) -> Stat {
        Stat {
            pid,
            state: 'S',
            ppid,
            pgrp,
            session,
            start_time: 1,
        }
    }

    #[test]
    fn senders_are_placed_by_group_session_and_ancestry() {
        // 100 leads the service; 101 its child in the group; 102 a child that made a
        // session of its own; 103 that one's child; 200 a process elsewhere.
        let table = [
            stat(100, 1, 100, 100),
            stat(101, 100, 100, 100),
            stat(102, 101, 102, 102),
            stat(103, 102, 102, 102),
            stat(104, 50, 104, 100),
            stat(200, 1, 200, 200),
            stat(201, 200, 200, 200),
        ];
        let look = |pid: i32| table.iter().find(|s| s.pid == pid).copied();
        let at = |pid| place(pid, 100, look);
        assert_eq!(at(100), Sender::Inside, "the main process");
        assert_eq!(at(101), Sender::Inside, "its process group");
        assert_eq!(
            at(103),
            Sender::Inside,
            "a descendant in a session of its own"
        );
        assert_eq!(at(104), Sender::Inside, "its session, in another group");
        assert_eq!(at(201), Sender::Outside, "another tree");
        assert_eq!(at(999), Sender::Gone, "exited before supd looked");
        assert_eq!(at(0), Sender::Outside, "a pid supd cannot see");
    }

    #[test]
    fn refusals_are_told_at_most_once_a_second_with_their_count() {
        let mut inbox = Inbox::default();
        let s = |n: u64| Mono(n * 1_000_000);
        assert_eq!(inbox.refused(1, s(0)), Some(1), "the first at once");
        assert_eq!(inbox.refused(2, s(500)), None);
        assert_eq!(inbox.refused(3, s(999)), None);
        assert_eq!(inbox.refused(1, s(1000)), Some(6), "counted since");
        assert_eq!(inbox.refused(1, s(1500)), None);
        assert!(inbox.status_text().is_none() && inbox.drain().is_none());
        inbox.set_status("warming up".into());
        let mut fds = Vec::new();
        let c = inbox.carry(&mut fds);
        assert!(fds.is_empty(), "no socket");
        let json = serde_json::to_value(&c).expect("json");
        assert_eq!(
            json,
            serde_json::json!({"status_text": "warming up", "notify": null})
        );
        let (back, lost) = Inbox::adopt(c);
        assert!(lost.is_none());
        assert_eq!(back.status_text(), Some("warming up"));
    }

    #[test]
    fn receives_with_the_sender_pid_on_a_private_socket() {
        let scratch = crate::scratch::Scratch::new("notify");
        let dir = scratch.join("notify");
        prepare_dir(&dir, true).expect("dir");
        let meta = std::fs::metadata(&dir).expect("dir");
        assert_eq!(meta.permissions().mode() & 0o777, 0o711);
        let path = socket_path(&dir, "svc").expect("path");
        let sock = NotifySocket::bind(&path, None).expect("bind");
        let mode = std::fs::metadata(&path)
            .expect("socket")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "only its owner may send");
        let tx = std::os::unix::net::UnixDatagram::unbound().expect("socket");
        tx.send_to(b"READY=1\n", &path).expect("send");
        let got = sock.drain();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].pid, std::process::id() as i32);
        assert_eq!(got[0].fields, [("READY".to_string(), "1".to_string())]);
        assert!(got[0].fds.is_empty());
        // Fds sent along are taken, close-on-exec, and owned by the message.
        let (r, _w) = nix::unistd::pipe().expect("pipe");
        let rights = [r.as_raw_fd()];
        let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&rights)];
        let to = UnixAddr::new(&path).expect("addr");
        nix::sys::socket::sendmsg(
            tx.as_raw_fd(),
            &[std::io::IoSlice::new(b"FDSTORE=1\nFDNAME=conn")],
            &cmsg,
            MsgFlags::empty(),
            Some(&to),
        )
        .expect("sendmsg");
        let got = sock.drain();
        assert_eq!(got[0].get("FDNAME"), Some("conn"));
        assert_eq!(got[0].fds.len(), 1);
        assert!(!got[0].fds_cut);
        let flags = nix::fcntl::fcntl(&got[0].fds[0], nix::fcntl::FcntlArg::F_GETFD).expect("fd");
        assert_ne!(
            flags & libc::FD_CLOEXEC,
            0,
            "a received fd would leak into children"
        );
        assert!(sock.drain().is_empty());
        drop(sock);
        assert!(!path.exists(), "removed with its socket");
        prepare_dir(&dir, true).expect("cleared");
        let _ = std::fs::remove_dir(&dir);
    }
}
