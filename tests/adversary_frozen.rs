//! Issue 23, as an adversary: processes that cannot die (held by the cgroup v1 freezer,
//! which keeps a SIGKILLed process alive until it is thawed) where they meet a run's
//! other processes, upgrades and stops of several services; the state lock where its
//! file is taken away under a running supd. Each test shows a defect found on the
//! landed code, or a promise that held.

mod common;
use common::agent::*;
use common::freezer::{pid_of, status_within, Frozen, KILL_BOUND, SLACK};
use common::locking::{assert_no_dups, lines, locking_service, wait_pid_file};
use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use std::fs;
use std::time::{Duration, Instant};

/// Whether any event matching `pred` comes within `within`.
fn seen_within(w: &mut Watch, within: Duration, pred: impl Fn(&Value) -> bool) -> Option<Value> {
    let end = Instant::now() + within;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match w.next_within(left) {
            Some(e) if pred(&e) => return Some(e),
            Some(_) => {}
            None => return None,
        }
    }
    None
}

/// A locking service whose leader forks a child (holding the lock too, by its fd) and
/// notes its pid in `child`, then waits: the child is frozen and the leader killed, so
/// the run's leader is gone and its group is not.
fn child_config(sb: &Sandbox, extra: &str) {
    let d = sb.dir.display();
    let one = locking_service(
        sb,
        "",
        &format!(
            "sleep 3600 &\necho $! > {d}/child.tmp\nmv {d}/child.tmp {d}/child\necho >&3\nwait"
        ),
    );
    sb.config(&format!(
        "[service.one]\ncommand = [\"{one}\"]\nready = \"fd:3\"\nrestart_delay = \"10ms\"\nstop_timeout = \"1s\"\n{extra}\n"
    ));
}

/// A run whose leader died while a child of it cannot die: no second run starts beside
/// the child (it holds the run's lock), and `status` names the child that holds the
/// service back, as it does for a stopped run that outlived SIGKILL ("which pid, in
/// which state"). On the landed code the service stays "running" (the leader's exit is
/// applied only when the whole run is gone) and nothing names the frozen pid.
#[test]
fn a_frozen_child_of_a_dead_leader_is_named_and_never_run_beside() {
    let mut sb = Sandbox::new();
    let Some(mut frozen) = Frozen::new(&sb) else {
        eprintln!("skipped: needs root and a cgroup v1 freezer");
        return;
    };
    child_config(&sb, "");
    sb.start();
    let leader = pid_of(&sb.wait_state("one", "running"));
    let child = wait_pid_file(&sb.path("child"));
    frozen.freeze(child);
    let mut w = sb.watch();
    kill(Pid::from_raw(leader), Signal::SIGKILL).expect("kill the leader");
    // Nothing of `one` starts beside the frozen child: watched for 8 s.
    let beside = seen_within(&mut w, Duration::from_secs(8), |e| {
        e["event"] == "state" && e["service"] == "one" && e["to"] == "running"
    });
    assert!(
        beside.is_none(),
        "one started beside its frozen child: {beside:?}"
    );
    assert_eq!(lines(&sb, "starts").len(), 1, "a second run started");
    let s = status_within(&sb, "one", KILL_BOUND + SLACK, |s| {
        s["held_by"]["pid"] == child
    });
    let s = s.unwrap_or_else(|s| {
        panic!(
            "status does not name the frozen child {child} of the dead leader {leader}: {s}\n{}",
            sb.supd_log()
        )
    });
    let reason = s["reason"].as_str().unwrap_or_default();
    assert!(reason.contains(&format!("pid {child}")), "reason: {reason}");
    frozen.thaw();
    let s = w.state(&sb, "one", "running");
    assert_ne!(pid_of(&s), leader);
    assert!(!alive(child));
    assert_no_dups(&sb);
}

/// `stop` of a run whose leader died and whose child cannot die answers within
/// stop_timeout plus the KILL's bound, naming the child; nothing starts beside it.
#[test]
fn stop_of_a_dead_leaders_frozen_run_answers_within_its_bound() {
    let mut sb = Sandbox::new();
    let Some(mut frozen) = Frozen::new(&sb) else {
        eprintln!("skipped: needs root and a cgroup v1 freezer");
        return;
    };
    child_config(&sb, "");
    sb.start();
    let leader = pid_of(&sb.wait_state("one", "running"));
    let child = wait_pid_file(&sb.path("child"));
    frozen.freeze(child);
    kill(Pid::from_raw(leader), Signal::SIGKILL).expect("kill the leader");
    assert!(wait_exit(leader, DEADLINE).is_some());
    let asked = Instant::now();
    let out = sb.supctl(&["stop", "one"]);
    let took = asked.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        took < Duration::from_secs(1) + KILL_BOUND + SLACK,
        "stop answered after {took:?}: {err}"
    );
    assert_ne!(out.status.code(), Some(0), "stop of a run not over: {err}");
    assert!(err.contains(&format!("pid {child}")), "stop said: {err}");
    frozen.thaw();
    assert_eq!(lines(&sb, "starts").len(), 1);
    assert_no_dups(&sb);
}

/// `stop` of several services, one of whose runs cannot die: the others stop, and the
/// answer comes within stop_timeout plus the KILL's bound, naming only the frozen one.
#[test]
fn stop_of_several_with_one_frozen_stops_the_others_and_answers() {
    let mut sb = Sandbox::new();
    let Some(mut frozen) = Frozen::new(&sb) else {
        eprintln!("skipped: needs root and a cgroup v1 freezer");
        return;
    };
    let one = locking_service(&sb, "", "echo >&3\nexec sleep 3600");
    let plain = sb.script("plain", "exec sleep 3600");
    let mut text =
        format!("[service.one]\ncommand = [\"{one}\"]\nready = \"fd:3\"\nstop_timeout = \"1s\"\n");
    for n in ["a", "b", "c"] {
        text += &format!("[service.{n}]\ncommand = [\"{plain}\"]\nstop_timeout = \"1s\"\n");
    }
    sb.config(&text);
    sb.start();
    let first = pid_of(&sb.wait_state("one", "running"));
    for n in ["a", "b", "c"] {
        sb.wait_state(n, "running");
    }
    frozen.freeze(first);
    let asked = Instant::now();
    let out = sb.supctl(&["stop", "a", "one", "b", "c"]);
    let took = asked.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        took < Duration::from_secs(1) + KILL_BOUND + SLACK,
        "stop answered after {took:?}: {err}"
    );
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains(&format!("pid {first}")), "{err}");
    for n in ["a", "b", "c"] {
        assert_eq!(sb.status(n)["state"], "stopped", "{n}");
        assert!(!err.contains(&format!("{n}:")), "{n} named: {err}");
    }
    frozen.thaw();
}

/// An upgrade whose new version's leader dies in its probation while a child of it
/// cannot die: the version did not run through its probation and must not be
/// committed. On the landed code the service stays "running" (its leader's exit waits
/// for the whole run to go), so the probation counts on and commits it.
#[test]
fn a_probation_does_not_count_a_dead_leader_whose_child_is_frozen() {
    let mut sb = Sandbox::new();
    let Some(mut frozen) = Frozen::new(&sb) else {
        eprintln!("skipped: needs root and a cgroup v1 freezer");
        return;
    };
    // Room for the kill below on a loaded machine; the watch after it outlasts it.
    agent_config(&sb, "probation = \"6s\"\n");
    place(&sb, "1.0.0", GOOD);
    let child = sb.path("child");
    place(
        &sb,
        "2.0.0",
        &format!(
            "/bin/sleep 3600 &\necho $! > {c}.tmp\nmv {c}.tmp {c}\nwait",
            c = child.display()
        ),
    );
    place_current(&sb, "1.0.0");
    sb.start();
    sb.wait_state("agent", "running");
    let mut w = sb.watch();
    let out = sb.supctl(&["upgrade", "agent", "2.0.0"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let e = w.until(&sb, |e| {
        e["event"] == "state" && e["to"] == "running" && e["version"] == "2.0.0"
    });
    let leader = pid_of(&e);
    let c = wait_pid_file(&child);
    frozen.freeze(c);
    kill(Pid::from_raw(leader), Signal::SIGKILL).expect("kill the leader");
    let committed = seen_within(&mut w, Duration::from_secs(9), |e| {
        e["event"] == "upgrade" && e["phase"] == "committed"
    });
    assert!(
        committed.is_none(),
        "2.0.0 was committed though its leader died early in its 6 s probation: {committed:?}\n{}\n{}",
        versions(&sb),
        sb.supd_log()
    );
    frozen.thaw();
}

/// With the first supd stopped (it would otherwise take a new lock file first: it
/// watches state_dir), its lock file removed, a second supd on the same state_dir and its
/// own socket: whether it ended (within DEADLINE) and failed, and what it said.
fn second_supd_after_the_lock_file_went(sb: &Sandbox) -> (bool, String) {
    let supd = sb.supd_pid();
    kill(Pid::from_raw(supd), Signal::SIGSTOP).expect("SIGSTOP supd");
    fs::remove_file(sb.path("state/supd.lock")).expect("rm supd.lock");
    let t = fs::read_to_string(sb.path("sup.toml")).expect("config");
    fs::write(
        sb.path("sup2.toml"),
        t.replace("socket = \"sup.sock\"", "socket = \"sup2.sock\""),
    )
    .expect("config");
    let mut second = std::process::Command::new(SUPD)
        .args(["-c", &sb.path("sup2.toml").to_string_lossy()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("second supd");
    // A second supd that runs never exits; one that refuses exits once its debug image
    // started and found the lock, which a loaded machine may make slow.
    let gone = wait_exit(second.id() as i32, DEADLINE);
    kill(Pid::from_raw(supd), Signal::SIGCONT).expect("SIGCONT supd");
    if gone.is_none() {
        let _ = second.kill();
    }
    let out = second.wait_with_output().expect("second supd");
    let _ = fs::remove_file(sb.path("sup2.sock"));
    (
        gone.is_some() && !out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The state lock's file removed while supd cannot answer at once (stopped a moment: a
/// loaded machine, a debugger), and a second supd on the same state_dir (its own socket)
/// started meanwhile: the second must refuse, as it does while the first holds the lock.
/// Before the directory's own lock, the second took the new file's lock and ran the
/// service too: two instances.
#[test]
fn a_removed_lock_file_does_not_let_a_second_supd_in() {
    let mut sb = Sandbox::new();
    let one = locking_service(&sb, "", "exec sleep 3600");
    sb.config(&format!("[service.one]\ncommand = [\"{one}\"]\n"));
    sb.start();
    let first = pid_of(&sb.wait_state("one", "running"));
    let (refused, err) = second_supd_after_the_lock_file_went(&sb);
    assert!(
        refused,
        "a second supd ran on the state_dir of a live one: {err}\n{}",
        sb.supd_log()
    );
    assert_eq!(pid_of(&sb.status("one")), first);
    assert_no_dups(&sb);
}

/// `restart` of a run that cannot die: the answer comes within stop_timeout plus the
/// KILL's bound (and the service's ready_timeout), saying what is left, and no second
/// run starts beside the frozen one.
#[test]
fn restart_of_a_frozen_run_answers_and_starts_nothing_beside_it() {
    let mut sb = Sandbox::new();
    let Some(mut frozen) = Frozen::new(&sb) else {
        eprintln!("skipped: needs root and a cgroup v1 freezer");
        return;
    };
    let one = locking_service(&sb, "", "echo >&3\nexec sleep 3600");
    sb.config(&format!(
        "[service.one]\ncommand = [\"{one}\"]\nready = \"fd:3\"\nstop_timeout = \"1s\"\nready_timeout = \"2s\"\n"
    ));
    sb.start();
    let first = pid_of(&sb.wait_state("one", "running"));
    frozen.freeze(first);
    let asked = Instant::now();
    let out = sb.supctl(&["restart", "one"]);
    let took = asked.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        took < Duration::from_secs(3) + KILL_BOUND + SLACK,
        "restart answered after {took:?}: {err}\n{}",
        sb.supd_log()
    );
    assert_ne!(
        out.status.code(),
        Some(0),
        "restart of a run not over: {err}"
    );
    assert_eq!(lines(&sb, "starts").len(), 1);
    let mut w = sb.watch();
    frozen.thaw();
    let s = w.state(&sb, "one", "running");
    assert_ne!(pid_of(&s), first);
    assert_no_dups(&sb);
}

/// SIGTERM while a run whose leader died drains behind a frozen child: supd exits at
/// shutdown_timeout plus the KILL's bound, naming the child, and leaves its record.
#[test]
fn a_shutdown_with_a_dead_leaders_frozen_child_ends_at_its_timeout() {
    let mut sb = Sandbox::new();
    let Some(mut frozen) = Frozen::new(&sb) else {
        eprintln!("skipped: needs root and a cgroup v1 freezer");
        return;
    };
    child_config(&sb, "");
    let path = sb.path("sup.toml");
    let t = fs::read_to_string(&path).expect("config");
    fs::write(
        &path,
        t.replace("shutdown_timeout = \"5s\"", "shutdown_timeout = \"2s\""),
    )
    .expect("config");
    sb.start();
    let leader = pid_of(&sb.wait_state("one", "running"));
    let child = wait_pid_file(&sb.path("child"));
    frozen.freeze(child);
    kill(Pid::from_raw(leader), Signal::SIGKILL).expect("kill the leader");
    assert!(wait_exit(leader, DEADLINE).is_some());
    let mut supd = sb.supd.take().expect("supd");
    kill(Pid::from_raw(supd.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    let bound = Duration::from_secs(2) + KILL_BOUND + SLACK;
    let exited = wait_exit(supd.id() as i32, bound);
    if exited.is_none() {
        let _ = supd.kill();
    }
    let status = supd.wait().expect("supd");
    assert!(
        exited.is_some(),
        "supd did not exit within {bound:?}\n{}",
        sb.supd_log()
    );
    assert_eq!(status.code(), Some(1), "{}", sb.supd_log());
    assert!(
        sb.supd_log().contains(&format!("pid {child}")),
        "supd did not name what it left:\n{}",
        sb.supd_log()
    );
    frozen.thaw();
}

/// The directory's own lock goes with the old image at a `reexec` (close-on-exec) and is
/// taken again by the new one: after it, a removed lock file still lets no second supd in.
#[test]
fn after_a_reexec_a_removed_lock_file_still_lets_no_second_supd_in() {
    let mut sb = Sandbox::new();
    let one = locking_service(&sb, "", "exec sleep 3600");
    sb.config(&format!("[service.one]\ncommand = [\"{one}\"]\n"));
    sb.start();
    let first = pid_of(&sb.wait_state("one", "running"));
    sb.reexec();
    let (refused, err) = second_supd_after_the_lock_file_went(&sb);
    assert!(
        refused && err.contains("another supd holds"),
        "a second supd ran beside a re-executed one: {err}"
    );
    assert_eq!(pid_of(&sb.status("one")), first);
    assert_no_dups(&sb);
}
