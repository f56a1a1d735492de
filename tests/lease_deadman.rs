//! The dead-man switch of leader-only services, and the bound on `lease-release`
//! (issue 11, items 4 and 6). A leader-only service must not outlive its grant even
//! when supd and sup-lease are dead; a `reexec` neither fires nor disarms the switch;
//! a process that cannot die does not hold a release, and so the lease, forever.

mod common;
use common::grants::*;
use common::*;
use nix::sys::signal::Signal;
use serde_json::json;
use std::time::{Duration, Instant};

/// A leader-only engine that starts a child of its own (its pid in `child`), says it is
/// ready, and waits; `stop_timeout` as given.
fn config(sb: &Sandbox, stop_timeout: &str) {
    let engine = with_child_script(sb, "engine.sh", &sb.path("child"));
    engine_config(sb, &engine, stop_timeout);
}

fn child_pid(sb: &Sandbox) -> i32 {
    read_pid(sb, "child")
}

#[test]
fn a_killed_supd_does_not_leave_its_engine_running_past_the_grant() {
    let mut sb = Sandbox::new();
    config(&sb, "10s");
    sb.start();
    let valid_for = Duration::from_secs(3);
    let granted = Instant::now();
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 1, "valid_for": "3s"}));
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let child = child_pid(&sb);
    assert!(alive(engine) && alive(child));
    // No sup-lease here; supd is killed: nobody is left to stop the engine.
    sb.stop_supd(Signal::SIGKILL);
    let end = granted + valid_for + Duration::from_millis(500);
    assert!(
        gone_by(engine, end),
        "the engine outlived its grant\n{}",
        sb.supd_log()
    );
    assert!(gone_by(child, end), "the engine's child outlived its grant");
}

#[test]
fn a_reexec_keeps_the_engine_and_the_switch() {
    let mut sb = Sandbox::new();
    config(&sb, "10s");
    sb.start();
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 1, "valid_for": "1h"}));
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let child = child_pid(&sb);
    for i in 0..3 {
        let out = sb.supctl(&["reexec"]);
        assert!(
            out.status.success(),
            "reexec {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let st = sb.status("engine");
        assert_eq!(
            (st["state"].clone(), pid_of(&st)),
            (json!("running"), engine),
            "reexec {i}"
        );
        assert!(alive(engine) && alive(child), "reexec {i} fired the switch");
    }
    // The new image holds the switch: killing it ends the engine.
    sb.stop_supd(Signal::SIGKILL);
    let end = Instant::now() + Duration::from_secs(2);
    assert!(gone_by(engine, end), "the switch was lost across reexec");
    assert!(gone_by(child, end), "the engine's child is left");
}

#[test]
fn a_killed_guard_is_replaced() {
    let mut sb = Sandbox::new();
    config(&sb, "10s");
    sb.start();
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 1, "valid_for": "1h"}));
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let first = guards(&sb);
    assert_eq!(first.len(), 1, "one guard for the one run: {first:?}");
    signal(first[0], Signal::SIGKILL);
    let end = Instant::now() + DEADLINE;
    let second = loop {
        let now = guards(&sb);
        if now.len() == 1 && now != first {
            break now[0];
        }
        assert!(
            Instant::now() < end,
            "no new guard: {now:?}\n{}",
            sb.supd_log()
        );
        sb.status("engine"); // a round trip: supd has had its turn
    };
    assert!(
        alive(second) && alive(engine),
        "the run goes on, guarded again"
    );
    sb.stop_supd(Signal::SIGKILL);
    assert!(
        gone_by(engine, Instant::now() + Duration::from_secs(2)),
        "the new guard did not end the run"
    );
}

/// A cgroup v1 freezer: a SIGKILLed frozen process stays (in D state) until thawed.
struct Freezer(std::path::PathBuf);

impl Freezer {
    fn new(tag: u64) -> Option<Freezer> {
        let dir = std::path::PathBuf::from(format!("/sys/fs/cgroup/freezer/sup-deadman-{tag}"));
        std::fs::create_dir_all(&dir).ok()?;
        Some(Freezer(dir))
    }
    fn freeze(&self, pid: i32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).expect("join freezer");
        std::fs::write(self.0.join("freezer.state"), "FROZEN").expect("freeze");
    }
    fn thaw(&self) {
        std::fs::write(self.0.join("freezer.state"), "THAWED").expect("thaw");
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("freezer.state"), "THAWED");
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_wedged_engine_does_not_hold_the_release_forever() {
    let mut sb = Sandbox::new();
    let Some(freezer) = is_root().then(|| Freezer::new(sb.tag)).flatten() else {
        eprintln!("skipped: needs root and a cgroup v1 freezer");
        return;
    };
    config(&sb, "300ms");
    sb.start();
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 1, "valid_for": "1h"}));
    let engine = pid_of(&sb.wait_state("engine", "running"));
    freezer.freeze(engine);
    let asked = Instant::now();
    let r = sb.ok(json!({"cmd": "lease-release", "lease": "engine"}));
    let took = asked.elapsed();
    // SIGKILL after stop_timeout (300ms), then one second of grace, then the answer
    // (about 1.3 s; a release that waited for the frozen run would never answer).
    assert!(
        took < Duration::from_secs(8),
        "release answered after {took:?}"
    );
    assert_eq!(r["released"], true, "{r}");
    let wedged: Vec<i64> = r["wedged"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p.as_i64()).collect())
        .unwrap_or_default();
    assert!(wedged.contains(&(engine as i64)), "{r}");
    assert!(
        alive(engine),
        "the engine is still there, SIGKILLed in D state"
    );
    // The run is not over: the service does not count as stopped, nor start again.
    assert_eq!(sb.status("engine")["state"], "stopping");
    let mut w = sb.watch();
    freezer.thaw();
    assert!(gone_by(engine, Instant::now() + DEADLINE));
    w.state(&sb, "engine", "stopped");
}

/// Issue 22: supd frozen (SIGSTOP: a hung disk, a paused VM) with nobody renewing: the
/// guard holds the grant's end itself and kills the engine at that end plus the kill
/// grace. Before, the guard fired only when supd died, and the engine ran on for as
/// long as supd was frozen.
#[test]
fn a_frozen_supd_does_not_keep_its_engine_past_the_grant() {
    let mut sb = Sandbox::new();
    config(&sb, "10s");
    sb.start();
    let (valid_for, grace) = (Duration::from_secs(2), Duration::from_millis(500));
    let granted = Instant::now();
    sb.ok(grant("engine", 1, valid_for, grace));
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let child = child_pid(&sb);
    let frozen = Frozen::new(sb.supd_pid());
    let end = granted + valid_for + grace;
    assert!(
        !gone_by(engine, end - Duration::from_millis(300)),
        "the engine was killed before its grant's end and kill grace"
    );
    let late = late(granted, valid_for, grace);
    assert!(
        gone_by(engine, late),
        "the engine outlived its grant while supd was frozen"
    );
    assert!(
        gone_by(child, late),
        "the engine's child outlived its grant"
    );
    drop(frozen);
    // supd, thawed, sees its grant over and the engine gone: it does not start it again.
    sb.wait_state("engine", "stopped");
}

/// Renewals move the guard's end: an engine renewed past its first grant's end runs on,
/// across a `reexec` too (the new image writes where the guards read), and once supd is
/// frozen, the last renewal bounds it.
#[test]
fn renewals_move_the_guards_end_across_a_reexec() {
    let mut sb = Sandbox::new();
    config(&sb, "10s");
    sb.start();
    // A validity that holds a whole reexec of a debug build on a loaded machine.
    let (valid_for, grace) = (Duration::from_secs(4), Duration::from_millis(300));
    sb.ok(grant("engine", 1, valid_for, grace));
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let child = child_pid(&sb);
    let first_end = Instant::now() + valid_for + grace;
    let mut renewed = Instant::now();
    let mut reexecs = 0;
    while Instant::now() < first_end + Duration::from_secs(2) {
        renewed = Instant::now();
        sb.ok(grant("engine", 1, valid_for, grace));
        // Past the first grant's end comes a reexec, just after a renewal.
        if reexecs == 0 && Instant::now() > first_end - Duration::from_secs(2) {
            let out = sb.supctl(&["reexec"]);
            assert!(
                out.status.success(),
                "reexec: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            reexecs += 1;
        }
        // The next renewal is due in a third of the validity, as sup-lease renews.
        assert!(
            !gone_by(engine, renewed + valid_for / 3),
            "the engine was killed though its grant was renewed\n{}",
            sb.supd_log()
        );
    }
    assert!(alive(child), "the engine's child was killed though renewed");
    let _frozen = Frozen::new(sb.supd_pid());
    let late = late(renewed, valid_for, grace);
    assert!(
        gone_by(engine, late),
        "the engine outlived its last renewal while supd was frozen"
    );
    assert!(gone_by(child, late), "the engine's child outlived it");
}

/// A holder stepping down keeps its key and store lease renewed while its services
/// stop; its renewals (stopping grants) move the guards' end, so a slow stop is not cut
/// at the last grant's end; once they stop (supd frozen, sup-lease gone), the last one
/// bounds the run. A stopping grant while the lease is held is refused.
#[test]
fn stopping_grants_let_a_slow_stop_finish_and_still_bound_it() {
    let mut sb = Sandbox::new();
    let engine = stubborn_script(&sb, "engine.sh");
    engine_config(&sb, &engine, "1h");
    sb.start();
    let (valid_for, grace) = (Duration::from_millis(1500), Duration::from_millis(300));
    // Long enough for the start on a loaded machine; the stopping grants bring it in.
    sb.ok(grant("engine", 4, Duration::from_secs(60), grace));
    let pid = pid_of(&sb.wait_state("engine", "running"));
    let refused = sb.request(stopping("engine", 4, valid_for, grace));
    assert_eq!(
        refused["ok"], false,
        "a stopping grant while leading: {refused}"
    );
    // The release answers once the engine exited: sent, its answer not awaited.
    let mut release = sb.client();
    release.send_raw(b"{\"cmd\":\"lease-release\",\"lease\":\"engine\"}\n");
    sb.wait_state("engine", "stopping");
    let first_end = Instant::now() + valid_for + grace;
    let mut renewed = Instant::now();
    while Instant::now() < first_end + Duration::from_secs(2) {
        renewed = Instant::now();
        sb.ok(stopping("engine", 4, valid_for, grace));
        assert!(
            !gone_by(pid, renewed + valid_for / 3),
            "the stopping engine was killed though its holder renewed\n{}",
            sb.supd_log()
        );
    }
    let _frozen = Frozen::new(sb.supd_pid());
    let late = late(renewed, valid_for, grace);
    assert!(
        gone_by(pid, late),
        "the stopping engine outlived its last renewal while supd was frozen"
    );
}
