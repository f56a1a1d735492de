//! A small socket-activated test service (python3): it takes its sockets from
//! `LISTEN_FDS` as sd_listen_fds(3) says, records what it was given, finishes the
//! connections a previous run stored (`FDNAME=conn`) and serves its listeners.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The service. Argument: a file it appends one JSON line to per run (its pid, the
/// `LISTEN_*` variables, each fd's name, whether it listens and its address). Its
/// environment: `SRV_MODE` "answer" (each connection gets the pid, then closed) or
/// "store" (a connection's first line is read, then the connection is stored with
/// `FDSTORE=1`/`FDNAME=conn` and the run exits `SRV_EXIT`); `SRV_DELAY` seconds before it
/// takes a connection (a slow start); `SRV_STORE_N` stores that many memfds as
/// "extra" first.
pub const SERVER: &str = r#"#!/usr/bin/env python3
import json, os, select, socket, sys, time
pid = os.getpid()
n = int(os.environ.get("LISTEN_FDS", "0")) if os.environ.get("LISTEN_PID") == str(pid) else 0
names = os.environ.get("LISTEN_FDNAMES", "").split(":") if n else []
notify = os.environ.get("NOTIFY_SOCKET")

def tell(msg, fds=()):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.connect(notify)
    socket.send_fds(s, [msg.encode()], list(fds))
    s.close()

got, socks = [], []
for i in range(n):
    fd = 3 + i
    try:
        s = socket.socket(fileno=fd)
        acc = s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        addr = s.getsockname()
    except OSError as e:
        got.append({"fd": fd, "error": str(e)})
        continue
    name = names[i] if i < len(names) else None
    got.append({"fd": fd, "name": name, "listening": bool(acc), "addr": str(addr),
                "family": int(s.family), "inode": os.fstat(fd).st_ino})
    socks.append((s, name, acc))
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"pid": pid, "listen_fds": os.environ.get("LISTEN_FDS"),
                        "listen_pid": os.environ.get("LISTEN_PID"),
                        "names": os.environ.get("LISTEN_FDNAMES"), "fds": got,
                        "notify": notify}) + "\n")
time.sleep(float(os.environ.get("SRV_DELAY", "0")))
extra = int(os.environ.get("SRV_STORE_N", "0"))
if extra and notify:
    tell("FDSTORE=1\nFDNAME=extra", [os.memfd_create("extra") for _ in range(extra)])
resumed = [s for s, name, acc in socks if not acc and name == "conn"]
for c in resumed:
    c.sendall(("world %d\n" % pid).encode())
if resumed:
    tell("FDSTOREREMOVE=1\nFDNAME=conn")
    for c in resumed:
        c.close()
listeners = [s for s, _, acc in socks if acc]
mode = os.environ.get("SRV_MODE", "answer")
while listeners:
    ready, _, _ = select.select(listeners, [], [])
    for l in ready:
        c, _ = l.accept()
        if mode == "store":
            line = b""
            while not line.endswith(b"\n"):
                b = c.recv(1)
                if not b:
                    break
                line += b
            tell("FDSTORE=1\nFDNAME=conn", [c.fileno()])
            sys.exit(int(os.environ.get("SRV_EXIT", "0")))
        c.sendall(("%d\n" % pid).encode())
        c.close()
if not listeners:
    while True:
        time.sleep(3600)
"#;

/// The runs recorded in `report` so far, one JSON value each.
pub fn runs(report: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(report)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Connects to `addr` and reads the one line the service answers (its pid).
pub fn ask(addr: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out.trim().to_string())
}

/// Sends `line` on `s` and reads one line back.
pub fn say(s: &mut TcpStream, line: &str) -> String {
    s.write_all(line.as_bytes()).expect("write");
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let mut got = String::new();
    r.read_line(&mut got).expect("read");
    got
}

/// A free TCP port on 127.0.0.1 and ::1 alike (taken, then let go).
pub fn free_port() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        if std::net::TcpListener::bind(("::1", port)).is_ok() {
            return port;
        }
    }
}
