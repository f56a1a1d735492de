//! The control socket: accepting clients, their credentials, and their buffers.
//!
//! Nothing a client does can block supd or lock anyone out:
//!
//! - sockets are non-blocking, a request line is at most 64 KiB, and a client whose
//!   unread answers pass [`WRITE_MAX`] is dropped (one answer alone may be larger);
//! - at most [`MAX_CLIENTS`] are connected, the last [`RESERVED_SLOTS`] of them only
//!   root or supd's own user; any other uid holds at most [`PER_UID`] connections,
//!   `watch` and `log -f` streams included; more are answered with an error and closed,
//!   except that root and supd's own user, at the limit, displace the longest-idle
//!   connection (not a stream, owed no answer: none of its request unread, in its
//!   buffer or its socket, nor of its answer unwritten; an unprivileged peer's first),
//!   so clients that connect and stall never keep root out, and none loses its answer;
//! - a connection that is not a stream and is not waiting for an answer, and that moves
//!   no byte either way for [`IDLE`], is closed: one of the loop's deadlines, there
//!   only while such a connection exists;
//! - at the open-files limit `accept` fails and the listener stays readable: supd takes
//!   it out of the poll set and gives up a reserve of [`FD_RESERVE`] descriptors, so the
//!   supervision of services has room; it accepts again once the reserve can be taken
//!   back (a connection closed, or every [`ACCEPT_RETRY`] while it waits), and says so
//!   once per episode. Meanwhile new clients wait in the listener's backlog.
//!
//! Which commands a client may use is decided once, at accept, from `SO_PEERCRED`.

use super::follow::Follow;
use crate::protocol::{self, Error, ErrorKind, Request, MAX_REQUEST};
use crate::time::Mono;
use nix::sys::socket::{getsockopt, sockopt};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Connected clients at most; more are answered with an error and closed.
pub const MAX_CLIENTS: usize = 64;
/// Of [`MAX_CLIENTS`], the slots only root and supd's own user may take.
pub const RESERVED_SLOTS: usize = 8;
/// Connections one uid other than root and supd's own may hold, streams included.
pub const PER_UID: usize = 16;
/// A connection that moves no byte for this long, and is neither a stream nor waiting
/// for an answer, is closed.
pub const IDLE: Duration = Duration::from_secs(10);
/// Descriptors held back from clients, given up at the open-files limit.
pub const FD_RESERVE: usize = 16;
/// While accepting is paused at the limit, how often supd tries again.
pub const ACCEPT_RETRY: Duration = Duration::from_secs(1);
/// Unsent bytes a client may have pending before it is dropped.
pub const WRITE_MAX: usize = 4 << 20;

/// What a client may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Root, or supd's own user.
    Full,
    /// A member of `socket_group`: read-only commands.
    ReadOnly,
    /// A member of `control_group`: the read-only commands, and start, stop, restart,
    /// signal and reload of a service (`Command::operates`).
    Operate,
    None,
}

/// One connection.
pub struct Client {
    stream: UnixStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    access: Access,
    uid: u32,
    pid: i32,
    /// Receives `watch` events.
    watching: bool,
    /// Receives the output of these services (`log -f`).
    following: Option<Follow>,
    /// An answer is owed (a `stop` waiting for the service to end): later requests wait.
    parked: bool,
    /// Close once the write buffer is flushed.
    closing: bool,
    /// The client shut down its writing side: what it sent is all there is.
    hung_up: bool,
    dead: bool,
    /// The last byte read from or written to it (or an answer queued for it).
    last_active: Mono,
}

/// The listening socket and its clients.
pub struct Server {
    listener: UnixListener,
    /// A stand-in for a socket that could not be bound yet.
    stand_in: bool,
    path: PathBuf,
    clients: BTreeMap<u64, Client>,
    next_id: u64,
    group: Option<SocketGroup>,
    /// `control_group`, looked up when supd started.
    control: Option<SocketGroup>,
    /// Descriptors kept from clients (dups of the listener), given up at the limit.
    reserve: Vec<OwnedFd>,
    /// Accepting is paused at the open-files limit; try again at this instant.
    paused: Option<Mono>,
    /// An episode at the limit was logged; cleared when the backlog is drained again.
    at_limit: bool,
    /// Refused connections and requests, told at most once a second.
    refusals: Tally,
}

/// Refusals told at most once a second, each with how many there were since the last:
/// every refused request is a client's to make, and a read-only peer must not be able to
/// flood supd's log (and its stderr) with them.
#[derive(Default)]
pub struct Tally {
    untold: u64,
    told: Option<Mono>,
}

impl Tally {
    /// Notes one refusal; how many to tell now (this one and those not told since),
    /// or `None` while the last telling is under a second old.
    pub fn note(&mut self, now: Mono) -> Option<u64> {
        self.untold += 1;
        if self
            .told
            .is_some_and(|t| now.since(t) < Duration::from_secs(1))
        {
            return None;
        }
        self.told = Some(now);
        Some(std::mem::take(&mut self.untold))
    }

    /// When the refusals not told yet are due to be told.
    pub fn deadline(&self) -> Option<Mono> {
        (self.untold > 0).then(|| self.told.unwrap_or(Mono(0)).plus(Duration::from_secs(1)))
    }

    /// The refusals not told, once they are due.
    pub fn due(&mut self, now: Mono) -> Option<u64> {
        if self.deadline().is_some_and(|d| d <= now) {
            self.told = Some(now);
            return Some(std::mem::take(&mut self.untold));
        }
        None
    }
}

/// " (and N more since the last told)", for a telling of `n` refusals.
pub fn more(n: u64) -> String {
    if n > 1 {
        format!(" ({} more refused in the last second, not logged)", n - 1)
    } else {
        String::new()
    }
}

/// Whether a supd already answers on `path`.
/// The supplementary groups of a process, from `/proc/PID/status` (none if it is gone).
fn peer_groups(pid: i32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| l.strip_prefix("Groups:")).map(|g| {
                g.split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// Whether a live supd serves `path`: it answers a `hello` within a second. A socket
/// that accepts but never answers is not one: a child of a killed supd, forked and not
/// yet run, still holds the listener for a moment (it closes it first thing).
pub fn in_use(path: &Path) -> bool {
    use std::io::{BufRead, Write};
    let Ok(mut stream) = UnixStream::connect(path) else {
        return false;
    };
    let wait = Some(std::time::Duration::from_secs(1));
    if stream.set_read_timeout(wait).is_err() || stream.set_write_timeout(wait).is_err() {
        return true;
    }
    if stream.write_all(b"{\"cmd\": \"hello\"}\n").is_err() {
        return false;
    }
    let mut line = String::new();
    matches!(std::io::BufReader::new(stream).read_line(&mut line), Ok(n) if n > 0)
}

impl Server {
    /// `socket_group`'s id, when supd could look it up.
    pub fn group(&self) -> Option<u32> {
        self.group.as_ref().map(|g| g.gid)
    }

    /// `socket_group` as it was looked up when supd started (to bind again with it).
    pub fn socket_group(&self) -> Option<&SocketGroup> {
        self.group.as_ref()
    }

    /// `control_group` as it was looked up when supd started.
    pub fn control_group(&self) -> Option<&SocketGroup> {
        self.control.as_ref()
    }

    /// Binds the socket (replacing a stale file), mode 0660, given to `group` when it
    /// can (else to `control`). Members of `control` reach it too: through an ACL entry
    /// when the socket is `group`'s. Refuses when a live supd already answers there.
    pub fn bind(
        path: &Path,
        group: Option<&SocketGroup>,
        control: Option<&SocketGroup>,
    ) -> io::Result<Server> {
        if in_use(path) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another supd is already serving {}; stop it first, or give this one another socket", path.display()),
            ));
        }
        // Each step says what failed: a bare "File exists" helps nobody.
        let step =
            |what: String| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(step(format!(
                "cannot create its directory {}",
                dir.display()
            )))?;
        }
        match std::fs::remove_file(path) {
            Ok(()) => log::info!("replaced the stale socket {}", path.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(step(format!("cannot remove the stale {}", path.display()))(
                    e,
                ))
            }
        }
        let listener =
            UnixListener::bind(path).map_err(step(format!("cannot bind {}", path.display())))?;
        listener.set_nonblocking(true)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .map_err(step(format!("cannot set the mode of {}", path.display())))?;
        match (group, control) {
            (Some(g), Some(c)) if g.gid != c.gid => {
                g.give(path);
                c.let_in(path);
            }
            (Some(g), _) | (None, Some(g)) => g.give(path),
            (None, None) => {}
        }
        Ok(Server::new(
            listener,
            path,
            group.cloned(),
            control.cloned(),
        ))
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.listener.as_fd()
    }

    /// The listening socket of a previous supd image: never closed, so clients that
    /// connect meanwhile wait in its backlog.
    pub fn adopt(
        fd: std::os::fd::OwnedFd,
        path: &Path,
        group: Option<&SocketGroup>,
        control: Option<&SocketGroup>,
    ) -> io::Result<Server> {
        let listener = UnixListener::from(fd);
        listener.set_nonblocking(true)?;
        Ok(Server::new(
            listener,
            path,
            group.cloned(),
            control.cloned(),
        ))
    }

    fn new(
        listener: UnixListener,
        path: &Path,
        group: Option<SocketGroup>,
        control: Option<SocketGroup>,
    ) -> Server {
        let mut server = Server {
            listener,
            path: path.to_path_buf(),
            clients: BTreeMap::new(),
            next_id: 1,
            group,
            control,
            reserve: Vec::new(),
            paused: None,
            at_limit: false,
            refusals: Tally::default(),
            stand_in: false,
        };
        if !server.fill_reserve() {
            log::warn!(
                "cannot hold {FD_RESERVE} descriptors in reserve for {}: the open-files limit is very low; at the limit, services may fail to start",
                path.display()
            );
        }
        server
    }

    /// A stand-in while `path` cannot be bound: a listener on an abstract address nobody
    /// knows, so supd goes on supervising (as PID 1 it must not exit) and binds `path`
    /// again later (`Supervisor::retry_socket`).
    pub fn stand_in(
        path: &Path,
        group: Option<&SocketGroup>,
        control: Option<&SocketGroup>,
    ) -> io::Result<Server> {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("sup-unbound-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
        let listener = UnixListener::bind_addr(&addr)?;
        listener.set_nonblocking(true)?;
        let mut server = Server::new(listener, path, group.cloned(), control.cloned());
        server.stand_in = true;
        Ok(server)
    }

    /// A server on an abstract address of its own, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests() -> Server {
        use std::os::linux::net::SocketAddrExt;
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("sup-test-{}-{n}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .expect("an abstract address");
        let listener = UnixListener::bind_addr(&addr).expect("bound");
        Server::new(listener, Path::new("/nonexistent/sup.sock"), None, None)
    }

    /// Whether this is a stand-in (`stand_in`): `path` is still to be bound.
    pub fn is_stand_in(&self) -> bool {
        self.stand_in
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the reserve back; false (and none held) when the descriptors are not free.
    fn fill_reserve(&mut self) -> bool {
        while self.reserve.len() < FD_RESERVE {
            match self.listener.as_fd().try_clone_to_owned() {
                Ok(fd) => self.reserve.push(fd),
                Err(_) => {
                    self.reserve.clear();
                    return false;
                }
            }
        }
        true
    }

    /// Whether the listener belongs in the poll set.
    pub fn accepting(&self) -> bool {
        self.paused.is_none()
    }

    /// Accepts every waiting connection, unless paused at the open-files limit.
    pub fn accept(&mut self) {
        while self.accepting() {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.at_limit {
                        self.at_limit = false;
                        log::info!(
                            "{}: below the open-files limit again; accepting connections",
                            self.path.display()
                        );
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(e) => return self.pause(&e),
            };
            self.admit(stream);
        }
    }

    /// Out of descriptors or memory: the connection stays in the backlog and the
    /// listener readable, so stop polling it (a spin otherwise), and give the reserve
    /// to the supervision of services.
    fn pause(&mut self, e: &io::Error) {
        self.reserve.clear();
        self.paused = Some(Mono::now().plus(ACCEPT_RETRY));
        if !self.at_limit {
            self.at_limit = true;
            log::warn!(
                "accept on {}: {e}; not accepting connections until a descriptor is free (a connection closes, or in {}); services are supervised meanwhile. Raise the open-files limit (ulimit -n) if this lasts",
                self.path.display(),
                crate::time::Human(ACCEPT_RETRY)
            );
        }
    }

    /// Accepts again if the reserve can be taken back.
    fn try_resume(&mut self) {
        if self.paused.is_some() && self.fill_reserve() {
            self.paused = None;
        }
    }

    /// Closes the connections idle past [`IDLE`]; retries a paused accept when due.
    pub fn tick(&mut self, now: Mono) {
        if let Some(n) = self.refusals.due(now) {
            log::warn!("{n} more connections or requests were refused in the last second (not logged one by one)");
        }
        for c in self.clients.values_mut() {
            if c.idle_deadline().is_some_and(|d| d <= now) && !c.dead {
                log::info!(
                    "client pid {} uid {} sent nothing for {}; closing its connection",
                    c.pid,
                    c.uid,
                    crate::time::Human(IDLE)
                );
                c.dead = true;
            }
        }
        if self.paused.is_some_and(|at| at <= now) {
            self.try_resume();
            if self.paused.is_some() {
                self.paused = Some(now.plus(ACCEPT_RETRY));
            }
        }
    }

    /// The control socket's next deadline: an idle connection's, or a paused accept's.
    pub fn next_deadline(&self) -> Option<Mono> {
        self.clients
            .values()
            .filter_map(Client::idle_deadline)
            .chain(self.paused)
            .chain(self.refusals.deadline())
            .min()
    }

    /// Takes a new connection in, or answers why not and closes it.
    fn admit(&mut self, stream: UnixStream) {
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        let (uid, gid, pid) = match getsockopt(&stream, sockopt::PeerCredentials) {
            Ok(c) => (c.uid(), c.gid(), c.pid()),
            Err(_) => return,
        };
        let access = self.access_for(uid, gid, pid);
        let mut client = Client::new(stream, access, uid, pid);
        self.make_room(access, uid, pid);
        if let Some(why) = self.refusal(access, uid) {
            if let Some(n) = self.refusals.note(Mono::now()) {
                log::warn!(
                    "refused a connection from pid {pid} uid {uid}: {why}{}",
                    more(n)
                );
            }
            // For now: a connection may be taken once others closed.
            client.send(&protocol::encode_err(
                &Value::Null,
                &Error::new(ErrorKind::Busy, why),
            ));
            client.flush();
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.clients.insert(id, client);
    }

    /// The connections that count against the limits: those not dropped already.
    fn live(&self) -> impl Iterator<Item = &Client> {
        self.clients.values().filter(|c| !c.dead)
    }

    /// At the limit, root or supd's own user displaces an idle connection: one that is
    /// neither a stream nor owed an answer (it would be closed at [`IDLE`] anyway), an
    /// unprivileged peer's first, the longest idle first. So clients that connect and
    /// stall never keep root out. Others are refused at their limits as before: a peer
    /// displacing connections would close its own fresh ones, whose requests supd has
    /// not read yet.
    fn make_room(&mut self, access: Access, uid: u32, pid: i32) {
        if access != Access::Full || self.live().count() < MAX_CLIENTS {
            return;
        }
        let victim = self
            .clients
            .values_mut()
            .filter(|c| c.idle_deadline().is_some() && !c.owed_an_answer())
            .min_by_key(|c| (c.access == Access::Full, c.last_active));
        if let Some(c) = victim {
            log::info!(
                "client pid {} uid {} sent nothing for {}; closing its connection to make room for pid {pid} uid {uid}",
                c.pid,
                c.uid,
                crate::time::Human(Mono::now().since(c.last_active))
            );
            c.dead = true;
        }
    }

    /// Why a connection of `uid` is not taken in now, if it is not.
    fn refusal(&self, access: Access, uid: u32) -> Option<String> {
        if self.live().count() >= MAX_CLIENTS {
            return Some(format!(
                "too many connections (at most {MAX_CLIENTS}); try again later"
            ));
        }
        if access == Access::Full {
            return None;
        }
        let others = self.live().filter(|c| c.access != Access::Full).count();
        if others >= MAX_CLIENTS - RESERVED_SLOTS {
            return Some(format!("too many connections (the last {RESERVED_SLOTS} of {MAX_CLIENTS} are kept for root and supd's user); try again later"));
        }
        let mine = self.live().filter(|c| c.uid == uid).count();
        (mine >= PER_UID).then(|| {
            format!("too many connections: uid {uid} holds {PER_UID}, the most one user may (watch and log -f streams included)")
        })
    }

    /// What a peer may do. Membership of `socket_group` and `control_group` is read
    /// from the peer's own groups (`/proc/PID/status`), never from the user database: a
    /// lookup that hangs (a network directory) must not stall supd.
    fn access_for(&self, uid: u32, gid: u32, pid: i32) -> Access {
        if uid == 0 || uid == nix::unistd::geteuid().as_raw() {
            return Access::Full;
        }
        if self.group.is_none() && self.control.is_none() {
            return Access::None;
        }
        let groups = peer_groups(pid);
        let member = |g: &Option<SocketGroup>| {
            g.as_ref()
                .is_some_and(|g| gid == g.gid || groups.contains(&g.gid))
        };
        if member(&self.control) {
            Access::Operate
        } else if member(&self.group) {
            Access::ReadOnly
        } else {
            Access::None
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
                // The first end of file is a shut-down writing side: the client still
                // reads its answers. Woken again (a hangup), it is gone.
                Ok(0) => {
                    if c.hung_up {
                        c.dead = true;
                    }
                    c.hung_up = true;
                    break;
                }
                Ok(n) => {
                    c.last_active = Mono::now();
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
            let line: Vec<u8> = match nl {
                Some(nl) => c.rbuf.drain(..=nl).collect(),
                // What a client sent before shutting down its writing side is its last
                // request, newline or not; once all is answered, the connection closes
                // (a stream goes on).
                None if c.hung_up && !c.rbuf.is_empty() => std::mem::take(&mut c.rbuf),
                None => {
                    if c.hung_up && !c.watching && c.following.is_none() {
                        c.closing = true;
                    }
                    return None;
                }
            };
            let body = line.strip_suffix(b"\n").unwrap_or(&line);
            let trimmed = body.strip_suffix(b"\r").unwrap_or(body);
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

    /// Sends output lines of `service` to its followers (marker lines marked).
    pub fn broadcast_log(&mut self, service: &str, lines: &[String]) {
        for c in self.clients.values_mut() {
            let Some(f) = c.following.as_ref().filter(|f| f.follows(service)) else {
                continue;
            };
            let events: Vec<Vec<u8>> = lines
                .iter()
                .filter(|l| f.takes(l))
                .map(|l| {
                    let marker = crate::logs::is_marker(l);
                    protocol::line(serde_json::json!(
                        {"event": "log", "service": service, "line": l, "marker": marker}
                    ))
                })
                .collect();
            for e in &events {
                c.send(e);
            }
            if !events.is_empty() {
                c.flush();
            }
        }
    }

    /// Writes what can be written to a client.
    pub fn flush(&mut self, id: u64) {
        if let Some(c) = self.clients.get_mut(&id) {
            c.flush();
        }
    }

    /// Removes clients that hung up, failed, or finished closing; a descriptor freed
    /// may let a paused accept go on.
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
        if !gone.is_empty() {
            self.try_resume();
        }
        gone
    }

    /// The fds to poll, whether each wants POLLIN (not while an answer is owed, nor
    /// after its end of file) and whether it wants POLLOUT.
    pub fn client_fds(&self) -> impl Iterator<Item = (u64, BorrowedFd<'_>, bool, bool)> {
        self.clients.iter().map(|(id, c)| {
            let wants_in = !c.parked && !c.hung_up && !c.closing;
            (*id, c.stream.as_fd(), wants_in, !c.wbuf.is_empty())
        })
    }

    /// A connected client.
    pub fn client(&self, id: u64) -> Option<&Client> {
        self.clients.get(&id)
    }

    /// Notes a refused request: how many refusals to tell now (`Tally::note`).
    pub fn note_refusal(&mut self, now: Mono) -> Option<u64> {
        self.refusals.note(now)
    }

    /// The client receives `watch` events from now on.
    pub fn watch(&mut self, id: u64) {
        if let Some(c) = self.clients.get_mut(&id) {
            c.watching = true;
        }
    }

    /// The client receives the output that `follow` takes (`log -f`).
    pub fn follow(&mut self, id: u64, follow: Follow) {
        if let Some(c) = self.clients.get_mut(&id) {
            c.following = Some(follow);
        }
    }

    /// Whether an answer is owed to the client: while it is, its later requests wait.
    pub fn set_parked(&mut self, id: u64, parked: bool) {
        if let Some(c) = self.clients.get_mut(&id) {
            c.parked = parked;
        }
    }
}

impl Client {
    /// A client just accepted: nothing read or owed yet, active now.
    fn new(stream: UnixStream, access: Access, uid: u32, pid: i32) -> Client {
        Client {
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
            hung_up: false,
            dead: false,
            last_active: Mono::now(),
        }
    }

    /// What the client may do.
    pub fn access(&self) -> Access {
        self.access
    }

    /// The client's uid, from `SO_PEERCRED`.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// The client's pid, from `SO_PEERCRED`.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// When this connection is closed if nothing moves: only for one that is not a
    /// stream and is not waiting for an answer.
    fn idle_deadline(&self) -> Option<Mono> {
        let stream = self.watching || self.following.is_some();
        (!stream && !self.parked && !self.dead).then(|| self.last_active.plus(IDLE))
    }

    /// Whether this connection has a request supd has not answered yet: a line in its
    /// buffer, or in its socket (sent, not read: the listener is served before the
    /// clients in a loop turn; looked at, not taken), or an answer not all written. Such
    /// a connection is not idle, whenever it last moved a byte. Half a line is no
    /// request: a client that sends one and stalls is idle.
    fn owed_an_answer(&self) -> bool {
        use nix::sys::socket::{recv, MsgFlags};
        if !self.wbuf.is_empty() || self.rbuf.contains(&b'\n') {
            return true;
        }
        let mut b = [0u8; 4096];
        match recv(
            self.stream.as_fd().as_raw_fd(),
            &mut b,
            MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
        ) {
            // A full look without the line's end: taken for a request on its way.
            Ok(n) => n == b.len() || b[..n].contains(&b'\n'),
            Err(_) => false,
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        if self.dead {
            return;
        }
        // One answer however big (status of tens of thousands of services) goes to a
        // client that has read all before it; unread ones pile up to WRITE_MAX only.
        if !self.wbuf.is_empty() && self.wbuf.len() + bytes.len() > WRITE_MAX {
            log::warn!(
                "client pid {} does not read its answers; disconnecting it",
                self.pid
            );
            self.dead = true;
            self.wbuf.clear();
            return;
        }
        self.wbuf.extend_from_slice(bytes);
        self.last_active = Mono::now();
    }

    fn flush(&mut self) {
        while !self.wbuf.is_empty() && !self.dead {
            match self.stream.write(&self.wbuf) {
                Ok(0) => self.dead = true,
                Ok(n) => {
                    self.wbuf.drain(..n);
                    self.last_active = Mono::now();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.dead = true,
            }
        }
        // A big answer once written (`status` of thousands of services: megabytes)
        // leaves no buffer of its size behind with a client that stays connected.
        if self.wbuf.is_empty() && self.wbuf.capacity() > WBUF_KEPT {
            self.wbuf = Vec::new();
        }
    }
}

/// The most room a client's emptied write buffer keeps.
const WBUF_KEPT: usize = 64 << 10;

/// `socket_group`, looked up once, when supd starts (before its loop: a user database
/// that hangs then delays the start, never the loop; binding the socket again later
/// uses what was found then).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SocketGroup {
    pub name: String,
    pub gid: u32,
}

impl SocketGroup {
    /// Looks `name` up; `None` (and said) when it does not exist.
    pub fn lookup(path: &Path, name: &str) -> Option<SocketGroup> {
        let found = SocketGroup::find(name);
        if found.is_none() {
            log::info!(
                "socket_group '{name}' does not exist; only root and supd's own user may use {}",
                path.display()
            );
        }
        found
    }

    /// Looks `control_group`'s `name` up; `None` (and said) when it does not exist.
    pub fn lookup_control(name: &str) -> Option<SocketGroup> {
        let found = SocketGroup::find(name);
        if found.is_none() {
            log::warn!(
                "control_group '{name}' does not exist; only root and supd's own user may start, stop, restart, reload or signal services"
            );
        }
        found
    }

    fn find(name: &str) -> Option<SocketGroup> {
        match nix::unistd::Group::from_name(name) {
            Ok(Some(g)) => Some(SocketGroup {
                name: name.to_string(),
                gid: g.gid.as_raw(),
            }),
            _ => None,
        }
    }

    /// Lets the group's members connect to the socket at `path`, which is another
    /// group's: an ACL entry giving it read and write, as the owning group has.
    fn let_in(&self, path: &Path) {
        if let Err(e) = crate::sys::grant_group_rw(path, self.gid) {
            log::warn!(
                "cannot let control_group '{}' into {} (an ACL entry: {e}); its members who are not in socket_group cannot connect",
                self.name,
                path.display()
            );
        }
    }

    /// Gives the socket at `path` to the group when supd may (it is root); otherwise
    /// says why not.
    fn give(&self, path: &Path) {
        if let Err(e) = nix::unistd::chown(path, None, Some(nix::unistd::Gid::from_raw(self.gid))) {
            log::warn!(
                "cannot give {} to group '{}': {e}; its members cannot connect",
                path.display(),
                self.name
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(ours: UnixStream) -> Client {
        Client::new(ours, Access::Full, 0, 0)
    }

    #[test]
    fn refusals_are_told_at_most_once_a_second_with_the_count() {
        let mut t = Tally::default();
        let t0 = Mono(1_000_000_000);
        assert_eq!(t.note(t0), Some(1));
        for i in 1..=500u64 {
            assert_eq!(t.note(t0.plus(Duration::from_millis(i))), None);
        }
        assert_eq!(t.note(t0.plus(Duration::from_millis(1000))), Some(501));
        assert_eq!(t.note(t0.plus(Duration::from_millis(1001))), None);
        let d = t.deadline().expect("one untold");
        assert_eq!(d, t0.plus(Duration::from_millis(2000)));
        assert_eq!(t.due(d.plus(Duration::ZERO)), Some(1));
        assert_eq!(t.deadline(), None);
        assert_eq!(t.due(d.plus(Duration::from_secs(5))), None);
        assert_eq!(more(1), "");
        assert!(more(3).contains("2 more"));
    }

    #[test]
    fn a_written_big_answer_leaves_no_big_buffer_behind() {
        let (ours, theirs) = UnixStream::pair().expect("pair");
        ours.set_nonblocking(true).expect("nonblocking");
        let mut c = client(ours);
        let answer = vec![b'x'; 1 << 20];
        c.send(&answer);
        c.flush();
        let mut got = Vec::new();
        let mut theirs = theirs;
        let mut chunk = vec![0u8; 1 << 16];
        while got.len() < answer.len() {
            let n = io::Read::read(&mut theirs, &mut chunk).expect("read");
            got.extend_from_slice(&chunk[..n]);
            c.flush();
        }
        assert_eq!(got, answer);
        assert!(c.wbuf.is_empty() && !c.dead);
        assert!(c.wbuf.capacity() <= WBUF_KEPT, "{}", c.wbuf.capacity());
    }

    /// One answer larger than the limit goes whole to a client that read all before it;
    /// a second one while it is unread passes the limit and drops the client.
    #[test]
    fn one_answer_may_pass_the_limit_but_unread_ones_may_not() {
        let (ours, _theirs) = UnixStream::pair().expect("pair");
        ours.set_nonblocking(true).expect("nonblocking");
        let mut c = client(ours);
        c.send(&vec![b'x'; WRITE_MAX + 1]);
        assert!(!c.dead && c.wbuf.len() == WRITE_MAX + 1);
        c.send(b"more");
        assert!(c.dead, "unread answers past the limit drop the client");
    }
}
