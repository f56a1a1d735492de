//! Versioned tools against real processes: install, upgrade with probation, automatic
//! rollback of a crash-looping version, bad marks and --force, irreversible versions,
//! a tool that switches its own `current`, prune.

mod common;
use common::*;
use serde_json::{json, Value};
use std::path::PathBuf;

const GOOD: &str = "exec /bin/sleep 3600";
const CRASH: &str = "exit 3";

fn agent_config(sb: &Sandbox) {
    sb.config(
        r#"
[service.agent]
tool = "agent"
command = ["bin/agent"]
restart_delay = "10ms"
crash_loop = { restarts = 3, window = "1m" }
on_crash_loop = "cooldown"
cooldown = "1h"
probation = "1s"
stop_timeout = "2s"
"#,
    );
}

/// A sandbox with supd running the agent at 1.0.0, committed.
fn at_1_0_0() -> Sandbox {
    let mut sb = Sandbox::new();
    agent_config(&sb);
    sb.start();
    sb.install_version("1.0.0", GOOD);
    sb.upgrade_wait("1.0.0", true);
    sb
}

fn versions(sb: &Sandbox) -> Value {
    sb.ok(json!({"cmd": "versions", "tool": "agent"}))
}

fn link(sb: &Sandbox) -> String {
    std::fs::read_link(sb.path("tools/agent/current"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn mark(v: &Value, version: &str, key: &str) -> Value {
    v["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|x| x["version"] == version)
        .map(|x| x[key].clone())
        .unwrap_or(Value::Null)
}

#[test]
fn a_service_waits_for_its_first_version_then_runs_it() {
    let mut sb = Sandbox::new();
    agent_config(&sb);
    sb.start();
    let st = sb.wait_state("agent", "failed");
    assert_eq!(st["reason"], "no current version of tool 'agent'");
    assert_eq!(st["restarts"], 0, "no version is not a crash");
    sb.install_version("1.0.0", GOOD);
    assert!(sb.path("tools/agent/1.0.0/bin/agent").exists());
    sb.upgrade_wait("1.0.0", true);
    let st = sb.wait_state("agent", "running");
    assert_eq!(st["version"], "1.0.0");
    let v = versions(&sb);
    assert_eq!(
        (v["current"].clone(), v["phase"].clone()),
        (json!("1.0.0"), json!("committed"))
    );
    assert_eq!(link(&sb), "1.0.0");
}

#[test]
fn install_refuses_bad_names_and_existing_versions_and_leaves_nothing_half_done() {
    let mut sb = Sandbox::new();
    agent_config(&sb);
    sb.start();
    let src = sb.stage_version("x", GOOD);
    std::os::unix::fs::symlink("bin/agent", src.join("link")).expect("symlink");
    for bad in ["latest", "1.2", "../x", "1.0.0+build"] {
        let out = sb.supctl(&["install", "agent", bad, &src.to_string_lossy()]);
        assert_eq!(out.status.code(), Some(1), "{bad}");
    }
    assert!(
        !sb.path("tools/agent").exists()
            || std::fs::read_dir(sb.path("tools/agent"))
                .expect("dir")
                .count()
                == 0
    );
    let out = sb.supctl(&["install", "agent", "1.0.0", &src.to_string_lossy()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Modes and symlinks inside the tree are kept.
    let meta = std::fs::metadata(sb.path("tools/agent/1.0.0/bin/agent")).expect("copied");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o755
    );
    assert_eq!(
        std::fs::read_link(sb.path("tools/agent/1.0.0/link")).expect("link kept"),
        PathBuf::from("bin/agent")
    );
    let out = sb.supctl(&["install", "agent", "1.0.0", &src.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already installed"));
    let names: Vec<String> = std::fs::read_dir(sb.path("tools/agent"))
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["1.0.0"], "no hidden leftovers");
}

#[test]
fn a_good_upgrade_commits_after_probation() {
    let sb = at_1_0_0();
    let old_pid = sb.wait_state("agent", "running")["pid"].clone();
    sb.install_version("1.1.0", GOOD);
    let mut w = sb.watch();
    let started = std::time::Instant::now();
    sb.upgrade_wait("1.1.0", true);
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(1),
        "committed before the probation of 1s"
    );
    w.until(&sb, |e| {
        e["event"] == "upgrade" && e["phase"] == "probation" && e["version"] == "1.1.0"
    });
    w.until(&sb, |e| {
        e["event"] == "upgrade" && e["phase"] == "committed"
    });
    let v = versions(&sb);
    assert_eq!(
        (
            v["current"].clone(),
            v["previous"].clone(),
            v["phase"].clone()
        ),
        (json!("1.1.0"), json!("1.0.0"), json!("committed"))
    );
    let st = sb.status("agent");
    assert_eq!(st["version"], "1.1.0");
    assert_ne!(st["pid"], old_pid);
    assert_eq!(link(&sb), "1.1.0");
}

#[test]
fn a_crash_looping_upgrade_rolls_back_and_is_marked_bad() {
    let sb = at_1_0_0();
    sb.install_version("2.0.0", CRASH);
    let mut w = sb.watch();
    let out = sb.supctl(&["upgrade", "agent", "2.0.0", "--wait"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("agent 2.0.0 was rolled back to 1.0.0") && err.contains("crash loop"),
        "{err}"
    );
    let rb = w.until(&sb, |e| e["event"] == "rollback");
    assert_eq!(
        (rb["from"].clone(), rb["to"].clone()),
        (json!("2.0.0"), json!("1.0.0"))
    );
    let st = sb.wait_state("agent", "running");
    assert_eq!(st["version"], "1.0.0");
    let v = versions(&sb);
    assert_eq!(
        (v["current"].clone(), v["phase"].clone()),
        (json!("1.0.0"), json!("rolled-back"))
    );
    assert_eq!(mark(&v, "2.0.0", "bad"), true);
    assert!(
        mark(&v, "2.0.0", "bad_reason")
            .as_str()
            .unwrap_or("")
            .contains("exited with code 3"),
        "{v}"
    );
    assert_eq!(link(&sb), "1.0.0");

    // A bad version is refused without --force, and nothing changes...
    let out = sb.supctl(&["upgrade", "agent", "2.0.0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("marked bad"));
    assert_eq!(link(&sb), "1.0.0");
    // ...and tried once more with it: the attempt is counted, and it rolls back again.
    let out = sb.supctl(&["upgrade", "agent", "2.0.0", "--force", "--wait"]);
    assert_eq!(out.status.code(), Some(1));
    let v = versions(&sb);
    assert_eq!(mark(&v, "2.0.0", "attempts"), 2);
    assert_eq!(mark(&v, "2.0.0", "bad"), true);
    assert_eq!(link(&sb), "1.0.0");
}

#[test]
fn an_irreversible_version_is_not_rolled_back_and_rollback_across_it_needs_force() {
    let sb = at_1_0_0();
    let src = sb.stage_version("3.0.0", CRASH);
    std::fs::write(src.join("sup-tool.toml"), "revertible = false\n").expect("manifest");
    let out = sb.supctl(&["install", "agent", "3.0.0", &src.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(0));
    let out = sb.supctl(&["upgrade", "agent", "3.0.0", "--wait"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stays (not revertible)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = versions(&sb);
    assert_eq!(
        (v["current"].clone(), v["phase"].clone()),
        (json!("3.0.0"), json!("failed"))
    );
    assert_eq!(mark(&v, "3.0.0", "irreversible"), true);
    assert_eq!(link(&sb), "3.0.0");
    // The service goes on under its own crash-loop rule (here: a long cooldown).
    assert_eq!(sb.wait_state("agent", "cooldown")["version"], "3.0.0");

    let out = sb.supctl(&["rollback", "agent"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("crosses the irreversible version 3.0.0"));
    assert_eq!(link(&sb), "3.0.0");
    let out = sb.supctl(&["rollback", "agent", "--force"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(link(&sb), "1.0.0");
    assert_eq!(sb.wait_state("agent", "running")["version"], "1.0.0");
}

#[test]
fn the_irreversible_flag_works_like_the_manifest() {
    let sb = at_1_0_0();
    sb.install_version("2.0.0", CRASH);
    let out = sb.supctl(&["upgrade", "agent", "2.0.0", "--irreversible", "--wait"]);
    assert_eq!(out.status.code(), Some(1));
    let v = versions(&sb);
    assert_eq!(
        (
            v["current"].clone(),
            v["phase"].clone(),
            mark(&v, "2.0.0", "irreversible")
        ),
        (json!("2.0.0"), json!("failed"), json!(true))
    );
}

#[test]
fn a_tool_that_switches_itself_gets_probation_and_rollback() {
    let sb = at_1_0_0();
    let trigger = sb.path("switch-now");
    // 1.0.1 switches `current` to 1.1.0 when asked, and exits; 1.1.0 crash-loops.
    let body = format!(
        "if [ -e {t} ]; then rm {t}; ln -s 1.1.0 ../.switch && mv -T ../.switch ../current; exit 0; fi\nexec /bin/sleep 3600",
        t = trigger.display()
    );
    sb.install_version("1.0.1", &body);
    sb.install_version("1.1.0", CRASH);
    sb.upgrade_wait("1.0.1", true);
    let mut w = sb.watch();
    std::fs::write(&trigger, "").expect("trigger");
    sb.ok(json!({"cmd": "restart", "service": "agent"}));
    let p = w.until(&sb, |e| {
        e["event"] == "upgrade" && e["phase"] == "probation"
    });
    assert_eq!(
        (p["version"].clone(), p["from"].clone()),
        (json!("1.1.0"), json!("1.0.1"))
    );
    assert!(
        p["reason"]
            .as_str()
            .unwrap_or("")
            .contains("switched itself"),
        "{p}"
    );
    let rb = w.until(&sb, |e| e["event"] == "rollback");
    assert_eq!(
        (rb["from"].clone(), rb["to"].clone()),
        (json!("1.1.0"), json!("1.0.1"))
    );
    assert_eq!(sb.wait_state("agent", "running")["version"], "1.0.1");
    let v = versions(&sb);
    assert_eq!(mark(&v, "1.1.0", "bad"), true);
    assert_eq!(link(&sb), "1.0.1");
}

#[test]
fn a_tool_that_switches_itself_to_a_good_version_commits() {
    let sb = at_1_0_0();
    let body = "ln -s 1.2.0 ../.switch && mv -T ../.switch ../current; exit 0";
    sb.install_version("1.2.0", GOOD);
    sb.install_version("1.1.0", body);
    let mut w = sb.watch();
    let out = sb.supctl(&["upgrade", "agent", "1.1.0"]);
    assert_eq!(out.status.code(), Some(0));
    // 1.1.0 starts, switches to 1.2.0 and exits; supd starts 1.2.0 as an upgrade whose
    // rollback goes to the last committed version, 1.0.0 (1.1.0 never finished its
    // probation: issue 21, item 3).
    let p = w.until(&sb, |e| {
        e["event"] == "upgrade" && e["phase"] == "probation" && e["version"] == "1.2.0"
    });
    assert_eq!(p["from"], "1.0.0");
    w.until(&sb, |e| {
        e["event"] == "upgrade" && e["phase"] == "committed" && e["current"] == "1.2.0"
    });
    assert_eq!(sb.status("agent")["version"], "1.2.0");
}

#[test]
fn prune_keeps_current_previous_and_newer_versions() {
    let sb = at_1_0_0();
    for v in ["1.1.0", "1.2.0", "1.3.0"] {
        sb.install_version(v, GOOD);
    }
    sb.install_version("2.0.0", CRASH);
    for v in ["1.1.0", "1.2.0"] {
        let out = sb.supctl(&["upgrade", "agent", v, "--wait"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = sb.supctl(&["upgrade", "agent", "2.0.0", "--wait"]);
    assert_eq!(out.status.code(), Some(1), "2.0.0 rolls back and is bad");
    // current 1.2.0, previous 1.1.0; 1.0.0 is old, 2.0.0 is bad, 1.3.0 is newer.
    let r = sb.ok(json!({"cmd": "prune", "tool": "agent", "keep": 1}));
    assert_eq!(
        r["pruned"],
        json!(["1.0.0"]),
        "--keep 1 keeps the newest of the prunable ({r})"
    );
    let r = sb.ok(json!({"cmd": "prune", "tool": "agent"}));
    assert_eq!(r["pruned"], json!(["2.0.0"]));
    let v = versions(&sb);
    let left: Vec<&str> = v["versions"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|x| x["version"].as_str())
        .collect();
    assert_eq!(left, ["1.1.0", "1.2.0", "1.3.0"]);
    // The rollback's answer comes once it is decided; 1.2.0 may still be starting again.
    assert_eq!(sb.wait_state("agent", "running")["version"], "1.2.0");
}

#[test]
fn upgrade_refusals_change_nothing() {
    let sb = at_1_0_0();
    let src = sb.stage_version("1.5.0", GOOD);
    std::fs::remove_file(src.join("bin/agent")).expect("rm");
    let out = sb.supctl(&["install", "agent", "1.5.0", &src.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(0));
    let cases: &[(&[&str], &str)] = &[
        (&["upgrade", "agent", "9.9.9"], "is not installed"),
        (&["upgrade", "agent", "1.5.0"], "cannot run: service agent:"),
        (&["upgrade", "agent", "1.0.0"], "already at 1.0.0"),
        (&["upgrade", "agent", "latest"], "is not a version"),
        (&["upgrade", "nope", "1.0.0"], "unknown-tool"),
    ];
    for (args, msg) in cases {
        let out = sb.supctl(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(msg), "{args:?}: {err}");
    }
    assert_eq!(link(&sb), "1.0.0");
    assert_eq!(versions(&sb)["phase"], "committed");
}

#[test]
fn an_upgrade_from_a_version_that_ignores_term_still_happens() {
    let mut sb = Sandbox::new();
    sb.config(
        "[service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\nready = \"fd:3\"\nprobation = \"1s\"\nstop_timeout = \"300ms\"\n",
    );
    sb.start();
    sb.install_version(
        "1.0.0",
        "trap '' TERM\necho >&3\nwhile :; do /bin/sleep 1; done",
    );
    sb.install_version("1.1.0", "echo >&3\nexec /bin/sleep 3600");
    sb.upgrade_wait("1.0.0", true);
    let old = sb.status("agent")["pid"].as_i64().expect("1.0.0's pid") as i32;
    sb.upgrade_wait("1.1.0", true);
    let st = sb.status("agent");
    assert_eq!(
        (st["version"].clone(), st["state"].clone()),
        (json!("1.1.0"), json!("running"))
    );
    assert!(!alive(old), "1.0.0 ignored TERM and was killed: {st}");
    // The last exit shown is 1.1.0's (none yet), not 1.0.0's KILL (issue 27).
    assert_eq!(st["last_exit"], Value::Null, "{st}");
}

#[test]
fn a_corrupt_record_is_reported_and_supd_goes_on_from_current() {
    let mut sb = at_1_0_0();
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
    std::fs::write(
        sb.path("state/tool-records/agent.json"),
        "{\"current\": \"1.0",
    )
    .expect("corrupt it");
    sb.start();
    let st = sb.wait_state("agent", "running");
    assert_eq!(st["version"], "1.0.0");
    let v = versions(&sb);
    assert_eq!(v["current"], "1.0.0");
    assert!(
        v["record_error"]
            .as_str()
            .unwrap_or("")
            .contains("is corrupt"),
        "{v}"
    );
    assert!(
        sb.path("state/tool-records/agent.json.corrupt").exists(),
        "kept aside for a person"
    );
    assert!(sb.supd_log().contains("is corrupt"));
}

/// An upgrade asked while another is in probation is refused for now, with the kind
/// `busy` (a fleet node reads the kind: it waits instead of halting the roll); nothing
/// changes.
#[test]
fn an_upgrade_during_another_probation_is_refused_as_busy() {
    let mut sb = Sandbox::new();
    sb.config("[service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\nprobation = \"1h\"\n");
    sb.start();
    sb.install_version("1.0.0", GOOD);
    sb.install_version("2.0.0", GOOD);
    sb.ok(json!({"cmd": "upgrade", "tool": "agent", "version": "1.0.0"}));
    let a = sb.request(json!({"cmd": "upgrade", "tool": "agent", "version": "2.0.0"}));
    assert_eq!(a["ok"], false, "{a}");
    assert_eq!(a["error"]["kind"], "busy", "{a}");
    let msg = a["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("in probation") && msg.contains("try again"),
        "{msg}"
    );
    let out = sb.supctl(&["upgrade", "agent", "2.0.0"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(link(&sb), "1.0.0");
    assert_eq!(versions(&sb)["phase"], "probation");
}
