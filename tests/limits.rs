//! Issue 28: a service's cgroup limits hold on real processes (cgroup2 where it has the
//! controller, else the controller's v1 hierarchy, as on this kind of hybrid host): an
//! allocation past `memory_max` is OOM-killed and said so, a fork bomb stops at
//! `pids_max`, `cpu_max` holds a busy loop near its share, a reload changes a limit
//! without a restart, and an upgrade OOM-killed in probation is rolled back with that
//! reason. Each test needs root, and skips (saying why) where the machine has no
//! hierarchy for its controller at all.

mod common;
use common::cgroups::{cgroup_dir, memory_in_v1, skip, status_when};
use common::*;
use serde_json::json;
use std::fs;
use std::time::{Duration, Instant};
use sup::cgroup::limits::Controller;

/// An allocation of 100 MiB (dd's buffer, filled from /dev/zero) as the leader itself.
const ALLOCATE: &str = "\"/bin/dd\", \"if=/dev/zero\", \"of=/dev/null\", \"bs=100M\", \"count=1\"";

#[test]
fn an_allocation_past_memory_max_is_oom_killed_and_said_so() {
    if skip(Controller::Memory) {
        return;
    }
    let mut sb = Sandbox::new();
    sb.config(&format!(
        "[service.hog]\ncommand = [{ALLOCATE}]\nrestart = \"never\"\nmemory_max = \"32MiB\"\nautostart = false\n"
    ));
    let want = "killed by the kernel: out of memory (memory_max 32MiB)";
    sb.start();
    // Watched from before its start: the kill comes within milliseconds of it.
    let mut w = sb.watch();
    sb.request(json!({"cmd": "start", "service": "hog"}));
    let st = status_when(&sb, "hog", |s| s["state"] == "failed");
    assert!(
        st["reason"].as_str().is_some_and(|r| r.starts_with(want)),
        "{st}\n{}",
        sb.supd_log()
    );
    assert_eq!(st["oom_kills"], 1, "{st}");
    assert_eq!(st["last_exit"], json!({"signal": "KILL"}), "{st}");
    let e = w.until(&sb, |e| e["event"] == "oom" && e["service"] == "hog");
    assert_eq!(e["reason"], want, "{e}");
    assert!(sb.supd_log().contains(want), "{}", sb.supd_log());
    // The run's marker, as the log writer writes it.
    files::wait_file(&sb.path("log/hog.log"), |t| t.contains(want));
    // Counted since supd started, across a reexec.
    sb.reexec();
    assert_eq!(sb.status("hog")["oom_kills"], 1);
}

/// A shell whose child is OOM-killed exits 137 on its own: the kill is still the
/// kernel's, said and counted, with the shell's exit as it was.
#[test]
fn a_child_oom_killed_under_a_shell_is_said_so_with_the_shell_exit() {
    if skip(Controller::Memory) {
        return;
    }
    let mut sb = Sandbox::new();
    sb.config(
        "[service.hog]\ncommand = [\"/bin/sh\", \"-c\", \"/bin/dd if=/dev/zero of=/dev/null bs=100M count=1; exit $?\"]\nrestart = \"never\"\nmemory_max = \"32MiB\"\n",
    );
    sb.start();
    let st = status_when(&sb, "hog", |s| s["state"] == "failed");
    let want = "killed by the kernel: out of memory (memory_max 32MiB)";
    assert!(
        st["reason"].as_str().is_some_and(|r| r.starts_with(want)),
        "{st}\n{}",
        sb.supd_log()
    );
    assert_eq!(st["oom_kills"], 1, "{st}");
    assert_eq!(st["last_exit"], json!({"code": 137}), "{st}");
}

#[test]
fn a_fork_bomb_stops_at_pids_max() {
    if skip(Controller::Pids) {
        return;
    }
    let mut sb = Sandbox::new();
    let count = sb.path("count");
    // dash exits at the first fork it cannot make ("Cannot fork"); before that, each
    // sleep started is counted in the file (no fork: `echo` is built in).
    let bomb = sb.script(
        "bomb",
        &format!(
            "i=0\nwhile [ $i -lt 50 ]; do\n  /bin/sleep 3600 &\n  i=$((i+1))\n  echo $i > {}\ndone\necho all 50 started\n",
            count.display()
        ),
    );
    sb.config(&format!(
        "[service.bomb]\ncommand = [\"/bin/sh\", \"{bomb}\"]\nrestart = \"never\"\npids_max = 8\n"
    ));
    sb.start();
    let st = status_when(&sb, "bomb", |s| {
        s["state"] == "failed" || s["state"] == "exited"
    });
    let started: u32 = fs::read_to_string(&count)
        .expect("count")
        .trim()
        .parse()
        .expect("a number");
    // The shell and 7 sleeps are 8 tasks.
    assert!(started <= 7, "{started} sleeps started under pids_max = 8");
    let log = files::wait_file(&sb.path("log/bomb.log"), |t| t.contains("fork"));
    assert!(!log.contains("all 50 started"), "{st}\n{log}");
    // The host is fine: this test forks at will.
    let out = std::process::Command::new("/bin/true")
        .status()
        .expect("fork");
    assert!(out.success());
}

#[test]
fn cpu_max_holds_a_busy_loop_near_its_share() {
    if skip(Controller::Cpu) {
        return;
    }
    let mut sb = Sandbox::new();
    sb.config("[service.spin]\ncommand = [\"/bin/sh\", \"-c\", \"while :; do :; done\"]\ncpu_max = \"20%\"\n");
    sb.start();
    let first = status_when(&sb, "spin", |s| {
        s["state"] == "running" && s["resources"]["cpu_usec"].is_u64()
    });
    let t0 = Instant::now();
    // The window measured: what the loop may use of 2 s.
    std::thread::sleep(Duration::from_secs(2));
    let second = sb.status("spin");
    let used = second["resources"]["cpu_usec"].as_u64().expect("cpu_usec")
        - first["resources"]["cpu_usec"].as_u64().expect("cpu_usec");
    let share = used as f64 / t0.elapsed().as_micros() as f64;
    assert!(
        share < 0.35 && share > 0.05,
        "the loop used {:.0}% of one CPU under cpu_max = 20%",
        share * 100.0
    );
    assert_eq!(first["pid"], second["pid"]);
}

#[test]
fn reload_changes_memory_max_without_a_restart() {
    if skip(Controller::Memory) {
        return;
    }
    let mut sb = Sandbox::new();
    let svc = |limit: &str| {
        format!("[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\nmemory_max = \"{limit}\"\n")
    };
    sb.config(&svc("64MiB"));
    sb.start();
    let st = sb.wait_state("web", "running");
    let pid = st["pid"].as_i64().expect("pid") as i32;
    let file = if memory_in_v1() {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    };
    let path = cgroup_dir(pid, Controller::Memory)
        .expect("its memory cgroup")
        .join(file);
    let read = || {
        fs::read_to_string(&path)
            .expect("the limit")
            .trim()
            .to_string()
    };
    assert_eq!(read(), (64u64 << 20).to_string(), "{}", path.display());
    let mem = st["resources"]["memory_bytes"]
        .as_u64()
        .expect("memory_bytes");
    assert!(mem > 0 && mem < 64 << 20, "{st}");
    sb.config(&svc("128MiB"));
    let r = sb.ok(json!({"cmd": "reload"}));
    assert_eq!(r["limits"], json!(["web"]), "{r}");
    assert_eq!(r["changed"], json!([]), "{r}");
    assert_eq!(read(), (128u64 << 20).to_string());
    let long = sb.supctl(&["status", "-l", "web"]);
    let table = String::from_utf8_lossy(&long.stdout);
    assert!(
        table.contains("MEMORY") && table.contains("(peak "),
        "{table}"
    );
    let after = sb.status("web");
    assert_eq!(
        (after["pid"].clone(), after["state"].clone()),
        (json!(pid), json!("running"))
    );
}

#[test]
fn an_upgrade_oom_killed_in_probation_is_rolled_back_with_that_reason() {
    if skip(Controller::Memory) {
        return;
    }
    let mut sb = Sandbox::new();
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
memory_max = "32MiB"
"#,
    );
    sb.start();
    sb.install_version("1.0.0", "exec /bin/sleep 3600");
    sb.upgrade_wait("1.0.0", true);
    sb.install_version(
        "2.0.0",
        "exec /bin/dd if=/dev/zero of=/dev/null bs=100M count=1",
    );
    let out = sb.supctl(&["upgrade", "agent", "2.0.0", "--wait"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("agent 2.0.0 was rolled back to 1.0.0")
            && err.contains("killed by the kernel: out of memory (memory_max 32MiB)"),
        "{err}"
    );
    let st = sb.wait_state("agent", "running");
    assert_eq!(st["version"], "1.0.0");
    assert!(st["oom_kills"].as_u64().is_some_and(|n| n >= 3), "{st}");
}
