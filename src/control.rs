//! The control part: the control socket and its clients (`socket.rs`), and the answers
//! owed to parked clients with the stops and restarts held for their dependents
//! (`parked.rs`). Its state is its own, in private fields; the coordinator reaches it
//! through the methods here (the socket's side) and in `parked.rs`, and decides on the
//! slots when a waiter is settled and when a held stop may go (`supervisor/commands.rs`,
//! `supervisor/waiters.rs`). It imports no other part and not the coordinator.
//!
//! Across `reexec` the listening socket is kept open (its fd in the handoff) and the held
//! stops go over in their order ([`Control::handoff`]); the clients' connections close
//! with the exec, and the answers owed to them with them.

mod follow;
mod parked;
mod socket;
pub use follow::Follow;
pub use parked::{QueuedState, WaitFor, Waiter};
pub use socket::{
    in_use, more, Access, Client, Server, SocketGroup, Tally, ACCEPT_RETRY, FD_RESERVE, IDLE,
    MAX_CLIENTS, PER_UID, RESERVED_SLOTS, WRITE_MAX,
};

use crate::protocol::{Error, Request};
use crate::time::Mono;
use parked::Queued;
use serde_json::Value;
use std::os::fd::BorrowedFd;
use std::path::Path;

/// The control part.
pub struct Control {
    /// The listening socket and its clients.
    server: Server,
    /// Answers owed to parked clients, in the order they were parked.
    waiters: Vec<Waiter>,
    /// Stops and restarts waiting for the services named with them that come after
    /// them, in the order they were asked.
    queued: Vec<Queued>,
}

impl Control {
    /// The part serving `server`, with no client yet.
    pub fn new(server: Server) -> Control {
        Control {
            server,
            waiters: Vec::new(),
            queued: Vec::new(),
        }
    }

    /// The socket bound at last in place of a stand-in (`Supervisor::retry_socket`).
    pub fn set_server(&mut self, server: Server) {
        self.server = server;
    }

    /// The socket's path.
    pub fn socket_path(&self) -> &Path {
        self.server.path()
    }

    /// `socket_group` as it was looked up when supd started.
    pub fn socket_group(&self) -> Option<&SocketGroup> {
        self.server.socket_group()
    }

    /// `control_group` as it was looked up when supd started.
    pub fn control_group(&self) -> Option<&SocketGroup> {
        self.server.control_group()
    }

    /// `socket_group`'s id, when supd could look it up.
    pub fn group(&self) -> Option<u32> {
        self.server.group()
    }

    /// The listening socket (polled; kept open across `reexec`).
    pub fn listener_fd(&self) -> BorrowedFd<'_> {
        self.server.fd()
    }

    /// Whether the listener belongs in the poll set.
    pub fn accepting(&self) -> bool {
        self.server.accepting()
    }

    /// Accepts every waiting connection, unless paused at the open-files limit.
    pub fn accept(&mut self) {
        self.server.accept();
    }

    /// The clients' fds to poll, whether each wants POLLIN and whether it wants POLLOUT.
    pub fn client_fds(&self) -> impl Iterator<Item = (u64, BorrowedFd<'_>, bool, bool)> {
        self.server.client_fds()
    }

    /// Reads what a client sent into its buffer.
    pub fn read(&mut self, id: u64) {
        self.server.read(id);
    }

    /// Writes what can be written to a client.
    pub fn flush(&mut self, id: u64) {
        self.server.flush(id);
    }

    /// The next complete request of a client that is not parked (`Server::next_request`).
    pub fn next_request(&mut self, id: u64) -> Option<Result<Request, (Value, Error)>> {
        self.server.next_request(id)
    }

    /// A connected client.
    pub fn client(&self, id: u64) -> Option<&Client> {
        self.server.client(id)
    }

    /// Notes a refused request: how many refusals to tell now.
    pub fn note_refusal(&mut self, now: Mono) -> Option<u64> {
        self.server.note_refusal(now)
    }

    /// Queues an answer for a client and tries to send it now.
    pub fn send(&mut self, id: u64, bytes: &[u8]) {
        self.server.send(id, bytes);
    }

    /// Sends an event line to every watching client.
    pub fn broadcast(&mut self, bytes: &[u8]) {
        self.server.broadcast(bytes);
    }

    /// Sends output lines of `service` to its followers.
    pub fn broadcast_log(&mut self, service: &str, lines: &[String]) {
        self.server.broadcast_log(service, lines);
    }

    /// The client receives `watch` events from now on.
    pub fn watch(&mut self, id: u64) {
        self.server.watch(id);
    }

    /// The client receives the output that `follow` takes (`log -f`).
    pub fn follow(&mut self, id: u64, follow: Follow) {
        self.server.follow(id, follow);
    }

    /// An answer is owed to the client, given by someone other than a waiter (a reload,
    /// an install, a reexec's handshake): its later requests wait until
    /// [`Control::answer_parked`].
    pub fn hold_client(&mut self, id: u64) {
        self.server.set_parked(id, true);
    }

    /// Sends a parked client its answer: its later requests may be served again.
    pub fn answer_parked(&mut self, id: u64, bytes: &[u8]) {
        self.server.send(id, bytes);
        self.server.set_parked(id, false);
    }

    /// Closes the idle connections, retries a paused accept when due, tells the
    /// refusals due.
    pub fn tick(&mut self, now: Mono) {
        self.server.tick(now);
    }

    /// Removes the clients that hung up, failed or finished closing, and the answers
    /// owed to them.
    pub fn reap_clients(&mut self) {
        for id in self.server.reap() {
            self.forget_client(id);
        }
    }

    /// The socket's next deadline: an idle connection's, a paused accept's, refusals
    /// due to be told.
    pub fn socket_deadline(&self) -> Option<Mono> {
        self.server.next_deadline()
    }
}
