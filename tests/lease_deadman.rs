//! The dead-man switch of leader-only services, and the bound on `lease-release`
//! (issue 11, items 4 and 6). A leader-only service must not outlive its grant even
//! when supd and sup-lease are dead; a `reexec` neither fires nor disarms the switch;
//! a process that cannot die does not hold a release, and so the lease, forever.

mod common;
use common::*;
use nix::sys::signal::Signal;
use serde_json::json;
use std::time::{Duration, Instant};

/// A leader-only engine that starts a child of its own (its pid in `child`), says it is
/// ready, and waits; `stop_timeout` as given.
fn config(sb: &Sandbox, stop_timeout: &str) {
    let child = sb.path("child");
    let engine = sb.script(
        "engine.sh",
        &format!(
            "sleep 3600 &\necho $! > {c}.tmp; mv {c}.tmp {c}\necho >&3\nexec sleep 3600",
            c = child.display()
        ),
    );
    sb.config(&format!(
        "[lease.engine]\n\n[service.engine]\ncommand = [\"{engine}\"]\nready = \"fd:3\"\n\
         leader_only = \"engine\"\nstop_timeout = \"{stop_timeout}\"\n"
    ));
}

fn pid_of(status: &serde_json::Value) -> i32 {
    status["pid"].as_i64().expect("pid") as i32
}

fn child_pid(sb: &Sandbox) -> i32 {
    std::fs::read_to_string(sb.path("child"))
        .expect("the engine wrote its child's pid")
        .trim()
        .parse()
        .expect("a pid")
}

/// Waits until `pid` has exited, at `end` at the latest.
fn gone_by(pid: i32, end: Instant) -> bool {
    wait_exit(pid, end.saturating_duration_since(Instant::now())).is_some()
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

/// supd's forked guards: processes with supd's command line, other than supd.
fn guards(sb: &Sandbox) -> Vec<i32> {
    let config = sb.path("sup.toml");
    let argv = [SUPD, "-c", config.to_str().expect("utf-8 path")];
    let supd = sb.supd_pid();
    processes_with_cmdline(&argv)
        .into_iter()
        .filter(|p| *p != supd)
        .collect()
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
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first[0]), Signal::SIGKILL)
        .expect("kill the guard");
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
    // SIGKILL after stop_timeout (300ms), then one second of grace, then the answer.
    assert!(
        took < Duration::from_secs(5),
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

/// SIGSTOPs supd, and SIGCONTs it when dropped (a failed assertion included).
struct Frozen(i32);

impl Frozen {
    fn new(pid: i32) -> Frozen {
        signal(pid, Signal::SIGSTOP);
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, Signal::SIGCONT);
    }
}

fn signal(pid: i32, sig: Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).expect("signal supd");
}

/// A grant that ends at `valid_for` from now, with its kill grace, as sup-lease sends it
/// (`until_boot_ms`, on CLOCK_BOOTTIME).
fn grant(term: u64, valid_for: Duration, grace: Duration) -> serde_json::Value {
    let until = sup::time::Boot::now().plus(valid_for);
    json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": term,
           "valid_for": format!("{}ms", valid_for.as_millis()),
           "until_boot_ms": until.as_ms(),
           "kill_grace": format!("{}ms", grace.as_millis())})
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
    sb.ok(grant(1, valid_for, grace));
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let child = child_pid(&sb);
    let frozen = Frozen::new(sb.supd_pid());
    let end = granted + valid_for + grace;
    assert!(
        !gone_by(engine, end - Duration::from_millis(300)),
        "the engine was killed before its grant's end and kill grace"
    );
    let late = end + Duration::from_millis(700);
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
    let (valid_for, grace) = (Duration::from_millis(1500), Duration::from_millis(300));
    sb.ok(grant(1, valid_for, grace));
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let child = child_pid(&sb);
    let first_end = Instant::now() + valid_for + grace;
    let mut renewed = Instant::now();
    let mut reexecs = 0;
    while Instant::now() < first_end + Duration::from_secs(2) {
        if reexecs == 0 && Instant::now() > first_end - Duration::from_millis(900) {
            let out = sb.supctl(&["reexec"]);
            assert!(
                out.status.success(),
                "reexec: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            reexecs += 1;
        }
        renewed = Instant::now();
        sb.ok(grant(1, valid_for, grace));
        // The next renewal is due in a third of the validity, as sup-lease renews.
        assert!(
            !gone_by(engine, renewed + valid_for / 3),
            "the engine was killed though its grant was renewed\n{}",
            sb.supd_log()
        );
    }
    assert!(alive(child), "the engine's child was killed though renewed");
    let _frozen = Frozen::new(sb.supd_pid());
    let late = renewed + valid_for + grace + Duration::from_millis(700);
    assert!(
        gone_by(engine, late),
        "the engine outlived its last renewal while supd was frozen"
    );
    assert!(gone_by(child, late), "the engine's child outlived it");
}

/// A `lease-grant` with `stopping`, as a holder that stepped down sends at each renewal.
fn stopping(term: u64, valid_for: Duration, grace: Duration) -> serde_json::Value {
    let mut g = grant(term, valid_for, grace);
    g["stopping"] = json!(true);
    g
}

/// A holder stepping down keeps its key and store lease renewed while its services
/// stop; its renewals (stopping grants) move the guards' end, so a slow stop is not cut
/// at the last grant's end; once they stop (supd frozen, sup-lease gone), the last one
/// bounds the run. A stopping grant while the lease is held is refused.
#[test]
fn stopping_grants_let_a_slow_stop_finish_and_still_bound_it() {
    let mut sb = Sandbox::new();
    let engine = sb.script(
        "engine.sh",
        "trap '' TERM\necho >&3\nwhile :; do sleep 1; done",
    );
    sb.config(&format!(
        "[lease.engine]\n\n[service.engine]\ncommand = [\"{engine}\"]\nready = \"fd:3\"\n\
         leader_only = \"engine\"\nstop_timeout = \"1h\"\n"
    ));
    sb.start();
    let (valid_for, grace) = (Duration::from_millis(1500), Duration::from_millis(300));
    sb.ok(grant(4, valid_for, grace));
    let pid = pid_of(&sb.wait_state("engine", "running"));
    let refused = sb.request(stopping(4, valid_for, grace));
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
        sb.ok(stopping(4, valid_for, grace));
        assert!(
            !gone_by(pid, renewed + valid_for / 3),
            "the stopping engine was killed though its holder renewed\n{}",
            sb.supd_log()
        );
    }
    let _frozen = Frozen::new(sb.supd_pid());
    let late = renewed + valid_for + grace + Duration::from_millis(700);
    assert!(
        gone_by(pid, late),
        "the stopping engine outlived its last renewal while supd was frozen"
    );
}
