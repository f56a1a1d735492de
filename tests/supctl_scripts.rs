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
    assert_eq!(code(&out), Some(4));
    assert_eq!(err(&out)["error"]["kind"], "unreachable");
    assert_eq!(err(&out)["exit"], 4);
}

// see: issue 24, item 6 — `supctl status` exited 3 both when supd could not be reached
// and when a service was not up; and 0 while supd ran with config errors.
#[test]
fn unreachable_is_4_for_every_command_and_config_errors_are_5() {
    let mut sb = Sandbox::new();
    let gone = sb.path("gone.sock").display().to_string();
    for args in [
        &["status"][..],
        &["status", "a"],
        &["--json", "status"],
        &["stop", "a"],
        &["reload"],
        &["hello"],
    ] {
        let out = Command::new(SUPCTL)
            .arg("-s")
            .arg(&gone)
            .args(args)
            .output()
            .expect("run supctl");
        assert_eq!(code(&out), Some(4), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("cannot reach supd"),
            "{}",
            stderr(&out)
        );
    }
    // supd up, its config broken: nothing named is down, yet not all is well.
    sb.config("[service.a]\ncommand = [\"/bin/sleep\", \"3600\"]\nrestart = \"maybe\"\n");
    sb.start();
    for args in [&["status"][..], &["--json", "status"]] {
        let out = sb.supctl(args);
        assert_eq!(code(&out), Some(5), "{args:?}: {}", stderr(&out));
    }
    assert!(stderr(&sb.supctl(&["status"])).contains("config"));
    assert_eq!(
        code(&sb.supctl(&["status", "a"])),
        Some(1),
        "no such service"
    );
    sleepers(&sb, &["a", "b"]);
    assert_eq!(code(&sb.supctl(&["reload"])), Some(0));
    sb.wait_state("a", "running");
    sb.wait_state("b", "running");
    assert_eq!(code(&sb.supctl(&["status"])), Some(0));
    // A service not up says so (3) over the config's errors (5).
    assert_eq!(code(&sb.supctl(&["stop", "b"])), Some(0));
    assert_eq!(code(&sb.supctl(&["status", "a"])), Some(0));
    assert_eq!(code(&sb.supctl(&["status"])), Some(3));
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

/// Lines of a child's stdout, read by a thread, handed over with a deadline.
struct Lines {
    child: std::process::Child,
    rx: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn spawn(mut cmd: Command) -> Lines {
        use std::io::BufRead;
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Lines {
            child,
            rx,
            seen: Vec::new(),
        }
    }

    /// The next line, if one comes within `wait`.
    fn next(&mut self, wait: std::time::Duration) -> Option<String> {
        let l = self.rx.recv_timeout(wait).ok()?;
        self.seen.push(l.clone());
        Some(l)
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.wait();
    }
}

/// "14:03:07.123": a readable time of day.
fn is_clock(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b.iter().enumerate().all(|(i, c)| match i {
            2 | 5 => *c == b':',
            8 => *c == b'.',
            _ => c.is_ascii_digit(),
        })
}

/// A `supctl watch` with `args`, subscribed: `a` is restarted until the watch shows an
/// event (supd may serve the watch after the first restart).
fn watching(sb: &Sandbox, args: &[&str]) -> Lines {
    let mut cmd = Command::new(SUPCTL);
    cmd.arg("-s").arg(&sb.socket).args(args);
    let mut w = Lines::spawn(cmd);
    let end = std::time::Instant::now() + DEADLINE;
    while std::time::Instant::now() < end {
        assert_eq!(code(&sb.supctl(&["restart", "a"])), Some(0));
        if w.next(std::time::Duration::from_millis(500)).is_some() {
            return w;
        }
    }
    panic!("supctl watch printed nothing within {DEADLINE:?}");
}

#[test]
fn watch_prints_one_readable_line_per_event_and_json_with_json() {
    let mut sb = Sandbox::new();
    sleepers(&sb, &["a"]);
    sb.start();
    sb.wait_state("a", "running");
    let mut w = watching(&sb, &["watch"]);
    // A stop, then a start; lines of the restarts before may still come first.
    let pid = sb.status("a")["pid"].clone();
    assert_eq!(code(&sb.supctl(&["stop", "a"])), Some(0));
    assert_eq!(code(&sb.supctl(&["start", "a"])), Some(0));
    let new_pid = sb.status("a")["pid"].clone();
    let last = format!("a running pid {new_pid} from starting");
    while !w.seen.last().is_some_and(|l| l.ends_with(&last)) {
        w.next(DEADLINE)
            .unwrap_or_else(|| panic!("no '{last}'; saw {:?}", w.seen));
    }
    for l in &w.seen {
        let words: Vec<&str> = l.split(' ').collect();
        assert!(is_clock(words[0]), "a time of day first: {l}");
        assert_eq!(words[1], "a", "then the service: {l}");
    }
    let first = format!("a stopping pid {pid} from running");
    let at = w
        .seen
        .iter()
        .position(|l| l[13..] == first)
        .unwrap_or_else(|| panic!("no '{first}' in {:?}", w.seen));
    let rest: Vec<&str> = w.seen[at + 1..].iter().map(|l| &l[13..]).collect();
    assert_eq!(
        rest,
        [
            "a stopped from stopping".to_string(),
            format!("a starting pid {new_pid} from stopped"),
            last.clone()
        ],
        "{:?}",
        w.seen
    );
    // --json: the events as supd sends them.
    let j = watching(&sb, &["watch", "--json"]);
    let e: Value = serde_json::from_str(&j.seen[0]).expect("a JSON event");
    assert_eq!(
        (e["event"].clone(), e["service"].clone()),
        ("state".into(), "a".into())
    );
    assert!(e["time"].is_u64(), "{e}");
}

#[test]
fn start_answers_once_up_or_says_why_not() {
    let mut sb = Sandbox::new();
    // Ready after half a second: an answer at once would find it starting.
    let slow = sb.script("slow", "sleep 0.5\necho >&3\nexec sleep 3600");
    let crash = sb.script("crash", "exit 3");
    let unready = sb.script("unready", "exec sleep 3600");
    sb.config(&format!(
        "[service.slow]\ncommand = [\"{slow}\"]\nready = \"fd:3\"\nautostart = false\n\
         [service.missing]\ncommand = [\"/nonexistent/program\"]\nautostart = false\n\
         [service.crash]\ncommand = [\"{crash}\"]\nready = \"fd:3\"\nrestart_delay = \"1m\"\nrestart_delay_max = \"1m\"\nautostart = false\n\
         [service.unready]\ncommand = [\"{unready}\"]\nready = \"fd:3\"\nready_timeout = \"300ms\"\nrestart_delay = \"1m\"\nrestart_delay_max = \"1m\"\nautostart = false\n\
         [service.dependent]\ncommand = [\"/bin/sleep\", \"3600\"]\nafter = [\"slow\"]\nautostart = false\n\
         [service.once]\ncommand = [\"/bin/true\"]\nready = \"exited\"\nrestart = \"never\"\nautostart = false\n"
    ));
    sb.start();
    // A service it comes after that is down: said at once.
    let out = sb.supctl(&["start", "dependent"]);
    assert_eq!(code(&out), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("dependent did not start: it comes after slow, which is stopped"),
        "{}",
        stderr(&out)
    );
    let out = sb.supctl(&["start", "slow"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.starts_with("slow: running (pid "), "{text}");
    assert_eq!(state(&sb, "slow"), "running");
    let out = sb.supctl(&["start", "once"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    for (name, says) in [
        ("missing", "missing did not start: cannot start: "),
        (
            "crash",
            "crash did not start: exited with code 3; restarting in 1m",
        ),
        ("unready", "unready did not start: not ready within 300ms"),
    ] {
        let out = sb.supctl(&["start", name]);
        assert_eq!(code(&out), Some(1), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{name}: {}", stderr(&out));
    }
    // With --json the error is JSON, the services' reasons in its message.
    let out = sb.supctl(&["--json", "restart", "crash", "slow"]);
    assert_eq!(code(&out), Some(1));
    let e: Value = serde_json::from_str(stderr(&out).trim()).expect("JSON error");
    let msg = e["error"]["message"].as_str().unwrap_or("");
    assert!(
        msg.contains("crash did not start") && !msg.contains("slow"),
        "{msg}"
    );
}

#[test]
fn stop_says_when_it_had_to_use_sigkill() {
    let mut sb = Sandbox::new();
    // TERM ignored, across the exec: only SIGKILL ends it.
    let stubborn = sb.script("stubborn", "trap '' TERM\nexec sleep 3600");
    sb.config(&format!(
        "[service.stubborn]\ncommand = [\"{stubborn}\"]\nstop_timeout = \"300ms\"\n\
         [service.polite]\ncommand = [\"/bin/sleep\", \"3600\"]\n"
    ));
    sb.start();
    sb.wait_state("stubborn", "running");
    sb.wait_state("polite", "running");
    let out = sb.supctl(&["stop", "stubborn", "polite"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains(
            "stubborn: stopped with SIGKILL: still running 300ms (stop_timeout) after TERM"
        ),
        "{text}"
    );
    assert!(text.contains("polite: stopped\n"), "{text}");
    let out = sb.supctl(&["--json", "stop", "stubborn"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(
        v["killed"],
        Value::Null,
        "already stopped: nothing killed now: {v}"
    );
}

/// Services a, b after a, c after b, each writing "start X" before it is ready and
/// "stop X" when told to stop, to `order.log`.
fn chain(sb: &Sandbox) -> std::path::PathBuf {
    let log = sb.path("order.log");
    let mut cfg = String::new();
    for (n, after) in [("a", ""), ("b", "a"), ("c", "b")] {
        let svc = sb.script(
            n,
            &format!(
                "echo start {n} >> {log}\ntrap 'echo stop {n} >> {log}; exit 0' TERM\necho >&3\nsleep 3600 &\nwait",
                log = log.display()
            ),
        );
        let after = if after.is_empty() {
            String::new()
        } else {
            format!("after = [\"{after}\"]\n")
        };
        cfg.push_str(&format!(
            "[service.{n}]\ncommand = [\"{svc}\"]\nready = \"fd:3\"\n{after}"
        ));
    }
    sb.config(&cfg);
    log
}

fn log_lines(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn several_services_stop_dependents_first_and_start_dependencies_first() {
    let mut sb = Sandbox::new();
    let log = chain(&sb);
    sb.start();
    for n in ["a", "b", "c"] {
        sb.wait_state(n, "running");
    }
    assert_eq!(log_lines(&log), ["start a", "start b", "start c"]);
    std::fs::write(&log, "").expect("truncate");
    // Named in the wrong order: supd stops c, then b, then a.
    let out = sb.supctl(&["stop", "a", "b", "c"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    assert_eq!(log_lines(&log), ["stop c", "stop b", "stop a"]);
    let out = sb.supctl(&["start", "c", "b", "a"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    for n in ["a", "b", "c"] {
        assert_eq!(state(&sb, n), "running", "{n}: started before the answer");
    }
    assert_eq!(
        log_lines(&log),
        ["stop c", "stop b", "stop a", "start a", "start b", "start c"]
    );
    std::fs::write(&log, "").expect("truncate");
    // A restart of all: every dependent is down before its dependency stops, and up
    // only after it is up again.
    let out = sb.supctl(&["restart", "all"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    assert_eq!(
        log_lines(&log),
        ["stop c", "stop b", "stop a", "start a", "start b", "start c"]
    );
    // `after` orders, it links nothing: a alone stops alone.
    let out = sb.supctl(&["stop", "a"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    assert_eq!(
        (state(&sb, "a"), state(&sb, "b"), state(&sb, "c")),
        ("stopped".into(), "running".into(), "running".into())
    );
}

#[test]
fn reload_starts_a_fixed_service_at_once_from_cooldown_or_backoff() {
    let mut sb = Sandbox::new();
    let cfg = |cmd: &str| {
        format!(
            "[service.loop]\ncommand = {cmd}\nrestart_delay = \"10ms\"\ncrash_loop = {{ restarts = 2, window = \"1m\" }}\ncooldown = \"1h\"\n\
             [service.slow]\ncommand = {cmd}\nrestart_delay = \"1h\"\nrestart_delay_max = \"1h\"\n"
        )
    };
    sb.config(&cfg(r#"["/bin/sh", "-c", "exit 2"]"#));
    sb.start();
    sb.wait_state("loop", "cooldown");
    sb.wait_state("slow", "backoff");
    sb.config(&cfg(r#"["/bin/sleep", "3600"]"#));
    let out = sb.supctl(&["reload"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    // The cooldown is an hour, the backoff too: only the reload can start them now.
    sb.wait_state("loop", "running");
    sb.wait_state("slow", "running");
}

#[test]
fn force_to_the_current_version_clears_its_bad_mark() {
    let mut sb = Sandbox::new();
    sb.config(
        "[service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\nrestart_delay = \"10ms\"\n\
         crash_loop = { restarts = 2, window = \"1m\" }\ncooldown = \"1h\"\nprobation = \"1s\"\n",
    );
    sb.start();
    // The first version crash-loops in its probation: nothing to go back to, it stays,
    // marked bad.
    sb.install_version("1.0.0", "exit 3");
    sb.upgrade_wait("1.0.0", false);
    let out = sb.supctl(&["versions", "agent"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("current, bad"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = sb.supctl(&["upgrade", "agent", "1.0.0"]);
    assert_eq!(code(&out), Some(1));
    assert!(
        stderr(&out).contains("marked bad") && stderr(&out).contains("--force clears the mark"),
        "{}",
        stderr(&out)
    );
    let out = sb.supctl(&["upgrade", "agent", "1.0.0", "--force"]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "agent: 1.0.0 is no longer marked bad\n"
    );
    let v = sb.ok(serde_json::json!({"cmd": "versions", "tool": "agent"}));
    let one = v["versions"]
        .as_array()
        .and_then(|l| l.iter().find(|x| x["version"] == "1.0.0"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (one["bad"].clone(), one["current"].clone()),
        (false.into(), true.into()),
        "{v}"
    );
    let out = sb.supctl(&["versions", "agent"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("1.0.0"))
        .unwrap_or_default();
    assert!(line.contains("current") && !line.contains("bad"), "{text}");
}

/// What the bash completion offers for a command line (the last word is the cursor's).
fn complete(sb: &Sandbox, words: &[&str]) -> Vec<String> {
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/common/supctl.bash-completion"
    );
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let script = format!(
        "source '{file}'\nCOMP_WORDS=('{SUPCTL}' -s '{sock}' {words})\nCOMP_CWORD={cword}\n_supctl\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        sock = sb.socket.display(),
        words = quoted.join(" "),
        cword = words.len() + 2,
    );
    let out = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &script])
        .output()
        .expect("run bash");
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    let mut got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    got.sort();
    got
}

#[test]
fn bash_completion_offers_commands_services_tools_and_versions() {
    let mut sb = Sandbox::new();
    sb.config(
        "[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\n\
         [service.worker]\ncommand = [\"/bin/sleep\", \"3600\"]\ninstances = 2\n\
         [service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\nprobation = \"100ms\"\n",
    );
    sb.start();
    sb.install_version("1.0.0", "exec sleep 3600");
    sb.install_version("1.1.0", "exec sleep 3600");
    assert_eq!(complete(&sb, &["st"]), ["start", "status", "stop"]);
    // A table with instances: each instance, and the table.
    assert_eq!(
        complete(&sb, &["stop", "w"]),
        ["web", "worker", "worker@0", "worker@1"]
    );
    assert_eq!(
        complete(&sb, &["restart", "web", ""]),
        ["agent", "all", "web", "worker", "worker@0", "worker@1"]
    );
    assert_eq!(complete(&sb, &["signal", "web", "HU"]), ["HUP"]);
    assert_eq!(complete(&sb, &["sh"]), ["show", "shutdown"]);
    assert_eq!(complete(&sb, &["me"]), ["metrics"]);
    assert_eq!(complete(&sb, &["show", "we"]), ["web"]);
    assert_eq!(complete(&sb, &["upgrade", ""]), ["agent"]);
    assert_eq!(
        complete(&sb, &["upgrade", "agent", "--force", "1"]),
        ["1.0.0", "1.1.0"]
    );
    assert_eq!(complete(&sb, &["upgrade", "agent", "--w"]), ["--wait"]);
    assert_eq!(complete(&sb, &["versions", "a"]), ["agent"]);
}
