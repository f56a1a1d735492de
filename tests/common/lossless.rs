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
/// takes a connection (a slow start); `SRV_STORE_N` stores that many regular files as
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
    # Regular files (never hung up; no memfd, which Linux 3.10 lacks).
    tell("FDSTORE=1\nFDNAME=extra",
         [os.open(sys.argv[1] + ".extra", os.O_RDWR | os.O_CREAT) for _ in range(extra)])
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

/// The test service in `sb` (`srv.py`), and the file it records its runs in.
pub fn server(sb: &super::Sandbox) -> (String, std::path::PathBuf) {
    (sb.file("srv.py", SERVER), sb.path("runs.jsonl"))
}

/// Waits until `report` holds `n` runs (woken by inotify, within the deadline).
pub fn wait_runs(
    sb: &super::Sandbox,
    report: &std::path::Path,
    n: usize,
) -> Vec<serde_json::Value> {
    let dir = super::files::watch_dir_of(report);
    let end = std::time::Instant::now() + super::DEADLINE;
    loop {
        let r = runs(report);
        if r.len() >= n {
            return r;
        }
        let left = end.saturating_duration_since(std::time::Instant::now());
        assert!(
            !left.is_zero(),
            "{} runs, not {n}\n{}",
            r.len(),
            sb.supd_log()
        );
        super::files::next_events(&dir, left);
    }
}

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

/// Helpers of `tests/lossless_adversary.rs`: small python services that store fds,
/// waits on their reports and on supd's status, and looks at supd from outside (its
/// fds, whether it sleeps, its log).
pub mod adversary {
    use super::runs;
    use crate::common::{self, Sandbox};
    use serde_json::Value;
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    /// The python helpers every test service here starts with: `tell` sends a notify
    /// message with fds; `note` appends one JSON line to the report (argv[1]).
    pub const PRELUDE: &str = r#"#!/usr/bin/env python3
import json, os, signal, socket, sys, time
notify = os.environ.get("NOTIFY_SOCKET")
report = sys.argv[1]
def tell(msg, fds=()):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.connect(notify)
    socket.send_fds(s, [msg.encode()], list(fds))
    s.close()
def note(**kw):
    kw["pid"] = os.getpid()
    kw["listen_fds"] = os.environ.get("LISTEN_FDS")
    kw["names"] = os.environ.get("LISTEN_FDNAMES")
    with open(report, "a") as f:
        f.write(json.dumps(kw) + "\n")
"#;

    /// A test service: [`PRELUDE`] then `body`; returns its command line (with the report).
    pub fn service(sb: &Sandbox, name: &str, body: &str) -> (String, PathBuf) {
        let report = sb.path(&format!("{name}.jsonl"));
        let path = sb.file(&format!("{name}.py"), &format!("{PRELUDE}{body}"));
        (format!("[\"{path}\", \"{}\"]", report.display()), report)
    }

    /// Waits until `report` holds a line for which `pred` holds; returns all lines.
    pub fn wait_report(sb: &Sandbox, report: &Path, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let dir = common::files::watch_dir_of(report);
        let end = Instant::now() + common::DEADLINE;
        loop {
            let r = runs(report);
            if pred(&r) {
                return r;
            }
            let left = end.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "report: {r:?}\n{}", sb.supd_log());
            common::files::next_events(&dir, left);
        }
    }

    /// Waits (looking after each turn of supd's loop) until `service`'s status satisfies
    /// `pred`; returns it.
    pub fn wait_status(sb: &Sandbox, service: &str, pred: impl Fn(&Value) -> bool) -> Value {
        // supd logs (at debug, as the tests run it) each change to a store: status is
        // asked again after each line it writes, not in a loop.
        let log = sb.path("supd.stderr");
        let watch = common::files::watch_dir_of(&log);
        let end = Instant::now() + common::DEADLINE;
        loop {
            let st = sb.status(service);
            if pred(&st) {
                return st;
            }
            let left = end.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "status: {st}\n{}", sb.supd_log());
            common::files::next_events(&watch, left);
        }
    }

    /// The names of the stored fds `status` shows.
    pub fn stored_names(st: &Value) -> Vec<String> {
        st["stored_fds"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| s["name"].as_str().unwrap_or("").to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether process `pid` holds an fd whose /proc link reads `link` ("pipe:[123]",
    /// "socket:[456]"): a file told by its identity, not by a count of fds that the
    /// spawner's sockets, coming and going, would upset.
    pub fn holds_link(pid: i32, link: &str) -> bool {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .expect("its fds")
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .any(|l| l.to_string_lossy() == link)
    }

    /// supd's log holds no panic.
    pub fn no_panic(sb: &Sandbox) {
        let log = sb.supd_log();
        assert!(!log.contains("panicked"), "supd panicked:\n{log}");
    }

    /// `status` answers within a second.
    pub fn answers_quickly(sb: &Sandbox, service: &str) {
        let t = Instant::now();
        sb.status(service);
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "status took {:?}",
            t.elapsed()
        );
    }

    /// The uid of user `name`.
    pub fn uid_of(name: &str) -> u32 {
        nix::unistd::User::from_name(name)
            .expect("user database")
            .unwrap_or_else(|| panic!("no user {name}"))
            .uid
            .as_raw()
    }

    /// `supd --check` of `services`: its exit code and what it said.
    pub fn check(sb: &Sandbox, services: &str) -> (Option<i32>, String) {
        sb.config(services);
        let out = std::process::Command::new(common::SUPD)
            .arg("-c")
            .arg(sb.path("sup.toml"))
            .arg("--check")
            .output()
            .expect("supd --check");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code(), text)
    }
}
