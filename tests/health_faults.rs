//! Health checks against rude processes: what an adversary found (each test failed
//! before its fix) and what it tried that must keep holding.

mod common;
use common::files::wait_file;
use common::*;
use std::time::{Duration, Instant};

/// A check command dies with a killed supd (PR_SET_PDEATHSIG), but what it started does
/// not: a check that runs `sleep` under a shell left the `sleep` behind forever, and a
/// new supd on the same state_dir did not end it (a check had no pid record).
#[test]
fn what_a_check_started_does_not_outlive_a_killed_supd() {
    let mut sb = Sandbox::new();
    let mark = format!("{}", sb.tag + 3_000_000);
    let pid_file = sb.path("grandchild.pid");
    let check = sb.script(
        "forking-check",
        &format!(
            "[ -e {f} ] && exit 0\nsleep {mark} &\necho $! > {f}.tmp\nmv {f}.tmp {f}\nwait",
            f = pid_file.display()
        ),
    );
    sb.config(&format!(
        r#"
[service.a]
command = ["/bin/sleep", "3600"]
health = {{ command = ["{check}"], interval = "1h", timeout = "1h" }}
"#
    ));
    sb.start();
    wait_file(&pid_file, |t| t.ends_with('\n'));
    sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    // A new supd ends what the killed one left: its services and its checks (its own
    // check finds the file and starts nothing).
    sb.start();
    wait_gone(&["sleep", &mark], "a check's child outlived supd");
}

/// A wall clock set far ahead (past the year 9999, a typo in `date -s` or a broken RTC)
/// while checks run and fail: deadlines follow the monotonic clock, and supd must not
/// die of formatting a date (it did: its logger's stamp panicked on the first line).
#[test]
fn a_wall_clock_far_ahead_does_not_kill_supd_while_checks_fail() {
    let mut sb = Sandbox::new();
    let shim = common::clock::clock_shim(&sb);
    // Nobody listens on a port just bound and closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    sb.config(&format!(
        r#"
[service.a]
command = ["/bin/sleep", "3600"]
restart_delay = "10ms"
crash_loop = {{ restarts = 1000, window = "1m" }}
health = {{ tcp = "127.0.0.1:{port}", interval = "50ms", timeout = "1s", failures = 2 }}
"#
    ));
    let mut cmd = std::process::Command::new(SUPD);
    cmd.env("LD_PRELOAD", &shim)
        .env("SUP_TEST_CLOCK_OFFSET_MS", "10000000000000000");
    sb.start_with(cmd, &["-c"]);
    let mut w = sb.watch();
    let e = w.until(&sb, |e| e["event"] == "health" && e["to"] == "unhealthy");
    assert!(
        e["reason"]
            .as_str()
            .is_some_and(|r| r.contains("health: 2 failures: cannot connect")),
        "{e}"
    );
    let st = sb.status("a");
    assert!(st["restarts"].as_u64().is_some(), "{st}");
}

/// A loopback server of rude answers, a port for each of MODES (comma-separated): it
/// writes the ports, in order, to READY.
const RUDE_SERVER: &str = r#"#!/usr/bin/python3
import os, socket, sys, threading, time
modes, ready = sys.argv[1].split(","), sys.argv[2]
answers = {
    "garbage": b"\x00\xff\xfe garbage\r\n",
    "huge": b"HTTP/1.1 500 " + b"A" * 100000 + b"\r\n\r\n",
    "http09": b"<html>ok</html>",
    "2000": b"HTTP/1.1 2000 OK\r\n\r\n",
    "204": b"HTTP/1.1 204 No Content\r\n\r\n",
    "301": b"HTTP/1.1 301 Moved\r\nLocation: /x\r\n\r\n",
    "399": b"HTTP/1.1 399 X\r\n\r\n",
}
def serve(l, mode):
    while True:
        c, _ = l.accept()
        def one(c):
            if mode == "silent":
                time.sleep(3600)
            elif mode == "loris":
                for b in b"HTTP/1.1 200 OK\r\n":
                    c.send(bytes([b])); time.sleep(1)
            else:
                c.sendall(answers[mode])
            c.close()
        threading.Thread(target=one, args=(c,), daemon=True).start()
ports = []
for m in modes:
    l = socket.socket()
    l.bind(("127.0.0.1", 0)); l.listen(64)
    ports.append(str(l.getsockname()[1]))
    threading.Thread(target=serve, args=(l, m), daemon=True).start()
open(ready + ".tmp", "w").write(" ".join(ports) + "\n")
os.rename(ready + ".tmp", ready)
while True:
    time.sleep(3600)
"#;

/// Rude HTTP servers each fail their check with a reason that says what was wrong, a
/// 204 passes, and supd answers at once while a silent one and a slow one hang.
#[test]
fn rude_http_servers_fail_with_their_reason_and_supd_answers_meanwhile() {
    let mut sb = Sandbox::new();
    let modes = [
        ("silent", "no answer from 127.0.0.1:PORT/h within 600ms"),
        ("loris", "no answer from 127.0.0.1:PORT/h within 600ms"),
        ("garbage", "no HTTP status line from 127.0.0.1:PORT/h"),
        ("huge", "HTTP 500 from 127.0.0.1:PORT/h"),
        ("http09", "no HTTP status line from 127.0.0.1:PORT/h"),
        ("2000", "no HTTP status line from 127.0.0.1:PORT/h"),
        ("204", ""),
        ("301", "HTTP 301 from 127.0.0.1:PORT/h"),
        ("399", "HTTP 399 from 127.0.0.1:PORT/h"),
    ];
    let server = sb.file("rude.py", RUDE_SERVER);
    let ready = sb.path("rude.ready");
    let names: Vec<&str> = modes.iter().map(|(m, _)| *m).collect();
    let mut srv = std::process::Command::new(&server)
        .args([names.join(","), ready.to_string_lossy().into_owned()])
        .spawn()
        .expect("start the rude server");
    let ports: Vec<String> = wait_file(&ready, |t| t.ends_with('\n'))
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let services: String = modes
        .iter()
        .enumerate()
        .map(|(i, (m, _))| {
            format!(
                "[service.h-{m}]\ncommand = [\"/bin/sleep\", \"3600\"]\nhealth = {{ http = \"http://127.0.0.1:{}/h\", interval = \"100ms\", timeout = \"600ms\", failures = 1000 }}\n",
                ports[i]
            )
        })
        .collect();
    sb.config(&services);
    sb.start();
    let end = Instant::now() + DEADLINE;
    // A supd that waited on its checks would answer nearly every look after a silent
    // server's 600 ms; a loaded machine delays a few.
    let (mut looks, mut slow) = (0, Vec::new());
    for (i, (m, want)) in modes.iter().enumerate() {
        let want = want.replace("PORT", &ports[i]);
        loop {
            let t = Instant::now();
            let st = sb.status(&format!("h-{m}"));
            looks += 1;
            if t.elapsed() >= Duration::from_millis(500) {
                slow.push(t.elapsed());
            }
            let done = if want.is_empty() {
                st["health"] == "healthy"
            } else {
                st["health_last_failure"]["reason"] == want.as_str()
            };
            if done {
                assert_eq!(st["state"], "running", "{st}");
                break;
            }
            if Instant::now() >= end {
                let _ = srv.kill();
                let _ = srv.wait();
                panic!("{m}: wanted {want:?}: {st}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = srv.kill();
    let _ = srv.wait();
    assert!(
        slow.len() <= 3,
        "{} of {looks} status answers took 500 ms or more: {slow:?}",
        slow.len()
    );
}

/// A check command whose program leaves a daemon behind (a helper that double-forks
/// into a session of its own, as agents and CLIs with background helpers do): each run
/// left one more, reparented to supd, forever; the check's process group is killed
/// when it ends, but a new session escapes it. Where supd has cgroups, a check runs in
/// a cgroup of its service's checks, killed when a run ends.
#[test]
fn a_daemon_left_by_a_check_does_not_outlive_the_check() {
    if !common::oldkernel::has_cgroup2() {
        eprintln!("skipped: needs root and a cgroup2 hierarchy");
        return;
    }
    let mut sb = Sandbox::new();
    let mark = format!("{}", sb.tag + 4_000_000);
    let runs = sb.path("runs");
    let check = sb.script(
        "daemonizing-check",
        &format!(
            // The check waits until its daemon is in a session of its own.
            "rm -f {d}\nsetsid sh -c 'echo $$ > {d}; exec sleep {mark}' </dev/null >/dev/null 2>&1 &\n\
             while [ ! -s {d} ]; do sleep 0.01; done\necho run >> {r}\nexit 0",
            d = sb.path("daemon.pid").display(),
            r = runs.display()
        ),
    );
    sb.config(&format!(
        r#"
[service.a]
command = ["/bin/sleep", "3600"]
health = {{ command = ["{check}"], interval = "100ms", timeout = "1s" }}
"#
    ));
    sb.start();
    wait_file(&runs, |t| t.lines().count() >= 5);
    // Each run's daemon ended with its run: one at most is there (the last run's, as
    // it ends).
    let alive = processes_with_cmdline(&["sleep", &mark]);
    if alive.len() > 1 {
        for p in &alive {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        panic!("daemons of past runs: {alive:?}");
    }
    sb.ok(serde_json::json!({"cmd": "stop", "service": "a"}));
    sb.wait_state("a", "stopped");
    wait_gone(
        &["sleep", &mark],
        "a check's daemon outlived its check and service",
    );
}

/// A check under way when supd stops: its daemon (a session of its own, in the check's
/// cgroup) ends with it, though supd exits before it would reap the check.
#[test]
fn a_daemon_of_a_check_under_way_ends_when_supd_stops() {
    if !common::oldkernel::has_cgroup2() {
        eprintln!("skipped: needs root and a cgroup2 hierarchy");
        return;
    }
    let mut sb = Sandbox::new();
    let mark = format!("{}", sb.tag + 5_000_000);
    let daemon = sb.path("daemon.pid");
    let check = sb.script(
        "daemonizing-check",
        &format!(
            "setsid sh -c 'echo $$ > {d}.tmp; mv {d}.tmp {d}; exec sleep {mark}' </dev/null >/dev/null 2>&1 &\n\
             exec sleep 3600",
            d = daemon.display()
        ),
    );
    sb.config(&format!(
        r#"
[service.a]
command = ["/bin/sleep", "3600"]
health = {{ command = ["{check}"], interval = "1h", timeout = "1h" }}
"#
    ));
    sb.start();
    wait_file(&daemon, |t| t.ends_with('\n'));
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
    wait_gone(&["sleep", &mark], "a check's daemon outlived supd's stop");
}
