//! Issue 28, where limits meet other features or faults: a reload that gives a running
//! service its first `memory_max`, a run carried over by `reexec`, a supd killed with
//! SIGKILL and started again, `instances`, a stop the OOM killer interrupts. Each test
//! needs root and the memory controller somewhere (it skips, saying why, otherwise).

mod common;
use common::cgroups::{memory_in_v1, skip, status_when, v1_cgroup};
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use sup::cgroup::limits::Controller;

/// Whether the test cannot run here (said why): as for `skip`, or the memory controller
/// is not a cgroup v1 hierarchy's.
fn skip_unless_memory_in_v1() -> bool {
    if skip(Controller::Memory) {
        return true;
    }
    if !memory_in_v1() {
        eprintln!("skipped: the memory controller is not a cgroup v1 hierarchy here");
        return true;
    }
    false
}

/// The pid of `name`'s run, once it is running.
fn running_pid(sb: &Sandbox, name: &str) -> i32 {
    sb.wait_state(name, "running")["pid"].as_i64().expect("pid") as i32
}

/// The status of `name` once a run other than `old` is running.
fn next_run(sb: &Sandbox, name: &str, old: i32) -> Value {
    status_when(sb, name, |s| {
        s["state"] == "running" && s["pid"].is_i64() && s["pid"] != json!(old)
    })
}

/// Waits (polling the file system: no event tells of a cgroup removed) until `pred`
/// holds, within the deadline.
fn fs_until(what: &str, pred: impl Fn() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !pred() {
        assert!(Instant::now() < end, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A FIFO in the sandbox: a service blocked reading it goes on when the test writes.
fn fifo(sb: &Sandbox, name: &str) -> PathBuf {
    let p = sb.path(name);
    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    p
}

/// Lets a service blocked on `fifo` go on (the open waits for its reader).
fn release(fifo: &PathBuf) {
    fs::write(fifo, "go\n").expect("write the fifo");
}

const OOM: &str = "killed by the kernel: out of memory (memory_max 32MiB)";

/// A service started without limits is given `memory_max` by a reload (no restart):
/// when its run then allocates past it, the kernel's kill is said as an OOM kill, as
/// for a run started under the limit.
#[test]
fn an_oom_kill_after_a_reload_gave_memory_max_is_said_so() {
    if skip(Controller::Memory) {
        return;
    }
    let mut sb = Sandbox::new();
    let go = fifo(&sb, "go");
    let svc = |limit: &str| {
        format!(
            "[service.hog]\ncommand = [\"/bin/sh\", \"-c\", \"read x < {}; exec /bin/dd if=/dev/zero of=/dev/null bs=100M count=1\"]\nrestart = \"never\"\n{limit}",
            go.display()
        )
    };
    sb.config(&svc(""));
    sb.start();
    let pid = running_pid(&sb, "hog");
    sb.config(&svc("memory_max = \"32MiB\"\n"));
    let r = sb.ok(json!({"cmd": "reload"}));
    assert_eq!(r["limits"], json!(["hog"]), "{r}");
    if memory_in_v1() {
        assert!(
            v1_cgroup(pid, "memory").is_some(),
            "the run was not moved into its memory cgroup"
        );
    }
    release(&go);
    let st = status_when(&sb, "hog", |s| s["state"] == "failed");
    assert_eq!(st["pid"], Value::Null, "{st}");
    assert!(
        st["reason"].as_str().is_some_and(|r| r.starts_with(OOM)),
        "{st}\n{}",
        sb.supd_log()
    );
    assert_eq!(st["oom_kills"], 1, "{st}");
}

/// A run carried over by `reexec` and OOM-killed after it is said so: the count it
/// started at crossed the exec.
#[test]
fn an_oom_kill_of_a_run_carried_over_by_reexec_is_said_so() {
    if skip(Controller::Memory) {
        return;
    }
    let mut sb = Sandbox::new();
    let go = fifo(&sb, "go");
    sb.config(&format!(
        "[service.hog]\ncommand = [\"/bin/sh\", \"-c\", \"read x < {}; exec /bin/dd if=/dev/zero of=/dev/null bs=100M count=1\"]\nrestart = \"never\"\nmemory_max = \"32MiB\"\n",
        go.display()
    ));
    sb.start();
    let pid = running_pid(&sb, "hog");
    sb.reexec();
    assert_eq!(sb.status("hog")["pid"], json!(pid));
    release(&go);
    let st = status_when(&sb, "hog", |s| s["state"] == "failed");
    assert!(
        st["reason"].as_str().is_some_and(|r| r.starts_with(OOM)),
        "{st}\n{}",
        sb.supd_log()
    );
    assert_eq!(st["oom_kills"], 1, "{st}");
}

/// A supd killed with SIGKILL while a limited service runs, started again: the old run
/// is ended, the new one is under the same limits in cgroups of its own, no OOM kill
/// is counted, and a clean exit leaves no cgroup v1 directory of its own.
#[test]
fn a_killed_supd_started_again_limits_the_new_run_and_leaves_no_v1_cgroups() {
    if skip_unless_memory_in_v1() {
        return;
    }
    let mut sb = Sandbox::new();
    sb.config(
        "[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\nmemory_max = \"64MiB\"\npids_max = 16\n",
    );
    sb.start();
    let old = running_pid(&sb, "web");
    let mem = v1_cgroup(old, "memory").expect("its memory cgroup");
    let pids = v1_cgroup(old, "pids");
    sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    assert!(alive(old), "the run went with supd");
    sb.start();
    assert!(
        wait_exit(old, DEADLINE).is_some(),
        "the old run was not ended"
    );
    let st = next_run(&sb, "web", old);
    let new = st["pid"].as_i64().expect("pid") as i32;
    assert_eq!(v1_cgroup(new, "memory").as_ref(), Some(&mem));
    let limit = fs::read_to_string(mem.join("memory.limit_in_bytes")).expect("limit");
    assert_eq!(limit.trim(), (64u64 << 20).to_string());
    if let Some(p) = &pids {
        assert_eq!(v1_cgroup(new, "pids").as_ref(), Some(p));
        let max = fs::read_to_string(p.join("pids.max")).expect("pids.max");
        assert_eq!(max.trim(), "16");
    }
    assert_eq!(st["oom_kills"], 0, "{st}");
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
    let root = mem.parent().expect("root").to_path_buf();
    assert!(!mem.exists(), "{} is left", mem.display());
    assert!(!root.exists(), "{} is left", root.display());
    if let Some(p) = &pids {
        assert!(!p.exists(), "{} is left", p.display());
    }
}

/// A supd killed with SIGKILL while a limited service runs, started again on a config
/// without that service: once the old run is ended, its cgroup v1 directories go too
/// (supd runs on; they are not left until its exit).
#[test]
fn a_killed_supd_started_without_the_service_removes_its_v1_cgroups() {
    if skip_unless_memory_in_v1() {
        return;
    }
    let mut sb = Sandbox::new();
    sb.config(
        "[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\nmemory_max = \"64MiB\"\n[service.other]\ncommand = [\"/bin/sleep\", \"3600\"]\n",
    );
    sb.start();
    let old = running_pid(&sb, "web");
    let mem = v1_cgroup(old, "memory").expect("its memory cgroup");
    sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    sb.config("[service.other]\ncommand = [\"/bin/sleep\", \"3600\"]\n");
    sb.start();
    assert!(
        wait_exit(old, DEADLINE).is_some(),
        "the old run was not ended"
    );
    sb.wait_state("other", "running");
    fs_until(
        &format!(
            "{} is left while supd runs\n{}",
            mem.display(),
            sb.supd_log()
        ),
        || !mem.exists(),
    );
}

/// `instances = 3` with `memory_max`: each instance has a memory cgroup of its own,
/// with the limit.
#[test]
fn each_instance_has_its_own_limited_cgroups() {
    if skip_unless_memory_in_v1() {
        return;
    }
    let mut sb = Sandbox::new();
    sb.config(
        "[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\ninstances = 3\nmemory_max = \"48MiB\"\n",
    );
    sb.start();
    let mut dirs = Vec::new();
    for i in 0..3 {
        let name = format!("web@{i}");
        let pid = running_pid(&sb, &name);
        let mem = v1_cgroup(pid, "memory").expect("its memory cgroup");
        let limit = fs::read_to_string(mem.join("memory.limit_in_bytes")).expect("limit");
        assert_eq!(limit.trim(), (48u64 << 20).to_string(), "{name}");
        assert!(!dirs.contains(&mem), "{name} shares {}", mem.display());
        dirs.push(mem);
    }
}

/// A service the OOM killer ends while it stops (its TERM handler allocates past
/// `memory_max`) is stopped, as asked: not failed, not restarted; the kill is counted.
#[test]
fn an_oom_kill_during_stop_is_a_stop() {
    if skip(Controller::Memory) {
        return;
    }
    let mut sb = Sandbox::new();
    let hog = sb.script(
        "hog",
        "trap 'exec /bin/dd if=/dev/zero of=/dev/null bs=100M count=1' TERM\nwhile :; do /bin/sleep 1; done",
    );
    sb.config(&format!(
        "[service.hog]\ncommand = [\"/bin/sh\", \"{hog}\"]\nmemory_max = \"32MiB\"\nstop_timeout = \"10s\"\n"
    ));
    sb.start();
    sb.wait_state("hog", "running");
    let out = sb.supctl(&["stop", "hog"]);
    assert!(out.status.success(), "{:?}", out);
    let st = status_when(&sb, "hog", |s| {
        s["state"] != "stopping" && s["state"] != "running"
    });
    assert_eq!(st["state"], "stopped", "{st}\n{}", sb.supd_log());
    assert_eq!(st["oom_kills"], 1, "{st}");
}

/// A run carried over by `reexec` stays in its limited cgroups, and the next run (after
/// a restart) is put in them again, with the limits.
#[test]
fn after_reexec_the_carried_run_and_the_next_are_limited() {
    if skip_unless_memory_in_v1() {
        return;
    }
    let mut sb = Sandbox::new();
    sb.config(
        "[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\nmemory_max = \"40MiB\"\npids_max = 12\nrestart_delay = \"0s\"\n",
    );
    sb.start();
    let old = running_pid(&sb, "web");
    let mem = v1_cgroup(old, "memory").expect("its memory cgroup");
    sb.reexec();
    assert_eq!(v1_cgroup(old, "memory").as_ref(), Some(&mem));
    let out = sb.supctl(&["restart", "web"]);
    assert!(out.status.success(), "{out:?}");
    let st = next_run(&sb, "web", old);
    let new = st["pid"].as_i64().expect("pid") as i32;
    assert_eq!(v1_cgroup(new, "memory").as_ref(), Some(&mem), "{st}");
    let limit = fs::read_to_string(mem.join("memory.limit_in_bytes")).expect("limit");
    assert_eq!(limit.trim(), (40u64 << 20).to_string());
    if let Some(p) = v1_cgroup(new, "pids") {
        let max = fs::read_to_string(p.join("pids.max")).expect("pids.max");
        assert_eq!(max.trim(), "12");
    }
    assert!(st["resources"]["memory_bytes"].is_u64(), "{st}");
}

/// A limit the config on disk no longer sets when `reexec` reads it: the new image
/// knows the old one wrote it (the handoff says what was written), and the next start
/// sets it back to the kernel's default instead of leaving it.
#[test]
fn a_limit_dropped_from_the_config_a_reexec_reads_is_set_back_at_the_next_start() {
    if skip_unless_memory_in_v1() {
        return;
    }
    let mut sb = Sandbox::new();
    let keys = "[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\nmemory_max = \"40MiB\"\nrestart_delay = \"0s\"\n";
    sb.config(&format!("{keys}memory_high = \"30MiB\"\n"));
    sb.start();
    let old = running_pid(&sb, "web");
    let mem = v1_cgroup(old, "memory").expect("its memory cgroup");
    let soft = || {
        fs::read_to_string(mem.join("memory.soft_limit_in_bytes"))
            .expect("soft limit")
            .trim()
            .to_string()
    };
    assert_eq!(soft(), (30u64 << 20).to_string());
    sb.config(keys);
    sb.reexec();
    let shown = sb.ok(json!({"cmd": "show", "service": "web"}));
    let high =
        (shown["settings"].as_array().into_iter().flatten()).find(|s| s["key"] == "memory_high");
    assert!(
        high.is_none_or(|h| h["origin"] == "default"),
        "the reexec read the config on disk: {shown}"
    );
    let out = sb.supctl(&["restart", "web"]);
    assert!(out.status.success(), "{out:?}");
    let st = next_run(&sb, "web", old);
    let new = st["pid"].as_i64().expect("pid") as i32;
    assert_eq!(v1_cgroup(new, "memory").as_ref(), Some(&mem), "{st}");
    assert_ne!(
        soft(),
        (30u64 << 20).to_string(),
        "memory_high left in place after the config dropped it"
    );
}

/// A reload that takes `instances` from 3 to 2: the instance removed goes, and their
/// cgroup v1 directories with them, while supd runs on.
#[test]
fn instances_removed_by_reload_leave_no_v1_cgroups() {
    if skip_unless_memory_in_v1() {
        return;
    }
    let mut sb = Sandbox::new();
    let svc = |n: u32| {
        format!("[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\ninstances = {n}\nmemory_max = \"48MiB\"\n")
    };
    sb.config(&svc(3));
    sb.start();
    let mut dirs = Vec::new();
    for i in 0..3 {
        let pid = running_pid(&sb, &format!("web@{i}"));
        dirs.push(v1_cgroup(pid, "memory").expect("its memory cgroup"));
    }
    sb.config(&svc(2));
    sb.ok(json!({"cmd": "reload"}));
    for d in &dirs[2..] {
        fs_until(
            &format!("{} is left\n{}", d.display(), sb.supd_log()),
            || !d.exists(),
        );
    }
    assert!(dirs[0].exists() && dirs[1].exists());
}

/// A worker OOM-killed under `memory_max` while its service runs on (a shell, a
/// server's master process, starts it and goes on): the kill is the kernel's all the
/// same, and `oom_kills` and `sup_service_oom_kills_total` ("processes of the service
/// killed by the kernel for want of memory") count it.
#[test]
fn a_worker_oom_killed_while_its_service_runs_on_is_counted() {
    if skip(Controller::Memory) {
        return;
    }
    let mut sb = Sandbox::new();
    let marker = sb.path("after");
    sb.config(&format!(
        "[service.w]\ncommand = [\"/bin/sh\", \"-c\", \"/bin/dd if=/dev/zero of=/dev/null bs=100M count=1; echo $? > {}; exec /bin/sleep 3600\"]\nmemory_max = \"32MiB\"\n",
        marker.display()
    ));
    sb.start();
    let code = files::wait_file(&marker, |t| !t.is_empty());
    assert_eq!(code.trim(), "137", "dd was not OOM-killed");
    let st = sb.status("w");
    assert_eq!(st["state"], "running", "{st}");
    let out = sb.supctl(&["metrics"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("sup_service_oom_kills_total{service=\"w\"} 1"),
        "status {st}\n{text}"
    );
    assert_eq!(st["oom_kills"], 1, "{st}");
}

/// supd started with `cgroups = "off"`; a reload turns them to `"auto"` and gives a
/// service `memory_max`. supd makes its cgroups at its start only: the reload must not
/// take a limit that will not hold without saying so. Either it refuses (or warns of)
/// the limit, or the service's next run is under it.
#[test]
fn a_reload_that_turns_cgroups_on_with_a_limit_does_not_take_it_silently() {
    if skip_unless_memory_in_v1() {
        return;
    }
    let mut sb = Sandbox::new();
    sb.config_with(
        "cgroups = \"off\"",
        "[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\nrestart_delay = \"0s\"\n",
    );
    sb.start();
    let old = running_pid(&sb, "web");
    sb.config_with(
        "cgroups = \"auto\"",
        "[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\nrestart_delay = \"0s\"\nmemory_max = \"32MiB\"\n",
    );
    let a = sb.request(json!({"cmd": "reload"}));
    if a["ok"] != true {
        // Refused, with why: fine.
        return;
    }
    let said = sb.supd_log();
    let warned = said
        .lines()
        .any(|l| l.contains("WARN") && l.contains("cgroups") && l.contains("restart"));
    let st = next_run(&sb, "web", old);
    let pid = st["pid"].as_i64().expect("pid") as i32;
    let limited = v1_cgroup(pid, "memory").is_some_and(|d| {
        fs::read_to_string(d.join("memory.limit_in_bytes"))
            .is_ok_and(|t| t.trim() == (32u64 << 20).to_string())
    });
    assert!(
        limited || warned,
        "the reload took memory_max; the new run {pid} is not under it, and nothing said so: {a}\n{said}"
    );
    // And the start of a run whose limits do not hold says so.
    assert!(
        limited || sb.supd_log().contains("web: its limits do not hold"),
        "{}",
        sb.supd_log()
    );
}

/// A reload that takes every limit from a running service, then a restart: the new run
/// is in no limited cgroup, the old run's cgroup v1 directories go (none is left while
/// supd runs), and `resources` does not read the empty ones left (a running service
/// shown using 0 bytes).
#[test]
fn limits_all_taken_away_by_reload_leave_no_v1_cgroups_after_the_next_start() {
    if skip_unless_memory_in_v1() {
        return;
    }
    let mut sb = Sandbox::new();
    let svc = |limit: &str| {
        format!(
            "[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\nrestart_delay = \"0s\"\n{limit}"
        )
    };
    sb.config(&svc("memory_max = \"64MiB\"\n"));
    sb.start();
    let old = running_pid(&sb, "web");
    let mem = v1_cgroup(old, "memory").expect("its memory cgroup");
    sb.config(&svc(""));
    let r = sb.ok(json!({"cmd": "reload"}));
    assert_eq!(r["limits"], json!(["web"]), "{r}");
    assert!(sb.supctl(&["restart", "web"]).status.success());
    let st = next_run(&sb, "web", old);
    let new = st["pid"].as_i64().expect("pid") as i32;
    assert_eq!(v1_cgroup(new, "memory"), None, "{st}");
    fs_until(
        &format!("{} is left while supd runs", mem.display()),
        || !mem.exists(),
    );
    let bytes = &sb.status("web")["resources"]["memory_bytes"];
    assert!(
        bytes.is_null() || bytes.as_u64().is_some_and(|b| b > 0),
        "a running service shown using {bytes} bytes"
    );
}

/// A reload whose limit is invalid (`pids_max = 0`, `cpu_max = "0%"`) is refused with
/// the reason, and the running service keeps its limit, run and all.
#[test]
fn a_reload_with_an_invalid_limit_is_refused_and_the_limit_holds() {
    if skip_unless_memory_in_v1() {
        return;
    }
    let mut sb = Sandbox::new();
    let svc = |extra: &str| {
        format!(
            "[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\nmemory_max = \"64MiB\"\n{extra}"
        )
    };
    sb.config(&svc(""));
    sb.start();
    let pid = running_pid(&sb, "web");
    let mem = v1_cgroup(pid, "memory").expect("its memory cgroup");
    for bad in [
        "pids_max = 0\n",
        "cpu_max = \"0%\"\n",
        "memory_max = \"lots\"\n",
    ] {
        sb.config(&svc(bad).replace("memory_max = \"64MiB\"\nmemory_max", "memory_max"));
        let a = sb.request(json!({"cmd": "reload"}));
        assert_eq!(a["ok"], false, "{bad}: {a}");
        let limit = fs::read_to_string(mem.join("memory.limit_in_bytes")).expect("limit");
        assert_eq!(limit.trim(), (64u64 << 20).to_string(), "{bad}");
        assert_eq!(sb.status("web")["pid"], json!(pid), "{bad}");
    }
}
