//! Crash consistency of upgrades and rollbacks: supd aborts at every named step
//! (`SUP_FAILPOINT`), a new supd starts, and the record and the `current` link agree,
//! a probation resumes with its deadline, no bad mark is lost, and the service ends up
//! running the version `current` names.

mod common;
use common::*;
use serde_json::{json, Value};
use std::os::unix::process::ExitStatusExt;
use std::process::Command;

fn record(sb: &Sandbox) -> Value {
    std::fs::read(sb.path("state/tool-records/agent.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(json!({}))
}

fn link(sb: &Sandbox) -> String {
    std::fs::read_link(sb.path("tools/agent/current"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn case(point: &str) {
    assert!(
        sup::failpoint::POINTS.contains(&point),
        "unknown failpoint {point}"
    );
    let mut sb = Sandbox::new();
    sb.config(
        "[service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\nrestart_delay = \"10ms\"\n\
         crash_loop = { restarts = 3, window = \"1m\" }\ncooldown = \"1h\"\nprobation = \"1s\"\nstop_timeout = \"2s\"\n",
    );
    sb.start();
    sb.install_version("1.0.0", "exec /bin/sleep 3600");
    sb.install_version("1.1.0", "exec /bin/sleep 3600");
    sb.install_version("2.0.0", "exit 3");
    sb.upgrade_wait("1.0.0", true);
    let (args, versions): (&[&str], [&str; 2]) = match point.split('-').next() {
        Some("upgrade") | Some("commit") => (&["upgrade", "agent", "1.1.0"], ["1.0.0", "1.1.0"]),
        Some("rollback") => (&["upgrade", "agent", "2.0.0"], ["1.0.0", "2.0.0"]),
        _ => {
            sb.upgrade_wait("1.1.0", true);
            (&["rollback", "agent"], ["1.1.0", "1.0.0"])
        }
    };

    // Again with the failpoint armed; the operation makes it abort.
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
    let mut cmd = Command::new(SUPD);
    cmd.env("SUP_FAILPOINT", point);
    sb.start_with(cmd, &["-c"]);
    let _ = sb.supctl(args); // its answer may never come: supd aborts
    let pid = sb.supd_pid();
    assert!(
        wait_exit(pid, DEADLINE).is_some(),
        "{point}: supd did not abort\n{}",
        sb.supd_log()
    );
    let status = sb.supd.take().expect("child").wait().expect("wait");
    assert_eq!(
        status.signal(),
        Some(6),
        "{point}: supd ended otherwise than by the failpoint\n{}",
        sb.supd_log()
    );
    assert!(sb
        .supd_log()
        .contains(&format!("failpoint {point}: aborting")));
    let before = record(&sb);
    let down_at = std::time::Instant::now();
    let link_before = link(&sb);
    assert!(
        versions.contains(&link_before.as_str()),
        "{point}: current names {link_before}"
    );

    // A new supd puts things right.
    sb.start();
    if before["current"].as_str().is_some_and(|c| c != link_before) {
        assert!(
            sb.supd_log().contains("finishing an interrupted switch"),
            "{point}: the record named {} and the link {link_before}",
            before["current"]
        );
    }
    let v = sb.ok(json!({"cmd": "versions", "tool": "agent"}));
    let now = link(&sb);
    assert!(
        versions.contains(&now.as_str()),
        "{point}: current names {now}, not {versions:?}"
    );
    assert_eq!(
        v["current"],
        json!(now),
        "{point}: the record and the link agree: {v}"
    );
    for bad in before["bad"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k)
    {
        assert_eq!(
            v["versions"]
                .as_array()
                .expect("list")
                .iter()
                .find(|x| x["version"] == *bad)
                .map(|x| x["bad"].clone()),
            Some(json!(true)),
            "{point}: the bad mark of {bad} was lost"
        );
    }
    if before["phase"] == "probation"
        && link_before == before["current"].as_str().unwrap_or("")
        && v["phase"] == "probation"
    {
        // It goes on from its last write: the time since (supd down, and before that
        // at most the probation's 1 s it counted since its last write, when the abort
        // comes at its commit) does not count; nothing else moves the deadline.
        let (was, is) = (
            before["deadline_ms"].as_u64().unwrap_or(0),
            v["deadline_ms"].as_u64().unwrap_or(0),
        );
        let down = down_at.elapsed().as_millis() as u64;
        assert!(
            is >= was && is <= was + down + 2_000,
            "{point}: the probation resumes with its deadline moved by the time supd was down ({was} -> {is}, down {down} ms)"
        );
    }

    // And it settles: no probation left, the service runs what `current` names.
    let mut w = sb.watch();
    let end = std::time::Instant::now() + DEADLINE;
    loop {
        let v = sb.ok(json!({"cmd": "versions", "tool": "agent"}));
        let st = sb.status("agent");
        if v["phase"] != "probation"
            && st["state"] == "running"
            && st["version"] == json!(link(&sb))
            && v["current"] == json!(link(&sb))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "{point}: never settled: {v}\n{st}\n{}",
            sb.supd_log()
        );
        w.until(&sb, |_| true);
    }
    if point.starts_with("rollback-") {
        assert_eq!(
            link(&sb),
            "1.0.0",
            "{point}: the crash-looping version is gone"
        );
        let v = sb.ok(json!({"cmd": "versions", "tool": "agent"}));
        assert_eq!(
            v["versions"]
                .as_array()
                .expect("list")
                .iter()
                .find(|x| x["version"] == "2.0.0")
                .map(|x| x["bad"].clone()),
            Some(json!(true))
        );
    }
}

macro_rules! failpoints {
    ($($name:ident => $point:literal,)*) => {
        $(#[test] fn $name() { case($point); })*

        #[test]
        fn every_failpoint_has_a_test() {
            let tested = [$($point),*];
            assert_eq!(tested.as_slice(), sup::failpoint::POINTS);
        }
    };
}

failpoints! {
    upgrade_before_record => "upgrade-before-record",
    upgrade_after_record => "upgrade-after-record",
    upgrade_after_switch => "upgrade-after-switch",
    upgrade_after_restart => "upgrade-after-restart",
    commit_before_record => "commit-before-record",
    commit_after_record => "commit-after-record",
    rollback_before_record => "rollback-before-record",
    rollback_after_record => "rollback-after-record",
    rollback_after_switch => "rollback-after-switch",
    rollback_after_restart => "rollback-after-restart",
    oprollback_before_record => "oprollback-before-record",
    oprollback_after_record => "oprollback-after-record",
    oprollback_after_switch => "oprollback-after-switch",
}
