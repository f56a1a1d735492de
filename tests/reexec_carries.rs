//! `reexec` carries what is under way, or refuses while it cannot: a run draining after
//! its leader was reaped (supd must still exit afterwards), held stops, health state; a
//! reload under way is refused with the error kind `busy`.

mod common;
use common::freezer::Freezer;
use common::locking::lines;
use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// How long supd may take to exit on SIGTERM once nothing of its services is left.
const EXIT_BOUND: Duration = Duration::from_secs(5);

fn pid_of(v: &Value) -> i32 {
    v["pid"].as_i64().expect("a pid") as i32
}

/// Asks `status` until `pred` holds (each ask a round trip, bounded by the deadline).
fn status_until(sb: &Sandbox, service: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let end = Instant::now() + DEADLINE;
    loop {
        let s = sb.status(service);
        if pred(&s) {
            return s;
        }
        assert!(Instant::now() < end, "status never matched: {s}");
    }
}

/// Shell lines that start a member of the service's run (same process group and
/// cgroup) that writes its pid to `file`, wait until it has, then say ready on fd 3.
fn member_then_ready(sb: &Sandbox, file: &str) -> String {
    let f = sb.path(file);
    format!(
        "rm -f {f}\nsh -c 'echo $$ > {f}.tmp; mv {f}.tmp {f}; exec sleep 3600' &\n\
         while [ ! -s {f} ]; do :; done\necho >&3",
        f = f.display()
    )
}

/// SIGTERM to supd; it must be gone within `EXIT_BOUND`.
fn terminate_within_bound(sb: &mut Sandbox) {
    let mut child = sb.supd.take().expect("supd running");
    let pid = child.id() as i32;
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    let exited = wait_exit(pid, EXIT_BOUND).is_some();
    if !exited {
        let _ = child.kill();
    }
    let _ = child.wait();
    assert!(
        exited,
        "supd did not exit within {EXIT_BOUND:?} of SIGTERM\n{}",
        sb.supd_log()
    );
}

/// The leader of a run was reaped while a member of it is slow to die (frozen); a
/// `reexec` meanwhile must not bring the reaped leader's pid back as a live one: the
/// run ends, the service starts again, and SIGTERM still makes supd exit.
#[test]
fn a_reexec_while_a_run_drains_still_lets_supd_exit() {
    let mut sb = Sandbox::new();
    let Some(freezer) = is_root().then(|| Freezer::new(sb.tag)).flatten() else {
        eprintln!("skipped: needs root and a cgroup v1 freezer");
        return;
    };
    let helper = member_then_ready(&sb, "member");
    let svc = sb.script("svc", &format!("{helper}\nexec sleep 3600"));
    sb.config(&format!(
        "[service.one]\ncommand = [\"{svc}\"]\nready = \"fd:3\"\nrestart_delay = \"0s\"\n"
    ));
    sb.start();
    let first = pid_of(&sb.wait_state("one", "running"));
    let member: i32 = lines(&sb, "member")[0].parse().expect("member pid");
    freezer.freeze(member);
    kill(Pid::from_raw(first), Signal::SIGKILL).expect("kill the leader");
    status_until(&sb, "one", |s| {
        s["reason"]
            .as_str()
            .is_some_and(|r| r.contains("waiting for the rest of its run"))
    });
    sb.reexec();
    // Still draining after the exec: not started again beside the frozen member.
    let s = sb.status("one");
    assert_eq!(pid_of(&s), first, "not started again: {s}");
    let mut w = sb.watch();
    freezer.thaw();
    let second = pid_of(&w.state(&sb, "one", "running"));
    assert_ne!(second, first);
    terminate_within_bound(&mut sb);
}

/// The same, with SIGTERM while the run still drains: supd exits once it is over.
#[test]
fn a_shutdown_after_a_reexec_while_a_run_drains_ends() {
    let mut sb = Sandbox::new();
    let Some(freezer) = is_root().then(|| Freezer::new(sb.tag)).flatten() else {
        eprintln!("skipped: needs root and a cgroup v1 freezer");
        return;
    };
    let helper = member_then_ready(&sb, "member");
    let svc = sb.script("svc", &format!("{helper}\nexec sleep 3600"));
    sb.config(&format!(
        "[service.one]\ncommand = [\"{svc}\"]\nready = \"fd:3\"\nrestart_delay = \"1h\"\nrestart_delay_max = \"1h\"\n"
    ));
    sb.start();
    let first = pid_of(&sb.wait_state("one", "running"));
    let member: i32 = lines(&sb, "member")[0].parse().expect("member pid");
    freezer.freeze(member);
    kill(Pid::from_raw(first), Signal::SIGKILL).expect("kill the leader");
    status_until(&sb, "one", |s| {
        s["reason"]
            .as_str()
            .is_some_and(|r| r.contains("waiting for the rest of its run"))
    });
    sb.reexec();
    let a = sb.ok(json!({"cmd": "shutdown"}));
    assert_eq!(a["shutting_down"], true);
    freezer.thaw();
    terminate_within_bound(&mut sb);
}

/// `stop a b` where b comes after a: a's stop is held until b is down. A reexec while
/// b is still stopping carries the held stop: a keeps running until b is down, then
/// stops (before, the old image carried it out at once, out of order).
#[test]
fn a_held_stop_is_carried_across_reexec() {
    let mut sb = Sandbox::new();
    // b ignores its stop signal (the ignored disposition is kept across exec); it says
    // so once it does ("running" comes at the shell's exec, before its trap).
    let ignoring = sb.path("b-ignores-term");
    sb.config(&format!(
        r#"
[service.a]
command = ["/bin/sleep", "3600"]

[service.b]
command = ["/bin/sh", "-c", "trap '' TERM; : > {}; exec /bin/sleep 3600"]
after = ["a"]
stop_timeout = "1h"
"#,
        ignoring.display()
    ));
    sb.start();
    sb.wait_state("a", "running");
    let b = pid_of(&sb.wait_state("b", "running"));
    common::files::wait_file(&ignoring, |_| ignoring.exists());
    let mut stopper = sb.client();
    stopper.send_raw(b"{\"id\": 1, \"cmd\": \"stop\", \"services\": [\"a\", \"b\"]}\n");
    status_until(&sb, "b", |s| s["state"] == "stopping");
    assert_eq!(sb.status("a")["state"], "running", "held until b is down");
    sb.reexec();
    let a = sb.status("a");
    assert_eq!(
        a["state"], "running",
        "the held stop of a waits for b after the reexec too: {a}"
    );
    let mut w = sb.watch();
    kill(Pid::from_raw(b), Signal::SIGKILL).expect("kill b");
    w.state(&sb, "a", "stopped");
    assert_eq!(sb.status("b")["state"], "stopped");
    drop(stopper);
    terminate_within_bound(&mut sb);
}

/// A service's health is carried across reexec: healthy stays healthy (it was unknown
/// again until the next check, which start_delay put off), its check not made anew.
#[test]
fn health_state_is_carried_across_reexec() {
    let mut sb = Sandbox::new();
    let count = sb.path("checks");
    let check = sb.script("check", &format!("echo x >> {}", count.display()));
    sb.config(&format!(
        r#"
[service.h]
command = ["/bin/sleep", "3600"]
health = {{ command = ["{check}"], interval = "1h", timeout = "5s", failures = 1, start_delay = "300ms" }}
"#
    ));
    sb.start();
    sb.wait_state("h", "running");
    status_until(&sb, "h", |s| s["health"] == "healthy");
    sb.reexec();
    let s = sb.status("h");
    assert_eq!(s["health"], "healthy", "health carried: {s}");
    assert_eq!(
        lines(&sb, "checks").len(),
        1,
        "the check is not started anew"
    );
    terminate_within_bound(&mut sb);
}

/// A reload under way cannot be carried (its client and helper belong to the old
/// image): `reexec` is refused with the kind `busy`, saying what it waits for, and
/// succeeds once the reload answered.
#[test]
fn a_reexec_while_a_reload_is_under_way_is_refused_as_busy() {
    let mut sb = Sandbox::new();
    sb.config("[service.a]\ncommand = [\"/bin/sleep\", \"3600\"]\n");
    let mut cmd = std::process::Command::new(SUPD);
    cmd.env("SUP_FAILPOINT", "reload-reader-waits");
    sb.start_with(cmd, &["-c"]);
    sb.wait_state("a", "running");
    let gate = sb.path("state/reload-gate");
    nix::unistd::mkfifo(&gate, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    let mut reloader = sb.client();
    reloader.send_raw(b"{\"id\": 1, \"cmd\": \"reload\"}\n");
    // The reload's helper waits at the gate: the reload is under way.
    let a = sb.request(json!({"cmd": "reexec"}));
    assert_eq!(a["ok"], false, "{a}");
    assert_eq!(a["error"]["kind"], "busy", "{a}");
    let msg = a["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("reload") && msg.contains("try again"), "{msg}");
    let out = sb.supctl(&["reexec"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("busy") && err.contains("reload"), "{err}");
    // Open the gate: the reload is read and answered; then the reexec goes through.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&gate)
        .expect("open the gate");
    let answer = reloader.read().expect("the reload's answer");
    assert_eq!(answer["ok"], true, "{answer}");
    let _ = std::fs::remove_file(&gate);
    sb.reexec();
    assert_eq!(sb.status("a")["state"], "running");
    terminate_within_bound(&mut sb);
}
