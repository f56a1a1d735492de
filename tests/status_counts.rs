//! Issue 27: `status` as an operator reads it. RESTARTS counts the restarts of the
//! current run of the version that runs (afresh at an upgrade, a rollback, a reload
//! that changed the service, an operator's start or restart); `restarts_total` counts
//! since supd started, across `reexec`; a service that does not run shows no health;
//! after a rollback the last exit is not the bad version's.

mod common;
use common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const GOOD: &str = "exec /bin/sleep 3600";

fn agent_config(sb: &Sandbox, extra: &str) {
    sb.config(&format!(
        r#"
[service.agent]
tool = "agent"
command = ["bin/agent"]
restart_delay = "10ms"
crash_loop = {{ restarts = 20, window = "1m" }}
on_crash_loop = "cooldown"
cooldown = "1h"
probation = "1s"
stop_timeout = "2s"
{extra}
"#
    ));
}

/// The status of `agent` once `pred` holds of it, looked at again at each event (and
/// at least every 200 ms), within the deadline.
fn wait_status(sb: &Sandbox, pred: impl Fn(&Value) -> bool) -> Value {
    let mut w = sb.watch();
    let end = Instant::now() + DEADLINE;
    loop {
        let s = sb.status("agent");
        if pred(&s) {
            return s;
        }
        assert!(Instant::now() < end, "never came: {s}\n{}", sb.supd_log());
        let _ = w.next_within(Duration::from_millis(200));
    }
}

fn counts(s: &Value) -> (Value, Value) {
    (s["restarts"].clone(), s["restarts_total"].clone())
}

/// Kills the agent's process: supd restarts it (one more restart) on the same version.
fn crash(sb: &Sandbox) -> Value {
    let before = sb.status("agent");
    let pid = before["pid"].as_i64().expect("a pid");
    let total = before["restarts_total"].as_u64().expect("restarts_total");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    wait_status(sb, |s| {
        s["state"] == "running" && s["pid"] != pid && s["restarts_total"] == total + 1
    })
}

fn running_anew(sb: &Sandbox, pid: &Value, version: &str) -> Value {
    wait_status(sb, |s| {
        s["state"] == "running" && s["pid"] != *pid && s["version"] == version
    })
}

#[test]
fn restarts_start_afresh_with_each_version_and_the_total_goes_on_across_reexec() {
    let mut sb = Sandbox::new();
    agent_config(&sb, "");
    sb.start();
    sb.install_version("1.0.0", GOOD);
    sb.upgrade_wait("1.0.0", true);
    crash(&sb);
    let s = crash(&sb);
    assert_eq!(counts(&s), (json!(2), json!(2)), "{s}");

    // An upgrade: 2.0.0's run counts from 0; the total goes on.
    sb.install_version("2.0.0", GOOD);
    sb.upgrade_wait("2.0.0", true);
    let s = running_anew(&sb, &s["pid"], "2.0.0");
    assert_eq!(counts(&s), (json!(0), json!(2)), "{s}");
    let s = crash(&sb);
    assert_eq!(counts(&s), (json!(1), json!(3)), "{s}");

    // A rollback likewise.
    let out = sb.supctl(&["rollback", "agent"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = running_anew(&sb, &s["pid"], "1.0.0");
    assert_eq!(counts(&s), (json!(0), json!(3)), "{s}");

    // reexec changes neither.
    let s = crash(&sb);
    assert_eq!(counts(&s), (json!(1), json!(4)), "{s}");
    sb.reexec();
    let after = sb.status("agent");
    assert_eq!(after["pid"], s["pid"]);
    assert_eq!(counts(&after), (json!(1), json!(4)), "{after}");
    let out = sb.supctl(&["status", "agent"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let row = text.lines().nth(1).unwrap_or("");
    assert!(
        row.split_whitespace().any(|w| w == "1") && row.contains("1.0.0"),
        "RESTARTS is the run's: {text}"
    );
}

#[test]
fn restarts_start_afresh_at_a_reload_that_changes_it_and_at_an_operators_restart() {
    let mut sb = Sandbox::new();
    sb.provision_version("1.0.0", GOOD);
    agent_config(&sb, "");
    sb.start();
    wait_status(&sb, |s| s["state"] == "running");
    crash(&sb);
    let s = crash(&sb);
    assert_eq!(counts(&s), (json!(2), json!(2)), "{s}");

    // A reload that does not change it counts on...
    let out = sb.supctl(&["reload"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(counts(&sb.status("agent")), (json!(2), json!(2)));
    // ...one that changes it starts afresh.
    agent_config(&sb, "env = { CHANGED = \"1\" }");
    let out = sb.supctl(&["reload"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = running_anew(&sb, &s["pid"], "1.0.0");
    assert_eq!(counts(&s), (json!(0), json!(2)), "{s}");

    let s = crash(&sb);
    assert_eq!(counts(&s), (json!(1), json!(3)), "{s}");
    let out = sb.supctl(&["restart", "agent"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = running_anew(&sb, &s["pid"], "1.0.0");
    assert_eq!(counts(&s), (json!(0), json!(3)), "{s}");

    // A stop and a start by the operator too.
    let s = crash(&sb);
    assert_eq!(counts(&s), (json!(1), json!(4)), "{s}");
    let out = sb.supctl(&["stop", "agent"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = sb.supctl(&["start", "agent"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = running_anew(&sb, &s["pid"], "1.0.0");
    assert_eq!(counts(&s), (json!(0), json!(4)), "{s}");
}

#[test]
fn a_service_that_does_not_run_shows_no_health() {
    let mut sb = Sandbox::new();
    sb.provision_version("1.0.0", GOOD);
    agent_config(
        &sb,
        r#"health = { command = ["/bin/true"], interval = "100ms", timeout = "1s", failures = 3 }"#,
    );
    sb.start();
    wait_status(&sb, |s| s["health"] == "healthy" && s["state"] == "running");
    let out = sb.supctl(&["stop", "agent"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = sb.status("agent");
    assert_eq!(s["state"], "stopped");
    assert_eq!(
        s["health"],
        Value::Null,
        "a stopped service is not healthy: {s}"
    );
    let out = sb.supctl(&["status", "agent"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("healthy"), "{text}");
    // Started again, it is healthy again once a check passes.
    let out = sb.supctl(&["start", "agent"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_status(&sb, |s| s["health"] == "healthy");
}

#[test]
fn after_a_rollback_the_last_exit_is_not_the_bad_versions() {
    let mut sb = Sandbox::new();
    agent_config(&sb, "");
    // A crash loop at 3 restarts, for 2.0.0 to be rolled back soon.
    let text = std::fs::read_to_string(sb.path("sup.toml")).expect("config");
    std::fs::write(
        sb.path("sup.toml"),
        text.replace("restarts = 20", "restarts = 3"),
    )
    .expect("config");
    sb.start();
    sb.install_version("1.0.0", GOOD);
    sb.upgrade_wait("1.0.0", true);
    sb.install_version("2.0.0", "exit 3");
    sb.upgrade_wait("2.0.0", false);
    let s = wait_status(&sb, |s| s["state"] == "running" && s["version"] == "1.0.0");
    assert_eq!(
        s["last_exit"],
        Value::Null,
        "2.0.0's exit beside 1.0.0: {s}"
    );
    assert_eq!(s["restarts"], 0, "{s}");
    assert!(s["restarts_total"].as_u64().unwrap_or(0) >= 3, "{s}");
    // 2.0.0's exits stay in its bad mark.
    let v = sb.ok(json!({"cmd": "versions", "tool": "agent"}));
    let bad = v["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|x| x["version"] == "2.0.0")
        .cloned()
        .unwrap_or_default();
    assert_eq!(bad["bad"], true, "{v}");
    assert!(
        bad["bad_reason"]
            .as_str()
            .unwrap_or("")
            .contains("exited with code 3"),
        "{v}"
    );
}
