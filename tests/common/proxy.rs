//! A TCP proxy on loopback for partitions: it forwards every request to its upstream
//! and every answer back, until told to drop the answers (a one-way partition: what a
//! client sends still arrives, what comes back is lost) or both ways (a partition: a
//! blackhole). Its threads end with the test.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub struct Proxy {
    pub url: String,
    drop_answers: Arc<AtomicBool>,
    drop_requests: Arc<AtomicBool>,
}

impl Proxy {
    /// A proxy to `upstream` (`HOST:PORT`).
    pub fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let drop_answers = Arc::new(AtomicBool::new(false));
        let drop_requests = Arc::new(AtomicBool::new(false));
        let (flag, requests) = (drop_answers.clone(), drop_requests.clone());
        let upstream = upstream.to_string();
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let (c2, s2) = match (client.try_clone(), server.try_clone()) {
                    (Ok(c), Ok(s)) => (c, s),
                    _ => continue,
                };
                let requests = requests.clone();
                std::thread::spawn(move || pump(client, server, requests));
                let flag = flag.clone();
                std::thread::spawn(move || pump(s2, c2, flag));
            }
        });
        Proxy {
            url,
            drop_answers,
            drop_requests,
        }
    }

    /// From now on, answers are read from the upstream and dropped (or forwarded again).
    pub fn drop_answers(&self, on: bool) {
        self.drop_answers.store(on, Ordering::SeqCst);
    }

    /// From now on, nothing gets through either way (or everything again).
    pub fn blackhole(&self, on: bool) {
        self.drop_requests.store(on, Ordering::SeqCst);
        self.drop_answers.store(on, Ordering::SeqCst);
    }
}

/// Copies `from` to `to`, dropping what it reads while `drop` is set; ends both when
/// either side closes.
fn pump(mut from: TcpStream, mut to: TcpStream, drop: Arc<AtomicBool>) {
    let mut buf = [0u8; 16384];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if !drop.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}
