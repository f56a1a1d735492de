//! supd as PID 1 of a PID namespace (`unshare --pid --fork --mount-proc`), as in a
//! container: it reaps orphans it never started, and stops gracefully on SIGTERM.

mod common;
use common::*;
use nix::sys::signal::Signal;
use serde_json::json;
use std::process::Command;

/// The pid (in our namespace) of the namespace's PID 1: unshare's only child.
fn namespace_init(unshare_pid: i32) -> i32 {
    let children =
        std::fs::read_to_string(format!("/proc/{unshare_pid}/task/{unshare_pid}/children"))
            .expect("children");
    children
        .split_whitespace()
        .next()
        .expect("unshare has a child")
        .parse()
        .expect("pid")
}

#[test]
fn as_pid_1_it_reaps_100_orphans_and_exits_0_on_sigterm() {
    if !is_root() {
        eprintln!("skipped: needs root for unshare --pid");
        return;
    }
    let mut sb = Sandbox::new();
    let orphan = format!("orphan-{}", sb.tag);
    // Each orphan outlives the subshell that started it, so it is reparented to PID 1.
    // Long enough to be all alive when counted, however busy the machine.
    sb.script(&orphan, "/bin/sleep 4");
    let spawner = sb.script(
        "spawner.sh",
        &format!("i=0\nwhile [ $i -lt 100 ]; do ( {}/{orphan} & ); i=$((i+1)); done\ntouch {}/spawned\nexec /bin/sleep 3600", sb.dir.display(), sb.dir.display()),
    );
    sb.config(&format!(
        "[service.spawner]\ncommand = [\"{spawner}\"]\nrestart = \"never\"\n"
    ));
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child", SUPD]);
    sb.start_with(cmd, &["-c"]);
    let unshare = sb.supd_pid();
    let init = namespace_init(unshare);
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{init}/comm"))
            .expect("comm")
            .trim(),
        "supd"
    );
    let mut w = sb.watch();
    let st = sb.status("spawner");
    if st["state"] != "running" {
        w.state(&sb, "spawner", "running");
    }
    // As PID 1 it ignores SIGTTIN and SIGTTOU (a terminal never stops the init); its
    // services do not.
    const TTIN_TTOU: u64 = (1 << (21 - 1)) | (1 << (22 - 1));
    let ignored = |pid: i32| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        let hex = text
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .expect("SigIgn");
        u64::from_str_radix(hex.trim(), 16).expect("hex")
    };
    assert_eq!(ignored(init) & TTIN_TTOU, TTIN_TTOU, "supd as PID 1");
    let spawner = sb.status("spawner")["pid"].as_i64().expect("pid");
    let spawner_here = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
        .expect("children")
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/status")).is_ok_and(|t| {
                t.lines()
                    .any(|l| l.starts_with("NSpid:") && l.ends_with(&format!("\t{spawner}")))
            })
        })
        .expect("the spawner, seen from outside the namespace");
    assert_eq!(ignored(spawner_here) & TTIN_TTOU, 0, "a service");
    // The spawner touches its marker after starting all 100; wait for it through its own
    // exit-free run: the orphans are there once the marker is.
    let marker = sb.path("spawned");
    let start = std::time::Instant::now();
    let orphans = loop {
        assert!(start.elapsed() < DEADLINE, "the spawner never finished");
        let done = marker.exists();
        let found: Vec<i32> = sup::proc::all()
            .into_iter()
            .filter(|s| {
                std::fs::read_to_string(format!("/proc/{}/comm", s.pid))
                    .is_ok_and(|c| c.trim() == orphan)
            })
            .map(|s| s.pid)
            .collect();
        if done {
            break found;
        }
        // Each round is a request to supd: no guessed sleep, and it proves supd answers.
        sb.status("spawner");
    };
    assert!(
        orphans.len() >= 90,
        "expected about 100 orphans, found {}",
        orphans.len()
    );
    for p in &orphans {
        assert!(wait_exit(*p, DEADLINE).is_some(), "orphan {p} did not end");
    }
    // Their SIGCHLDs are pending at supd before this request is read: after its answer,
    // every one of them has been reaped.
    sb.ok(json!({"cmd": "hello"}));
    let zombies: Vec<i32> = orphans
        .iter()
        .copied()
        .filter(|p| sup::proc::stat(*p).is_some())
        .collect();
    assert!(zombies.is_empty(), "orphans left as zombies: {zombies:?}");

    // unshare ignores SIGTERM while it waits: the signal goes to the namespace's init.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(init), Signal::SIGTERM)
        .expect("TERM to PID 1");
    assert!(
        wait_exit(unshare, DEADLINE).is_some(),
        "PID 1 did not stop\n{}",
        sb.supd_log()
    );
    let status = sb.supd.take().expect("unshare").wait().expect("wait");
    assert_eq!(status.code(), Some(0), "{}", sb.supd_log());
    assert!(sb
        .supd_log()
        .contains("every service is down; exiting with status 0"));
}

/// LXC stops a container by sending its init SIGPWR (`lxc.signal.halt`): as PID 1, supd
/// stops its services in order and exits 0, as on SIGTERM. (It used to ignore it, and
/// `lxc-stop` waited out its timeout, then killed the container.)
#[test]
fn as_pid_1_sigpwr_stops_the_services_and_exits_0() {
    if !is_root() {
        eprintln!("skipped: needs root for unshare --pid");
        return;
    }
    let mut sb = Sandbox::new();
    let marker = sb.path("stopped-by-term");
    let svc = sb.script(
        "svc.sh",
        &format!(
            "trap ': > {}; exit 0' TERM\necho >&3\n/bin/sleep 3600 &\nwait",
            marker.display()
        ),
    );
    // Ready once its trap is set: a TERM before it (a loaded machine's slow shell) would
    // end it without the marker.
    sb.config(&format!(
        "[service.svc]\ncommand = [\"{svc}\"]\nready = \"fd:3\"\n"
    ));
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child", SUPD]);
    sb.start_with(cmd, &["-c"]);
    let unshare = sb.supd_pid();
    let init = namespace_init(unshare);
    sb.wait_state("svc", "running");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(init), Signal::SIGPWR).expect("PWR to PID 1");
    assert!(
        wait_exit(unshare, DEADLINE).is_some(),
        "PID 1 did not stop on SIGPWR\n{}",
        sb.supd_log()
    );
    let status = sb.supd.take().expect("unshare").wait().expect("wait");
    assert_eq!(status.code(), Some(0), "{}", sb.supd_log());
    assert!(
        marker.exists(),
        "the service was not stopped with its stop signal"
    );
    assert!(
        sb.supd_log().contains("SIGPWR: stopping"),
        "{}",
        sb.supd_log()
    );
}
