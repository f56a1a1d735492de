//! Health checks against rude processes: what an adversary found (each test failed
//! before its fix) and what it tried that must keep holding.

mod common;
use common::files::wait_file;
use common::*;
use std::time::{Duration, Instant};

/// Waits until no process has `argv` (by pid, with the deadline); on the deadline, kills
/// what is left by its pid and panics with `what`.
fn wait_gone(argv: &[&str], what: &str) {
    let end = Instant::now() + DEADLINE;
    while let Some(&pid) = processes_with_cmdline(argv).first() {
        if Instant::now() >= end {
            for p in processes_with_cmdline(argv) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            panic!("{what}: {argv:?} (pid {pid}) is still there");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

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
