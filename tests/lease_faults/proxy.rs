//! A small TCP forwarder on loopback between one node's sup-lease and its etcd member, so
//! that the test can cut that node off from the store in ways a real network does:
//! - `Forward`: bytes pass both ways;
//! - `Blackhole`: connections are accepted (new ones too) and what arrives is read and
//!   dropped, both ways: nothing ever answers, nothing is refused or reset;
//! - `OneWay`: requests reach etcd (and are acted on), its answers are dropped.
//!
//! A connection that lost bytes cannot be trusted again (a reply may be half gone), so
//! when the proxy forwards again every such connection is shut down, as a firewall that
//! dropped a flow would leave the client to time out or reconnect. Each connection is two
//! threads; a connection closed on one side is closed on the other.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Forward,
    Blackhole,
    OneWay,
}

struct Conn {
    client: TcpStream,
    upstream: Option<TcpStream>,
    /// Bytes were dropped on it: shut down when the proxy forwards again.
    tainted: Arc<AtomicBool>,
    closed: Arc<AtomicBool>,
}

impl Conn {
    fn close(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        if let Some(u) = &self.upstream {
            let _ = u.shutdown(Shutdown::Both);
        }
        self.closed.store(true, Ordering::SeqCst);
    }
}

struct Shared {
    mode: Mutex<Mode>,
    conns: Mutex<Vec<Arc<Conn>>>,
    upstream: String,
}

pub struct Proxy {
    /// `http://127.0.0.1:PORT`, for the node's `--store etcd:URL`.
    pub url: String,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream` (`http://HOST:PORT`).
    pub fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Forward),
            conns: Mutex::default(),
            upstream: upstream.trim_start_matches("http://").to_string(),
        });
        let s = shared.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                accept(&s, client);
            }
        });
        Proxy {
            url: format!("http://127.0.0.1:{port}"),
            shared,
        }
    }

    /// Switches the mode; back to `Forward`, every connection that lost bytes is shut
    /// down.
    pub fn set(&self, mode: Mode) {
        *self.shared.mode.lock().expect("mode") = mode;
        let mut conns = self.shared.conns.lock().expect("conns");
        if mode == Mode::Forward {
            for c in conns.iter() {
                if c.tainted.load(Ordering::SeqCst) {
                    c.close();
                }
            }
        }
        conns.retain(|c| !c.closed.load(Ordering::SeqCst));
    }
}

impl Drop for Proxy {
    /// Every connection shut down (the listener's thread stays blocked in accept; the
    /// test process ends it).
    fn drop(&mut self) {
        for c in self.shared.conns.lock().expect("conns").iter() {
            c.close();
        }
    }
}

fn accept(s: &Arc<Shared>, client: TcpStream) {
    let mode = *s.mode.lock().expect("mode");
    let tainted = Arc::new(AtomicBool::new(mode == Mode::Blackhole));
    let closed = Arc::new(AtomicBool::new(false));
    // Blackholed: no connection to etcd at all (nothing of it may reach the store).
    let upstream = if mode == Mode::Blackhole {
        None
    } else {
        let addr = s.upstream.parse().expect("etcd's address");
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(u) => Some(u),
            Err(_) => return, // refused as etcd refuses: the client sees its connection close
        }
    };
    let _ = client.set_nodelay(true);
    if let Some(u) = &upstream {
        let _ = u.set_nodelay(true);
    }
    let pair = Arc::new(Conn {
        client: client.try_clone().expect("dup"),
        upstream: upstream.as_ref().map(|u| u.try_clone().expect("dup")),
        tainted,
        closed,
    });
    s.conns.lock().expect("conns").push(pair.clone());
    // Client to etcd (requests).
    {
        let (s, pair) = (s.clone(), pair.clone());
        let (from, to) = (
            client,
            upstream.as_ref().map(|u| u.try_clone().expect("dup")),
        );
        std::thread::spawn(move || pump(&s, from, to, true, &pair));
    }
    // etcd to client (answers).
    if let Some(u) = upstream {
        let s = s.clone();
        let to = pair.client.try_clone().expect("dup");
        std::thread::spawn(move || pump(&s, u, Some(to), false, &pair));
    }
}

/// Copies `from` to `to` as the mode allows (`up`: the client's requests); the pair is
/// closed when either side ends.
fn pump(s: &Shared, mut from: TcpStream, mut to: Option<TcpStream>, up: bool, pair: &Conn) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // Forwarding again, a connection that lost bytes is shut down.
        let pass = match *s.mode.lock().expect("mode") {
            Mode::Forward if pair.tainted.load(Ordering::SeqCst) => break,
            Mode::Forward => true,
            Mode::Blackhole => false,
            Mode::OneWay => up,
        };
        match to.as_mut() {
            Some(t) if pass => {
                if t.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            _ => pair.tainted.store(true, Ordering::SeqCst),
        }
    }
    pair.close();
}
