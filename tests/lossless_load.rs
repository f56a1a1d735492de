//! Lossless upgrades under load (issue 29): a real socket-activated HTTP server
//! (examples/lossless/serve.py, which takes LISTEN_FDS and hands its idle keep-alive
//! connections to the fd store on SIGTERM) under Debian's `wrk` on loopback, while supd
//! upgrades and rolls it back, restarts it and re-executes itself: no connection may be
//! refused and no request may fail. A version that crash-loops under load is rolled
//! back with none refused.
//!
//! `SUP_LOSSLESS_CYCLES` sets the number of upgrade/rollback pairs and restarts (10 by
//! default; `.ci/run` runs 100 in a release build, as the issue asks).

mod common;
use common::lossless::free_port;
use common::Sandbox;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SERVE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/lossless/serve.py");

/// What wrk said when it was stopped. (wrk connects without waiting, so a refused
/// connection shows as a failed write or connect: lossless means no error at all.)
#[derive(Debug, Default)]
struct Load {
    requests: u64,
    connect: u64,
    read: u64,
    write: u64,
    timeout: u64,
    non_2xx: u64,
    text: String,
}

impl Load {
    fn failed(&self) -> u64 {
        self.read + self.write + self.timeout + self.non_2xx
    }
}

/// wrk against `port` for as long as the test runs (stopped by SIGINT, after which it
/// prints its summary): 8 keep-alive connections (`fresh`: 4 connections that each make
/// a new connection per request, `Connection: close`). Its timeout is 10 s: a request
/// that waits in the backlog through a restart is slow, not failed.
fn start_wrk(port: u16, fresh: bool) -> Wrk {
    // Line-buffered (stdbuf), so that its first line comes when it is printed.
    let mut cmd = Command::new("stdbuf");
    cmd.args(["-oL", "wrk", "-t1", "-d600s", "--timeout", "10s"]);
    if fresh {
        cmd.args(["-c4", "-H", "Connection: close"]);
    } else {
        cmd.arg("-c8");
    }
    let mut child = cmd
        .arg(format!("http://127.0.0.1:{port}/"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("wrk (Debian's package wrk; .ci/run installs it)");
    let head = wait_wrk_running(&mut child);
    Wrk { child, head }
}

/// A running wrk, and what it printed before its load began.
struct Wrk {
    child: Child,
    head: String,
}

/// Waits for wrk's first line, "Running ...", which it prints once it has caught SIGINT.
/// Before that, wrk tries one connection and exits ("unable to connect") if it is
/// refused, and it ignores SIGINT: a restart begun earlier could end wrk before its
/// first request, and a SIGINT sent earlier would be lost.
fn wait_wrk_running(wrk: &mut Child) -> String {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::io::Read;
    use std::os::fd::AsFd;
    let end = Instant::now() + Duration::from_secs(10);
    let mut head = Vec::new();
    let out = wrk.stdout.as_mut().expect("wrk's output");
    let ended = loop {
        if String::from_utf8_lossy(&head).contains("Running") {
            break false;
        }
        let left = end.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "wrk did not begin within 10 s: {}",
            String::from_utf8_lossy(&head)
        );
        let ms = PollTimeout::try_from(left.as_millis().min(10_000) as i32).expect("timeout");
        if poll(&mut [PollFd::new(out.as_fd(), PollFlags::POLLIN)], ms).expect("poll") == 0 {
            continue;
        }
        let mut buf = [0u8; 4096];
        match out.read(&mut buf).expect("read wrk's output") {
            0 => break true,
            n => head.extend_from_slice(&buf[..n]),
        }
    };
    if ended {
        let exit = wrk.wait().expect("wrk's exit");
        let mut err = String::new();
        if let Some(mut e) = wrk.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        panic!("wrk ended before its load began ({exit}): {err}");
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn stop_wrk(wrk: Wrk) -> Load {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(wrk.child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("SIGINT wrk");
    let out = wrk.child.wait_with_output().expect("wrk's summary");
    let text = format!(
        "{}{}{}{}",
        wrk.head,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        out.status
    );
    let mut load = Load {
        text: text.clone(),
        ..Load::default()
    };
    for line in text.lines().map(str::trim) {
        if let Some(n) = line
            .split(" requests in ")
            .next()
            .filter(|_| line.contains(" requests in "))
        {
            load.requests = n.trim().parse().unwrap_or(0);
        }
        if let Some(rest) = line.strip_prefix("Socket errors:") {
            for part in rest.split(',') {
                let mut it = part.split_whitespace();
                let (Some(kind), Some(n)) = (it.next(), it.next()) else {
                    continue;
                };
                let n: u64 = n.parse().unwrap_or(0);
                match kind {
                    "connect" => load.connect = n,
                    "read" => load.read = n,
                    "write" => load.write = n,
                    "timeout" => load.timeout = n,
                    _ => {}
                }
            }
        }
        if let Some(n) = line.strip_prefix("Non-2xx or 3xx responses:") {
            load.non_2xx = n.trim().parse().unwrap_or(0);
        }
    }
    load
}

/// A version of the tool `web`: `bin/web`, which execs the server (so that its pid is
/// the one LISTEN_PID names).
fn place_version(sb: &Sandbox, version: &str, extra: &str) {
    let dir = sb.path(&format!("tools/web/{version}/bin"));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let script = dir.join("web");
    std::fs::write(
        &script,
        format!("#!/bin/sh\nexec python3 {SERVE} --version {version} --store {extra}\n"),
    )
    .expect("write");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
}

fn cycles() -> usize {
    std::env::var("SUP_LOSSLESS_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10)
}

/// The server as the test's clients see it: which version answers.
fn version_answering(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("answer");
    out.rsplit("\r\n\r\n")
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

fn setup(sb: &mut Sandbox, port: u16) {
    place_version(sb, "1.0.0", "");
    place_version(sb, "2.0.0", "");
    place_version(sb, "3.0.0", "--crash");
    std::os::unix::fs::symlink("1.0.0", sb.path("tools/web/current")).expect("current");
    sb.config(&format!(
        r#"[service.web]
tool = "web"
command = ["bin/web"]
listen = ["tcp:127.0.0.1:{port}"]
fd_store = 64
ready = "notify"
probation = "1h"
restart_delay = "50ms"
restart_delay_max = "200ms"
crash_loop = {{ restarts = 3, window = "1m" }}
"#
    ));
    sb.start();
    sb.wait_state("web", "running");
    assert_eq!(version_answering(port), "1.0.0");
}

fn ok(sb: &Sandbox, args: &[&str]) {
    let out = sb.supctl(args);
    assert!(
        out.status.success(),
        "supctl {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        sb.supd_log()
    );
}

/// Waits until `web` runs `version`, ready.
fn wait_running(sb: &Sandbox, w: &mut common::Watch, version: &str) {
    let now = sb.status("web");
    if now["state"] == "running" && now["version"] == version {
        return;
    }
    w.until(sb, |e| {
        e["event"] == "state"
            && e["service"] == "web"
            && e["to"] == "running"
            && e["version"] == version
    });
}

/// Keep-alive load (through the fd store across runs) and fresh connections (through
/// the held socket's backlog) at once.
fn start_load(port: u16) -> (Wrk, Wrk) {
    (start_wrk(port, false), start_wrk(port, true))
}

fn stop_load(sb: &Sandbox, (kept, fresh): (Wrk, Wrk), what: &str) {
    let (kept, fresh) = (stop_wrk(kept), stop_wrk(fresh));
    for (load, how) in [(&kept, "keep-alive"), (&fresh, "a connection per request")] {
        eprintln!(
            "{what}, {how}: {} requests, {} refused or failed",
            load.requests,
            load.connect + load.failed()
        );
        assert_lossless(load, &format!("{what} ({how})"), sb);
    }
}

fn assert_lossless(load: &Load, what: &str, sb: &Sandbox) {
    assert!(
        load.requests > 0,
        "{what}: wrk made no request\n{}",
        load.text
    );
    assert_eq!(
        (load.connect, load.failed()),
        (0, 0),
        "{what}: {load:?}\n{}",
        sb.supd_log()
            .lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn upgrades_rollbacks_restarts_and_reexecs_under_load_refuse_nothing() {
    let mut sb = Sandbox::new();
    let port = free_port();
    setup(&mut sb, port);
    let n = cycles();
    let mut w = sb.watch();
    let load = start_load(port);
    let began = Instant::now();
    for i in 0..n {
        ok(&sb, &["upgrade", "web", "2.0.0"]);
        wait_running(&sb, &mut w, "2.0.0");
        ok(&sb, &["rollback", "web"]);
        wait_running(&sb, &mut w, "1.0.0");
        let pid = sb.status("web")["pid"].clone();
        ok(&sb, &["restart", "web"]);
        w.until(&sb, |e| {
            e["event"] == "state"
                && e["service"] == "web"
                && e["to"] == "running"
                && e["pid"] != pid
        });
        if i % (n / 5).max(1) == 0 {
            sb.reexec();
            // A reexec drops the control connections (the watch among them).
            w = sb.watch();
        }
    }
    let spent = began.elapsed();
    stop_load(
        &sb,
        load,
        &format!("{n} upgrades, {n} rollbacks, {n} restarts, 5 reexecs in {spent:.1?}"),
    );
    // The connections it kept across runs went through supd's store, and none is
    // left there between runs that would hold a client's connection open.
    assert!(
        sb.status("web").get("stored_fds").is_none(),
        "{}",
        sb.status("web")
    );
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

#[test]
fn a_version_that_crash_loops_under_load_is_rolled_back_with_nothing_refused() {
    let mut sb = Sandbox::new();
    let port = free_port();
    setup(&mut sb, port);
    let mut w = sb.watch();
    let load = start_load(port);
    let out = sb.supctl(&["upgrade", "web", "3.0.0", "--wait"]);
    assert_eq!(out.status.code(), Some(1), "3.0.0 was committed: {out:?}");
    wait_running(&sb, &mut w, "1.0.0");
    // Served by 1.0.0 again, through the same socket.
    assert_eq!(version_answering(port), "1.0.0");
    stop_load(&sb, load, "a crash-looping version rolled back");
    let versions = sb.supctl(&["versions", "web"]);
    assert!(
        String::from_utf8_lossy(&versions.stdout).contains("bad"),
        "3.0.0 not marked bad: {versions:?}"
    );
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

/// Without `listen`, the same server binding its own port is refused connections at
/// each restart: the measure the lossless tests would pass without supd's sockets.
#[test]
fn without_held_sockets_a_restart_refuses_connections() {
    let mut sb = Sandbox::new();
    let port = free_port();
    sb.config(&format!(
        r#"[service.web]
command = ["python3", "{SERVE}", "--bind", "127.0.0.1:{port}", "--start-ms", "300"]
ready = "notify"
"#
    ));
    sb.start();
    // Ready once it listens.
    sb.wait_state("web", "running");
    let mut w = sb.watch();
    let wrk = start_wrk(port, true);
    for _ in 0..3 {
        let pid = sb.status("web")["pid"].clone();
        ok(&sb, &["restart", "web"]);
        w.until(&sb, |e| {
            e["event"] == "state"
                && e["service"] == "web"
                && e["to"] == "running"
                && e["pid"] != pid
        });
    }
    let load = stop_wrk(wrk);
    // wrk connects without waiting: a refused connection is a failed write to it.
    assert!(
        load.connect + load.write > 0,
        "no connection refused without held sockets: {load:?}"
    );
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}
