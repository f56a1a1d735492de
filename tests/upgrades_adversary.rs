//! Issue 21, as an adversary: the promises of tests/upgrades_meet.rs tried where they
//! meet reloads, restarts of supd, self-switches and operators. Each test shows a
//! defect found on the landed code.

mod common;
use common::agent::*;
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::time::{Duration, Instant};

/// Waits up to `within` for an event; `None` if none matched.
fn within(w: &mut Watch, within: Duration, pred: impl Fn(&Value) -> bool) -> Option<Value> {
    let end = Instant::now() + within;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if let Some(e) = w.next_within(left) {
            if pred(&e) {
                return Some(e);
            }
        }
    }
    None
}

/// A leader-only tool's probation waits (paused) on a node that does not lead. A reload
/// then makes the service an ordinary one (no `leader_only` any more): it runs the new
/// version at once, and its probation must count and commit. On the landed code the
/// probation stays paused for ever (`pause_probations` skips a tool without leader-only
/// services, so nothing unpauses it), even across a restart of supd: `upgrade` is
/// refused as "in probation" for good.
#[test]
fn a_paused_probation_counts_again_when_a_reload_drops_leader_only() {
    let mut sb = Sandbox::new();
    leader_only_config(&sb, "probation = \"500ms\"\n");
    place(&sb, "1.0.0", GOOD);
    place(&sb, "2.0.0", GOOD);
    place_current(&sb, "1.0.0");
    sb.start();
    let out = sb.supctl(&["upgrade", "agent", "2.0.0"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = versions(&sb);
    assert!(v["probation_waits"].is_string(), "it waits: {v}");
    // Not leader-only any more.
    agent_config(&sb, "probation = \"500ms\"\n");
    let mut w = sb.watch();
    sb.ok(json!({"cmd": "reload"}));
    // It was held down as leader-only: started by the operator.
    let out = sb.supctl(&["start", "agent"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    w.until(&sb, |e| {
        e["event"] == "state" && e["to"] == "running" && e["version"] == "2.0.0"
    });
    let committed = within(&mut w, Duration::from_secs(5), |e| {
        e["event"] == "upgrade" && e["phase"] == "committed"
    });
    let v = versions(&sb);
    assert!(
        committed.is_some(),
        "2.0.0 ran 5 s (its probation is 500 ms) and was not committed: {v}\n{}",
        sb.supd_log()
    );
    assert_eq!(v["phase"], "committed", "{v}");
}

/// A self-switch is an upgrade with the operator's rules, and a new version owes
/// nothing to the old one's crashes (`restart_tool` resets every history). But the
/// service whose start finds the switch is left out of that reset (`except`): its old
/// version's restarts count against the new one. Here 1.0.0 crashes twice, then
/// switches `current` to 2.0.0 and exits: three restarts of 1.0.0 in the minute. 2.0.0
/// fails once at its first start (a migration that needs a second go) and then runs:
/// one restart of the three its crash-loop rule allows. On the landed code that one
/// failure is taken for a crash loop: 2.0.0 is rolled back and marked bad. An
/// operator's `upgrade agent 2.0.0` from the same history runs it.
#[test]
fn a_self_switch_does_not_inherit_the_old_version_s_crashes() {
    let mut sb = Sandbox::new();
    agent_config(&sb, "probation = \"1h\"\n");
    let n1 = sb.path("runs-1");
    place(
        &sb,
        "1.0.0",
        &format!(
            "echo x >> {n}; [ $(wc -l < {n}) -le 2 ] && exit 3\n[ $(wc -l < {n}) -eq 3 ] && {{ {sw}; exit 0; }}\n{GOOD}",
            n = n1.display(),
            sw = switch_script(&sb, "2.0.0")
        ),
    );
    let once = sb.path("migrated");
    place(
        &sb,
        "2.0.0",
        &format!(
            "[ -e {o} ] || {{ : > {o}; exit 3; }}\n{GOOD}",
            o = once.display()
        ),
    );
    place_current(&sb, "1.0.0");
    let mut w = {
        sb.start();
        sb.watch()
    };
    let st = w.until(&sb, |e| {
        e["event"] == "state" && e["to"] == "running" && e["version"] == "2.0.0"
    });
    assert_eq!(st["service"], "agent");
    // Its one failure, and then it runs (or it was rolled back).
    let next = w.until(&sb, |e| {
        e["event"] == "rollback"
            || e["event"] == "state" && e["to"] == "running" && e["version"] == "2.0.0"
    });
    let v = versions(&sb);
    assert_eq!(
        next["event"], "state",
        "2.0.0 was rolled back after one failure: {next}\n{v}"
    );
    assert_eq!(mark(&v, "2.0.0", "bad"), false, "{v}");
    assert_eq!(link(&sb), "2.0.0");
    // "running" comes at its exec, before its script notes the run: waited for.
    let ran = sb.path("ran-2.0.0");
    common::files::wait_file(&ran, |_| runs(&sb, "2.0.0") >= 2);
    assert_eq!(runs(&sb, "2.0.0"), 2);
}

/// Issue 21, item 7, with the version rolled back from: an operator rolls 2.0.0 (good,
/// committed, not marked bad) back to 1.0.0, which runs. Later `current` is pointed at
/// 2.0.0 again while supd is down (the tool updating itself, a provisioner). That is a
/// self-switch, an upgrade with probation, as with any third version
/// (`i21_7_current_moved_while_supd_was_down_after_a_rollback_is_kept`). On the landed
/// code `reconcile` takes it for the operator's rollback not carried out (the link
/// names `rolled_back_from`, which the record never forgets) and silently switches it
/// back to 1.0.0: whether a tool's switch stands depends on whether supd was restarted
/// before it noticed.
#[test]
fn a_link_moved_back_to_the_version_rolled_back_from_is_kept() {
    let mut sb = Sandbox::new();
    agent_config(&sb, "probation = \"300ms\"\n");
    place(&sb, "1.0.0", GOOD);
    place(&sb, "2.0.0", GOOD);
    place_current(&sb, "1.0.0");
    sb.start();
    sb.wait_state("agent", "running");
    sb.upgrade_wait("2.0.0", true);
    let out = sb.supctl(&["rollback", "agent"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let st = sb.wait_state("agent", "running");
    assert_eq!(st["version"], "1.0.0");
    assert_eq!(link(&sb), "1.0.0");
    // Long after the rollback was carried out, the link is moved while supd is down.
    sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    fs::remove_file(sb.path("tools/agent/current")).expect("unlink");
    place_current(&sb, "2.0.0");
    sb.start();
    let st = sb.wait_state("agent", "running");
    let v = versions(&sb);
    assert_eq!(st["version"], "2.0.0", "switched back: {st}\n{v}");
    assert_eq!(link(&sb), "2.0.0");
    assert_eq!(
        (v["phase"].clone(), v["proposed"].clone(), v["from"].clone()),
        (json!("probation"), json!("2.0.0"), json!("1.0.0")),
        "{v}"
    );
}

/// Issue 21, item 2, with supd down a while: a version that crashes 0.3 s after each
/// start is in a 3 s probation; undisturbed it reaches its crash loop (the fourth exit,
/// about 1.3 s in) and is rolled back. Here supd is killed after its first crash and
/// started again 3 s later (a slow restart, a package's postinst, an operator). Nothing
/// of 2.0.0 ran meanwhile, yet on the landed code the probation's BOOTTIME deadline
/// went on counting: the new supd finds it past and commits 2.0.0 the moment it runs
/// again, after well under a second of running in all ("a version is never committed
/// without having run for its probation"). It then crash-loops, committed.
#[test]
fn time_supd_was_down_does_not_count_for_a_probation() {
    let mut sb = Sandbox::new();
    agent_config(&sb, "probation = \"3s\"\n");
    place(&sb, "1.0.0", GOOD);
    place(&sb, "2.0.0", "sleep 0.3; exit 3");
    place_current(&sb, "1.0.0");
    sb.start();
    sb.wait_state("agent", "running");
    let mut w = sb.watch();
    let out = sb.supctl(&["upgrade", "agent", "2.0.0"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    w.until(&sb, |e| {
        e["event"] == "state" && e["to"] == "backoff" && e["version"] == "2.0.0"
    });
    sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    std::thread::sleep(Duration::from_millis(3200));
    sb.start();
    let mut w = sb.watch();
    let end = w.until(&sb, |e| {
        e["event"] == "rollback" || e["event"] == "upgrade" && e["phase"] == "committed"
    });
    let v = versions(&sb);
    assert_eq!(
        end["event"],
        "rollback",
        "2.0.0 committed after {} runs: {end}\n{v}",
        runs(&sb, "2.0.0")
    );
    assert_eq!(mark(&v, "2.0.0", "bad"), true, "{v}");
}

/// Garbage in the record's new fields: a regression window recorded as 1 s long whose
/// BOOTTIME end lies years ahead (a corrupt or hand-edited record of this boot). A
/// probation's time left is never taken above its recorded length
/// (`probation_left`); the window's is not (`window_left`): on the landed code this
/// 1 s window never ends, and a crash loop of the committed 2.0.0 a few seconds after
/// supd started rolls it back and marks it bad.
#[test]
fn a_regression_window_never_outlasts_its_recorded_length() {
    let mut sb = Sandbox::new();
    agent_config(&sb, "probation = \"300ms\"\n");
    let fail = sb.path("fail-now");
    place(&sb, "1.0.0", GOOD);
    place(
        &sb,
        "2.0.0",
        &format!("[ -e {f} ] && exit 3\n{GOOD}", f = fail.display()),
    );
    place_current(&sb, "2.0.0");
    let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .expect("boot_id")
        .trim()
        .to_string();
    fs::create_dir_all(sb.path("state/tool-records")).expect("mkdir");
    fs::write(
        sb.path("state/tool-records/agent.json"),
        json!({
            "current": "2.0.0", "previous": "1.0.0", "phase": "committed",
            "proposed": "2.0.0", "boot_id": boot_id,
            "window_ms": 1000, "window_boot_deadline_ms": 1u64 << 50,
        })
        .to_string(),
    )
    .expect("record");
    sb.start();
    sb.wait_state("agent", "running");
    // The window (its length, not the recorded end) comes to its end: supd tells it.
    let mut w = sb.watch();
    if versions(&sb)["window_in_ms"].is_u64() {
        w.until(&sb, |e| {
            e["event"] == "upgrade" && e["phase"] == "committed"
        });
    }
    assert!(versions(&sb)["window_in_ms"].is_null(), "{}", versions(&sb));
    fs::write(&fail, "").expect("fail");
    // A kick: a run just started may see the file and exit by itself first (it counts
    // as running from its exec, before its check); the crash loop comes either way.
    let _ = sb.supctl(&["signal", "agent", "KILL"]);
    // Its crash loop (the rollback, if any, comes in the same turn).
    w.until(&sb, |e| {
        e["event"] == "state" && e["service"] == "agent" && e["to"] == "cooldown"
    });
    let v = versions(&sb);
    assert_eq!(v["phase"], "committed", "rolled back: {v}");
    assert_eq!(mark(&v, "2.0.0", "bad"), false, "{v}");
    assert_eq!(link(&sb), "2.0.0");
}

/// The same ambiguity in probation: `upgrade agent 2.0.0`, and 2.0.0, once it runs,
/// points `current` back at 1.0.0 by itself (a tool's own downgrade). Undisturbed, supd
/// takes that as a self-switch and runs 1.0.0. Killed before it restarts the service,
/// the new supd's `reconcile` takes the link naming `from` for an upgrade whose switch
/// was never made, switches `current` to 2.0.0 again and runs it: the tool's switch is
/// silently undone, and the verdict depends on when supd was killed.
#[test]
fn a_switch_back_to_from_made_by_the_tool_in_probation_is_kept_across_a_kill() {
    let mut sb = Sandbox::new();
    agent_config(&sb, "probation = \"1h\"\n");
    place(&sb, "1.0.0", GOOD);
    let switched = sb.path("switched");
    place(
        &sb,
        "2.0.0",
        &format!(
            "[ -e {s} ] || {{ {sw}; : > {s}; }}\n{GOOD}",
            s = switched.display(),
            sw = switch_script(&sb, "1.0.0")
        ),
    );
    place_current(&sb, "1.0.0");
    sb.start();
    sb.wait_state("agent", "running");
    let out = sb.supctl(&["upgrade", "agent", "2.0.0"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // 2.0.0 ran and switched current back to 1.0.0 (it keeps running until restarted).
    common::files::wait_file(&switched, |_| switched.exists());
    assert_eq!(link(&sb), "1.0.0");
    sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    sb.start();
    let st = sb.wait_state("agent", "running");
    let v = versions(&sb);
    assert_eq!(link(&sb), "1.0.0", "the tool's switch was undone: {v}");
    assert_eq!(st["version"], "1.0.0", "{st}\n{v}");
}
