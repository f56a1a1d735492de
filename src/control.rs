//! The control socket: accepting clients, their credentials, and their buffers.
//!
//! Nothing a client does can block supd: sockets are non-blocking, a request line is at
//! most 64 KiB, a client whose unread answers pass [`WRITE_MAX`] is dropped, and at most
//! [`MAX_CLIENTS`] are connected. Which commands a client may use is decided once, at
//! accept, from `SO_PEERCRED`.

use crate::protocol::{self, Error, ErrorKind, Request, MAX_REQUEST};
use nix::sys::socket::{getsockopt, sockopt};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Connected clients at most; more are answered with an error and closed.
pub const MAX_CLIENTS: usize = 64;
/// Unsent bytes a client may have pending before it is dropped.
pub const WRITE_MAX: usize = 4 << 20;

/// What a client may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Root, or supd's own user.
    Full,
    /// A member of `socket_group`: read-only commands.
    ReadOnly,
    None,
}

/// One connection.
pub struct Client {
    stream: UnixStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    pub access: Access,
    pub uid: u32,
    pub pid: i32,
    /// Receives `watch` events.
    pub watching: bool,
    /// Receives the output of this service (`log -f`).
    pub following: Option<String>,
    /// An answer is owed (a `stop` waiting for the service to end): later requests wait.
    pub parked: bool,
    /// Close once the write buffer is flushed.
    closing: bool,
    dead: bool,
}

/// The listening socket and its clients.
pub struct Server {
    listener: UnixListener,
    pub path: PathBuf,
    pub clients: BTreeMap<u64, Client>,
    next_id: u64,
    group: Option<u32>,
}

/// Whether a supd already answers on `path`.
pub fn in_use(path: &Path) -> bool {
    UnixStream::connect(path).is_ok()
}

impl Server {
    /// Binds the socket (replacing a stale file), mode 0660, group `group` when it can.
    /// Refuses when a live supd already answers there.
    pub fn bind(path: &Path, group: Option<&str>) -> io::Result<Server> {
        if in_use(path) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another supd is already serving {}; stop it first, or give this one another socket", path.display()),
            ));
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        match std::fs::remove_file(path) {
            Ok(()) => log::info!("replaced the stale socket {}", path.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
        let gid = group.and_then(|g| lookup_group(path, g));
        Ok(Server {
            listener,
            path: path.to_path_buf(),
            clients: BTreeMap::new(),
            next_id: 1,
            group: gid,
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// The listening socket of a previous supd image: never closed, so clients that
    /// connect meanwhile wait in its backlog.
    pub fn adopt(fd: std::os::fd::OwnedFd, path: &Path, group: Option<&str>) -> io::Result<Server> {
        let listener = UnixListener::from(fd);
        listener.set_nonblocking(true)?;
        let gid = group
            .and_then(|g| nix::unistd::Group::from_name(g).ok().flatten())
            .map(|g| g.gid.as_raw());
        Ok(Server {
            listener,
            path: path.to_path_buf(),
            clients: BTreeMap::new(),
            next_id: 1,
            group: gid,
        })
    }

    /// Accepts every waiting connection.
    pub fn accept(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    log::warn!("accept on {}: {e}", self.path.display());
                    return;
                }
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let (uid, gid, pid) = match getsockopt(&stream, sockopt::PeerCredentials) {
                Ok(c) => (c.uid(), c.gid(), c.pid()),
                Err(_) => continue,
            };
            let access = self.access_for(uid, gid);
            let mut client = Client {
                stream,
                rbuf: Vec::new(),
                wbuf: Vec::new(),
                access,
                uid,
                pid,
                watching: false,
                following: None,
                parked: false,
                closing: false,
                dead: false,
            };
            if self.clients.len() >= MAX_CLIENTS {
                let e = Error::new(
                    ErrorKind::Failed,
                    format!("too many connections (at most {MAX_CLIENTS})"),
                );
                client.send(&protocol::encode_err(&Value::Null, &e));
                client.closing = true;
                client.flush();
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            self.clients.insert(id, client);
        }
    }

    fn access_for(&self, uid: u32, gid: u32) -> Access {
        if uid == 0 || uid == nix::unistd::geteuid().as_raw() {
            return Access::Full;
        }
        let Some(g) = self.group else {
            return Access::None;
        };
        if gid == g {
            return Access::ReadOnly;
        }
        let user = nix::unistd::User::from_uid(uid.into()).ok().flatten();
        let group = nix::unistd::Group::from_gid(g.into()).ok().flatten();
        match (user, group) {
            (Some(u), Some(gr)) if gr.mem.contains(&u.name) || u.gid.as_raw() == g => {
                Access::ReadOnly
            }
            _ => Access::None,
        }
    }

    /// Reads what a client sent into its buffer (bounded; a peer that hung up is marked).
    pub fn read(&mut self, id: u64) {
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        let mut buf = [0u8; 16 * 1024];
        loop {
            match c.stream.read(&mut buf) {
                Ok(0) => {
                    c.dead = true;
                    break;
                }
                Ok(n) => {
                    c.rbuf.extend_from_slice(&buf[..n]);
                    if c.rbuf.len() > MAX_REQUEST * 2 {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    c.dead = true;
                    break;
                }
            }
        }
    }

    /// The next complete request of a client that is not parked: decoded, or the error
    /// answer to send. `None` when there is none to handle now.
    pub fn next_request(&mut self, id: u64) -> Option<Result<Request, (Value, Error)>> {
        let c = self.clients.get_mut(&id)?;
        loop {
            if c.parked || c.closing || c.dead {
                return None;
            }
            let nl = c.rbuf.iter().position(|&b| b == b'\n');
            // A line (finished or not) past the limit: the stream cannot be trusted to
            // resynchronise, so answer once and close.
            if nl.unwrap_or(c.rbuf.len()) > MAX_REQUEST {
                c.rbuf.clear();
                c.closing = true;
                return Some(Err((
                    Value::Null,
                    Error::new(
                        ErrorKind::BadRequest,
                        "request line longer than 64 KiB; closing the connection",
                    ),
                )));
            }
            let nl = nl?;
            let line: Vec<u8> = c.rbuf.drain(..=nl).collect();
            let trimmed = line[..nl].strip_suffix(b"\r").unwrap_or(&line[..nl]);
            if !trimmed.iter().all(u8::is_ascii_whitespace) {
                return Some(protocol::decode(trimmed));
            }
        }
    }

    /// Queues bytes for a client and tries to send them now.
    pub fn send(&mut self, id: u64, bytes: &[u8]) {
        if let Some(c) = self.clients.get_mut(&id) {
            c.send(bytes);
            c.flush();
        }
    }

    /// Sends an event line to every watching client.
    pub fn broadcast(&mut self, bytes: &[u8]) {
        for c in self.clients.values_mut().filter(|c| c.watching) {
            c.send(bytes);
            c.flush();
        }
    }

    /// Sends output lines of `service` to its followers.
    pub fn broadcast_log(&mut self, service: &str, lines: &[String]) {
        for c in self
            .clients
            .values_mut()
            .filter(|c| c.following.as_deref() == Some(service))
        {
            for l in lines {
                c.send(&protocol::line(
                    serde_json::json!({"event": "log", "service": service, "line": l}),
                ));
            }
            c.flush();
        }
    }

    /// Writes what can be written to a client.
    pub fn flush(&mut self, id: u64) {
        if let Some(c) = self.clients.get_mut(&id) {
            c.flush();
        }
    }

    /// Removes clients that hung up, failed, or finished closing.
    pub fn reap(&mut self) -> Vec<u64> {
        let gone: Vec<u64> = self
            .clients
            .iter()
            .filter(|(_, c)| c.dead || (c.closing && c.wbuf.is_empty()))
            .map(|(id, _)| *id)
            .collect();
        for id in &gone {
            self.clients.remove(id);
        }
        gone
    }

    /// The fds to poll and whether each needs POLLOUT.
    pub fn client_fds(&self) -> impl Iterator<Item = (u64, BorrowedFd<'_>, bool)> {
        self.clients
            .iter()
            .map(|(id, c)| (*id, c.stream.as_fd(), !c.wbuf.is_empty()))
    }
}

impl Client {
    fn send(&mut self, bytes: &[u8]) {
        if self.dead {
            return;
        }
        if self.wbuf.len() + bytes.len() > WRITE_MAX {
            log::warn!(
                "client pid {} does not read its answers; disconnecting it",
                self.pid
            );
            self.dead = true;
            self.wbuf.clear();
            return;
        }
        self.wbuf.extend_from_slice(bytes);
    }

    fn flush(&mut self) {
        while !self.wbuf.is_empty() && !self.dead {
            match self.stream.write(&self.wbuf) {
                Ok(0) => self.dead = true,
                Ok(n) => {
                    self.wbuf.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.dead = true,
            }
        }
    }
}

/// Gives the socket to `group` when supd may (it is root); otherwise says why not.
fn lookup_group(path: &Path, group: &str) -> Option<u32> {
    let g = match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => g,
        _ => {
            log::info!(
                "socket_group '{group}' does not exist; only root and supd's own user may use {}",
                path.display()
            );
            return None;
        }
    };
    if let Err(e) = nix::unistd::chown(path, None, Some(g.gid)) {
        log::warn!(
            "cannot give {} to group '{group}': {e}; its members cannot connect",
            path.display()
        );
    }
    Some(g.gid.as_raw())
}
