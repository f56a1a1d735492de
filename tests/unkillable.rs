//! A process that cannot die (in uninterruptible sleep on a hung file system; here, held
//! by the cgroup v1 freezer, which keeps a SIGKILLed process alive until it is thawed:
//! a cgroup2 `cgroup.freeze` does not, SIGKILL ends a process frozen so) never makes two
//! instances of its service, and never makes supd hang an answer: a leftover of a killed
//! supd holds its service back for as long as it lives, and `status` says which pid, in
//! which state; `stop` answers within its bound, saying what is left; a shutdown ends at
//! `shutdown_timeout`, leaving the record for the next supd.

mod common;
use common::freezer::{pid_of, status_within, Frozen, KILL_BOUND, SLACK};
use common::locking::{assert_no_dups, lines, locking_service};
use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use std::fs;
use std::time::{Duration, Instant};

/// Asks `status` until `pred` holds, within `within`.
fn status_until(
    sb: &Sandbox,
    service: &str,
    within: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    status_within(sb, service, within, pred).unwrap_or_else(|s| {
        panic!(
            "{service}: status never matched within {within:?}: {s}\n{}",
            sb.supd_log()
        )
    })
}

/// `one`: a locking service (a second instance beside the first writes to `dups`), ready
/// on fd 3, whose whole run is its leader; `two`, when asked, a plain one.
fn config(sb: &Sandbox, supd_extra: &str, one_keys: &str, two: bool) {
    let one = locking_service(sb, "", "echo >&3\nexec sleep 3600");
    let mut text = format!("[service.one]\ncommand = [\"{one}\"]\nready = \"fd:3\"\n{one_keys}\n");
    if two {
        let plain = sb.script("plain", "exec sleep 3600");
        text += &format!("[service.two]\ncommand = [\"{plain}\"]\nstop_timeout = \"1s\"\n");
    }
    sb.config(&text);
    if !supd_extra.is_empty() {
        // In place of the sandbox's own `shutdown_timeout` (a key is given once).
        let path = sb.path("sup.toml");
        let t = fs::read_to_string(&path).expect("config");
        fs::write(&path, t.replace("shutdown_timeout = \"5s\"\n", supd_extra)).expect("config");
    }
}

/// The old supd's frozen leftover holds `one` back for as long as it lives (well past the
/// 16 s after which supd used to start it beside it), `two`, whose leftover ended,
/// starts meanwhile, and `status` says why `one` waits; thawed, it dies and `one` starts
/// at once.
#[test]
fn a_leftover_that_cannot_die_holds_its_service_back_for_as_long_as_it_lives() {
    let mut sb = Sandbox::new();
    let Some(mut frozen) = Frozen::new(&sb) else {
        eprintln!("skipped: needs root and a cgroup v1 freezer");
        return;
    };
    config(&sb, "", "stop_timeout = \"1s\"", true);
    sb.start();
    let first = pid_of(&sb.wait_state("one", "running"));
    let two = pid_of(&sb.wait_state("two", "running"));
    frozen.freeze(first);
    let old = sb.supd.take().expect("supd");
    kill(Pid::from_raw(old.id() as i32), Signal::SIGKILL).expect("kill -9 supd");
    let _ = { old }.wait();
    sb.start();
    let began = Instant::now();
    let mut w = sb.watch();
    // Nothing of `one` starts while its frozen leftover lives: watched for 25 s. `two`,
    // whose leftover ends on TERM, starts meanwhile, once the KILL rounds are over
    // (1 s of TERM grace, three rounds 5 s apart: every service is held while they
    // last, so that a child of the killed supd caught mid-start is found by their looks).
    let mut two_up = (sb.status("two")["state"] == "running").then(|| began.elapsed());
    // (About 16 s of KILL rounds, and room for a start on a loaded machine.)
    let until = began + Duration::from_secs(25);
    while let Some(e) = w.next_within(until.saturating_duration_since(Instant::now())) {
        assert!(
            !(e["event"] == "state" && e["service"] == "one"),
            "one changed state beside its frozen leftover {:?} after the new supd started: {e}\n{}",
            began.elapsed(),
            sb.supd_log()
        );
        if e["event"] == "state" && e["service"] == "two" && e["to"] == "running" {
            two_up.get_or_insert(began.elapsed());
        }
    }
    let two_up = two_up.expect("two was started");
    assert!(
        two_up < Duration::from_secs(24),
        "two waited {two_up:?} for one's leftover"
    );
    assert_ne!(pid_of(&sb.status("two")), two);
    let s = sb.status("one");
    assert_eq!(s["state"], "stopped", "{s}");
    let reason = s["reason"].as_str().unwrap_or_default();
    let want = format!("waiting for pid {first} of the previous run: uninterruptible (D)");
    assert!(reason.contains(&want), "reason: {reason}");
    assert!(reason.contains("frozen"), "reason: {reason}");
    assert_eq!(s["held_by"]["pid"], first, "{s}");
    assert_eq!(s["held_by"]["state"], "D", "{s}");
    assert_eq!(s["held_by"]["run"], "previous", "{s}");
    assert!(
        s["held_by"]["for_ms"].as_u64().unwrap_or(0) >= 15_000,
        "{s}"
    );
    let out = sb.supctl(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&want), "{text}");
    assert_eq!(
        lines(&sb, "starts").len(),
        1,
        "one started beside its leftover"
    );
    let thawed = Instant::now();
    frozen.thaw();
    let s = w.state(&sb, "one", "running");
    assert!(
        thawed.elapsed() < Duration::from_secs(10),
        "one started {:?} after its leftover could die",
        thawed.elapsed()
    );
    assert_ne!(pid_of(&s), first);
    assert!(!alive(first), "the leftover was gone before the new run");
    assert_no_dups(&sb);
    assert!(sb.status("one")["held_by"].is_null());
}

/// `stop` of a run that cannot die answers within stop_timeout plus the KILL's bound,
/// with an error naming the pid and its state; the service is not started again while
/// that process lives (a `start` waits for it), and starts once it is gone.
#[test]
fn stop_of_a_run_that_cannot_die_answers_within_its_bound_saying_what_is_left() {
    let mut sb = Sandbox::new();
    let Some(mut frozen) = Frozen::new(&sb) else {
        eprintln!("skipped: needs root and a cgroup v1 freezer");
        return;
    };
    config(&sb, "", "stop_timeout = \"1s\"", false);
    sb.start();
    let first = pid_of(&sb.wait_state("one", "running"));
    frozen.freeze(first);
    let asked = Instant::now();
    let out = sb.supctl(&["stop", "one"]);
    let took = asked.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        took < Duration::from_secs(1) + KILL_BOUND + SLACK,
        "stop answered after {took:?}"
    );
    assert_ne!(
        out.status.code(),
        Some(0),
        "stop of a run that did not end: {err}"
    );
    let want = format!("pid {first} did not end after SIGKILL: uninterruptible (D)");
    assert!(err.contains(&want), "stop said: {err}");
    let s = sb.status("one");
    assert_eq!(s["state"], "stopping", "{s}");
    let reason = s["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!(
            "waiting for pid {first} of its last run: uninterruptible (D)"
        )),
        "reason: {reason}"
    );
    assert_eq!(s["held_by"]["run"], "last", "{s}");
    // A start waits for it: no second instance beside the frozen one.
    let mut w = sb.watch();
    let mut c = sb.client();
    c.send_raw(b"{\"id\": 1, \"cmd\": \"start\", \"service\": \"one\"}\n");
    let quiet = Instant::now() + Duration::from_secs(2);
    while let Some(e) = w.next_within(quiet.saturating_duration_since(Instant::now())) {
        assert!(
            !(e["event"] == "state" && e["service"] == "one"),
            "one changed state beside its frozen run: {e}"
        );
    }
    assert_eq!(lines(&sb, "starts").len(), 1);
    frozen.thaw();
    let s = w.state(&sb, "one", "running");
    assert_ne!(pid_of(&s), first);
    assert!(!alive(first));
    let answer = c.read().expect("start answers");
    assert_eq!(answer["ok"], true, "{answer}");
    assert_no_dups(&sb);
}

/// SIGTERM with a run that cannot die: supd exits at shutdown_timeout plus the KILL's
/// bound, naming what it leaves; the pid record stays, so the next supd waits for it.
#[test]
fn a_shutdown_with_a_run_that_cannot_die_ends_at_its_timeout_naming_it() {
    let mut sb = Sandbox::new();
    let Some(mut frozen) = Frozen::new(&sb) else {
        eprintln!("skipped: needs root and a cgroup v1 freezer");
        return;
    };
    config(
        &sb,
        "shutdown_timeout = \"2s\"\n",
        "stop_timeout = \"1s\"",
        false,
    );
    sb.start();
    let first = pid_of(&sb.wait_state("one", "running"));
    frozen.freeze(first);
    let supd = sb.supd.take().expect("supd");
    let asked = Instant::now();
    kill(Pid::from_raw(supd.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    let bound = Duration::from_secs(2) + KILL_BOUND + SLACK;
    let exited = wait_exit(supd.id() as i32, bound);
    let mut supd = supd;
    if exited.is_none() {
        let _ = supd.kill();
    }
    let _ = supd.wait();
    assert!(
        exited.is_some(),
        "supd did not exit within {bound:?} of SIGTERM\n{}",
        sb.supd_log()
    );
    assert!(asked.elapsed() >= Duration::from_secs(2));
    let log = sb.supd_log();
    assert!(
        log.contains(&format!("pid {first}")) && log.contains("uninterruptible (D)"),
        "supd did not name what it left:\n{log}"
    );
    assert!(
        sb.recorded_groups().contains(&first),
        "the record of what is left is gone"
    );
    // The next supd finds it, and waits for it.
    sb.start();
    let mut w = sb.watch();
    let s = status_until(&sb, "one", DEADLINE, |s| {
        s["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("waiting for pid {first} of the previous run")))
    });
    assert_eq!(s["state"], "stopped", "{s}");
    frozen.thaw();
    let s = w.state(&sb, "one", "running");
    assert_ne!(pid_of(&s), first);
    assert_eq!(lines(&sb, "starts").len(), 2);
    assert_no_dups(&sb);
}

/// A `reexec` while a killed supd's leftover cannot die (the package of a new supd is
/// installed while an NFS mount hangs): it was refused for as long as the leftover
/// lived. Now the new image goes on waiting for it, holding the same service back, and
/// starts it once it is gone.
#[test]
fn a_reexec_carries_the_wait_for_a_leftover_that_cannot_die() {
    let mut sb = Sandbox::new();
    let Some(mut frozen) = Frozen::new(&sb) else {
        eprintln!("skipped: needs root and a cgroup v1 freezer");
        return;
    };
    config(&sb, "", "stop_timeout = \"1s\"", true);
    sb.start();
    let first = pid_of(&sb.wait_state("one", "running"));
    sb.wait_state("two", "running");
    frozen.freeze(first);
    let old = sb.supd.take().expect("supd");
    kill(Pid::from_raw(old.id() as i32), Signal::SIGKILL).expect("kill -9 supd");
    let _ = { old }.wait();
    sb.start();
    let s = status_until(&sb, "one", DEADLINE, |s| !s["held_by"].is_null());
    assert_eq!(s["held_by"]["pid"], first, "{s}");
    let two = pid_of(&sb.wait_state("two", "running"));
    let out = sb.supctl(&["reexec"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "reexec refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The new image answers, still holds `one` back, and kept `two`'s run.
    let s = sb.status("one");
    assert_eq!(s["held_by"]["pid"], first, "after the reexec: {s}");
    assert_eq!(s["state"], "stopped", "{s}");
    assert_eq!(pid_of(&sb.status("two")), two);
    // (A watch stream ends with the image that served it.)
    let mut w = sb.watch();
    let quiet = Instant::now() + Duration::from_secs(2);
    while let Some(e) = w.next_within(quiet.saturating_duration_since(Instant::now())) {
        assert!(
            !(e["event"] == "state" && e["service"] == "one"),
            "one changed state beside its frozen leftover after the reexec: {e}\n{}",
            sb.supd_log()
        );
    }
    assert_eq!(
        lines(&sb, "starts").len(),
        1,
        "one started beside its leftover"
    );
    frozen.thaw();
    let s = w.state(&sb, "one", "running");
    assert_ne!(pid_of(&s), first);
    assert!(!alive(first));
    assert_no_dups(&sb);
}
