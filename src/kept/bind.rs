//! Binding a `listen` entry: a TCP or Unix stream socket, listening, close-on-exec in
//! supd (each run gets its own copy as fd 3.. by `dup2`, which clears the flag). Errors
//! say what is wrong with the address and what to do.

use crate::config::listen::ListenAddr;
use nix::errno::Errno;
use nix::sys::socket::{
    bind, connect, listen, setsockopt, socket, sockopt, AddressFamily, Backlog, SockFlag, SockType,
    SockaddrIn, SockaddrIn6, UnixAddr,
};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

/// A bound, listening socket, and for a Unix one the (device, inode) of its file: what
/// supd removes is only the file it made.
pub(super) fn bind_listen(addr: &ListenAddr) -> Result<(OwnedFd, Option<(u64, u64)>), String> {
    match addr {
        ListenAddr::Tcp(a) => bind_tcp(addr, a).map(|fd| (fd, None)),
        ListenAddr::Unix(p) => bind_unix(addr, p),
    }
}

fn bind_tcp(addr: &ListenAddr, a: &std::net::SocketAddr) -> Result<OwnedFd, String> {
    let fail = |what: &str, e: Errno| format!("cannot {what} for {addr}: {e}");
    let family = if a.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|e| fail("make a socket", e))?;
    // A port whose last connections are in TIME_WAIT (a supd restarted a moment ago) is
    // bound again at once, as every server does.
    setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(|e| fail("set SO_REUSEADDR", e))?;
    let bound = match a {
        std::net::SocketAddr::V4(v4) => bind(fd.as_raw_fd(), &SockaddrIn::from(*v4)),
        std::net::SocketAddr::V6(v6) => {
            // [::]:80 is IPv6 alone, so that "tcp:0.0.0.0:80" may be listed beside it.
            setsockopt(&fd, sockopt::Ipv6V6Only, &true).map_err(|e| fail("set IPV6_V6ONLY", e))?;
            bind(fd.as_raw_fd(), &SockaddrIn6::from(*v6))
        }
    };
    bound.map_err(|e| match e {
        Errno::EADDRINUSE => format!(
            "cannot bind {addr}: the address is in use (another program listens there: `ss -ltnp` names it; stop it or choose another port)"
        ),
        Errno::EADDRNOTAVAIL => format!(
            "cannot bind {addr}: no interface of this machine has the address {}",
            a.ip()
        ),
        Errno::EACCES => format!(
            "cannot bind {addr}: a port below 1024 needs root (supd runs as uid {})",
            nix::unistd::geteuid()
        ),
        e => fail("bind", e),
    })?;
    listen(&fd, Backlog::MAXCONN).map_err(|e| fail("listen", e))?;
    Ok(fd)
}

fn bind_unix(addr: &ListenAddr, path: &Path) -> Result<(OwnedFd, Option<(u64, u64)>), String> {
    let fail = |what: &str, e: Errno| format!("cannot {what} for {addr}: {e}");
    let dir = path.parent().unwrap_or(Path::new("/"));
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("cannot bind {addr}: {} is not a directory", dir.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "cannot bind {addr}: its directory {} does not exist (make it first, or listen in a runtime_dir)",
                dir.display()
            ))
        }
        Err(e) => return Err(format!("cannot bind {addr}: {}: {e}", dir.display())),
    }
    let sock_addr = UnixAddr::new(path).map_err(|e| fail("make an address", e))?;
    // What is at the path: nothing; a socket nobody listens on (a supd killed before it
    // could remove it), removed; anything else is somebody's, and refused.
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.file_type().is_socket() {
            return Err(format!(
                "cannot bind {addr}: {} exists and is not a socket (supd replaces only a stale socket)",
                path.display()
            ));
        }
        let probe = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(|e| fail("make a socket", e))?;
        match connect(probe.as_raw_fd(), &sock_addr) {
            Err(Errno::ECONNREFUSED) => {
                let _ = std::fs::remove_file(path);
            }
            Ok(()) | Err(Errno::EAGAIN) => {
                return Err(format!(
                    "cannot bind {addr}: another program listens there (`ss -lxp` names it; stop it or choose another path)"
                ))
            }
            Err(e) => return Err(fail("probe the socket at the path", e)),
        }
    }
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| fail("make a socket", e))?;
    bind(fd.as_raw_fd(), &sock_addr).map_err(|e| match e {
        Errno::EADDRINUSE => {
            format!("cannot bind {addr}: the path was taken while supd bound it; try again")
        }
        e => fail("bind", e),
    })?;
    let made = open_to_all(addr, path);
    if let Err(e) = listen(&fd, Backlog::MAXCONN) {
        let _ = std::fs::remove_file(path);
        return Err(fail("listen", e));
    }
    Ok((fd, made))
}

/// The socket file just bound at `path`: anyone may connect, as with systemd's default
/// SocketMode=0666 (the file is the service's user's, its child gives it before it
/// drops root, who may narrow it); its (device, inode). Reached through an fd of the
/// file that follows no link: the directory may be another user's, who could have put
/// a link to a file of root's where the socket was a moment ago.
fn open_to_all(addr: &ListenAddr, path: &Path) -> Option<(u64, u64)> {
    use nix::fcntl::{open, OFlag};
    use nix::sys::stat::{fstat, Mode, SFlag};
    let fd = match open(
        path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) => {
            log::warn!("{addr}: cannot open its file to set its mode to 0666: {e}");
            return None;
        }
    };
    let st = fstat(&fd).ok()?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFSOCK {
        log::warn!(
            "{addr}: its path no longer names the socket supd bound (replaced at once by something else): left alone"
        );
        return None;
    }
    // chmod through /proc/self/fd reaches the file the fd is of, whatever the path is now.
    let own = format!("/proc/self/fd/{}", fd.as_raw_fd());
    if let Err(e) = std::fs::set_permissions(own, std::fs::Permissions::from_mode(0o666)) {
        log::warn!("{addr}: cannot set its mode to 0666: {e}");
    }
    Some((st.st_dev, st.st_ino))
}

/// Removes the file of a Unix socket supd bound, if it is still that file.
pub(super) fn remove_file(path: &Path, made: (u64, u64)) {
    let same = std::fs::symlink_metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == made);
    if same {
        let _ = std::fs::remove_file(path);
    }
}
