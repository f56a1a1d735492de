//! supctl for scripts (issue 12): several services and `all`, options after the command,
//! `status` exit codes, errors as JSON, one-line usage errors, and a user the socket
//! refuses told so.

mod common;
use common::*;
use serde_json::Value;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

fn sleepers(sb: &Sandbox, names: &[&str]) {
    let mut cfg = String::new();
    for n in names {
        cfg.push_str(&format!(
            "[service.{n}]\ncommand = [\"/bin/sleep\", \"3600\"]\n"
        ));
    }
    sb.config(&cfg);
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn code(out: &Output) -> Option<i32> {
    out.status.code()
}

fn state(sb: &Sandbox, name: &str) -> String {
    sb.status(name)["state"].as_str().unwrap_or("?").to_string()
}

#[test]
fn start_stop_restart_take_several_services_and_all() {
    let mut sb = Sandbox::new();
    sleepers(&sb, &["a", "b", "c"]);
    sb.start();
    for n in ["a", "b", "c"] {
        sb.wait_state(n, "running");
    }
    // Two at once: both are down when it answers; the third is untouched.
    let out = sb.supctl(&["stop", "a", "b"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("a: stopped") && text.contains("b: stopped"),
        "{text}"
    );
    assert_eq!(
        (state(&sb, "a"), state(&sb, "b"), state(&sb, "c")),
        ("stopped".into(), "stopped".into(), "running".into())
    );
    // An unknown name refuses the whole request: nothing is done.
    let out = sb.supctl(&["stop", "c", "nope"]);
    assert_eq!(code(&out), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no service named 'nope'"),
        "{}",
        stderr(&out)
    );
    assert_eq!(state(&sb, "c"), "running");
    // `all` names every service.
    let out = sb.supctl(&["start", "all"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    for n in ["a", "b", "c"] {
        sb.wait_state(n, "running");
    }
    let before: Vec<Value> = ["a", "c"]
        .iter()
        .map(|n| sb.status(n)["pid"].clone())
        .collect();
    let out = sb.supctl(&["--json", "restart", "a", "c"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("--json prints JSON");
    let names: Vec<&str> = v["services"]
        .as_array()
        .expect("a list of services")
        .iter()
        .map(|s| s["name"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(names, ["a", "c"]);
    let after: Vec<Value> = ["a", "c"]
        .iter()
        .map(|n| sb.status(n)["pid"].clone())
        .collect();
    assert_ne!(before[0], after[0]);
    assert_ne!(before[1], after[1]);
    let out = sb.supctl(&["stop", "all"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    for n in ["a", "b", "c"] {
        assert_eq!(state(&sb, n), "stopped");
    }
}

#[test]
fn options_may_follow_the_command() {
    let mut sb = Sandbox::new();
    sleepers(&sb, &["a"]);
    sb.start();
    sb.wait_state("a", "running");
    let sock = sb.socket.to_string_lossy().into_owned();
    let out = Command::new(SUPCTL)
        .args(["status", "a", "-s", &sock, "--json", "--timeout", "10s"])
        .output()
        .expect("run supctl");
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("--json after the command");
    assert_eq!(v["services"][0]["name"], "a");
}

#[test]
fn status_exits_3_when_a_named_service_is_not_up() {
    let mut sb = Sandbox::new();
    sb.config(
        "[service.a]\ncommand = [\"/bin/sleep\", \"3600\"]\n\
         [service.b]\ncommand = [\"/bin/sleep\", \"3600\"]\n\
         [service.once]\ncommand = [\"/bin/true\"]\nready = \"exited\"\nrestart = \"never\"\n\
         [service.done]\ncommand = [\"/bin/true\"]\nrestart = \"never\"\n",
    );
    sb.start();
    sb.wait_state("a", "running");
    sb.wait_state("b", "running");
    sb.wait_state("once", "exited");
    sb.wait_state("done", "exited");
    assert_eq!(code(&sb.supctl(&["stop", "b"])), Some(0));
    let st = |args: &[&str]| code(&sb.supctl(args));
    assert_eq!(st(&["status", "a"]), Some(0));
    // A one-shot whose ready is "exited" is up once it exited; another exited one is not.
    assert_eq!(st(&["status", "once"]), Some(0));
    assert_eq!(st(&["status", "done"]), Some(3));
    assert_eq!(st(&["status", "a", "b"]), Some(3));
    assert_eq!(st(&["--json", "status", "b"]), Some(3));
    // No service named: every one of them.
    let out = sb.supctl(&["status"]);
    assert_eq!(code(&out), Some(3));
    assert!(stderr(&out).contains("not up: b, done"), "{}", stderr(&out));
    assert_eq!(st(&["status", "a", "once"]), Some(0));
    assert_eq!(st(&["status", "nope"]), Some(1));
}

#[test]
fn errors_are_json_with_json() {
    let mut sb = Sandbox::new();
    sleepers(&sb, &["a"]);
    sb.start();
    let err = |out: &Output| -> Value {
        serde_json::from_str(stderr(out).trim())
            .unwrap_or_else(|e| panic!("stderr is not one JSON object ({e}): {}", stderr(out)))
    };
    let out = sb.supctl(&["--json", "stop", "nope"]);
    assert_eq!(code(&out), Some(1));
    let e = err(&out);
    assert_eq!(
        (
            e["ok"].clone(),
            e["exit"].clone(),
            e["error"]["kind"].clone()
        ),
        (Value::Bool(false), 1.into(), "unknown-service".into())
    );
    assert!(out.stdout.is_empty());
    let out = sb.supctl(&["frobnicate", "--json"]);
    assert_eq!(code(&out), Some(2));
    assert_eq!(err(&out)["error"]["kind"], "usage");
    let out = Command::new(SUPCTL)
        .args(["--json", "-s", "/nonexistent/sup.sock", "status"])
        .output()
        .expect("run supctl");
    assert_eq!(code(&out), Some(3));
    assert_eq!(err(&out)["error"]["kind"], "unreachable");
}

#[test]
fn a_usage_error_is_one_line_with_a_hint() {
    let mut sb = Sandbox::new();
    sleepers(&sb, &["a"]);
    sb.start();
    for (args, says) in [
        (
            &["frobnicate"][..],
            "supctl: unknown command 'frobnicate'; try 'supctl --help'",
        ),
        (
            &["--bogus", "status"][..],
            "supctl: unknown option '--bogus'; try 'supctl --help'",
        ),
        (
            &["stop"][..],
            "supctl: stop takes SERVICE... (or all); try 'supctl --help'",
        ),
    ] {
        let out = sb.supctl(args);
        assert_eq!(code(&out), Some(2), "{args:?}");
        assert_eq!(stderr(&out), format!("{says}\n"), "{args:?}");
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn a_user_the_socket_refuses_is_told_so() {
    let mut sb = Sandbox::new();
    sleepers(&sb, &["a"]);
    sb.start();
    let sock = sb.socket.to_string_lossy().into_owned();
    let as_nobody = || {
        let mut c = Command::new(SUPCTL);
        c.args(["-s", &sock, "status"]);
        if is_root() {
            c.uid(65534).gid(65534);
        }
        c.output().expect("run supctl")
    };
    // The socket's mode keeps the user out: connect fails with EACCES.
    if !is_root() {
        // Its owner, without write permission, is kept out just the same.
        std::fs::set_permissions(
            &sb.socket,
            std::os::unix::fs::PermissionsExt::from_mode(0o000),
        )
        .expect("chmod socket");
    }
    let out = as_nobody();
    assert_eq!(code(&out), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("permission-denied") && said.contains("socket_group"),
        "{said}"
    );
    assert!(!said.contains("is supd running"), "{said}");
    if is_root() {
        // A socket opened to all: supd itself refuses the stranger.
        std::fs::set_permissions(
            &sb.socket,
            std::os::unix::fs::PermissionsExt::from_mode(0o666),
        )
        .expect("chmod socket");
        let out = as_nobody();
        assert_eq!(code(&out), Some(1), "{}", stderr(&out));
        let said = stderr(&out);
        assert!(
            said.contains("permission-denied") && said.contains("socket_group"),
            "{said}"
        );
    }
}

#[test]
fn reload_with_a_service_sends_its_reload_signal() {
    let mut sb = Sandbox::new();
    // HUP ignored: it survives its reload, as nginx or sshd would.
    let svc = sb.script("svc", "trap '' HUP\nexec sleep 3600");
    sb.config(&format!("[service.a]\ncommand = [\"{svc}\"]\n"));
    sb.start();
    let pid = sb.wait_state("a", "running")["pid"].clone();
    let out = sb.supctl(&["reload", "a"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("a: sent HUP"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(sb.status("a")["pid"], pid, "still the same process");
}
