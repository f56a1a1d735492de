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
