//! supd's own life: killed and started again (no duplicates), a second supd, a config
//! that is broken at start, reload, and a graceful stop.

mod common;
use common::*;
use nix::sys::signal::Signal;
use serde_json::json;
use std::os::unix::process::CommandExt;

#[test]
fn kill_9_of_supd_and_restart_leaves_exactly_one_instance() {
    let mut sb = Sandbox::new();
    let tag = sb.tag.to_string();
    let kid = sb.path("kid.pid");
    let child = sb.script(
        "svc.sh",
        &format!("/bin/sleep {tag} &\necho $! > {k}.tmp\nmv {k}.tmp {k}\necho >&3\nexec /bin/sleep {tag}0", k = kid.display()),
    );
    sb.config(&format!(
        "[service.one]\ncommand = [\"{child}\"]\nready = \"fd:3\"\nstop_timeout = \"2s\"\n"
    ));
    sb.start();
    let first = sb.wait_state("one", "running")["pid"]
        .as_i64()
        .expect("pid") as i32;
    let first_kid: i32 = std::fs::read_to_string(&kid)
        .expect("kid pid")
        .trim()
        .parse()
        .expect("pid");
    assert_eq!(sb.recorded_groups(), vec![first], "the pid is recorded");
    sb.stop_supd(Signal::SIGKILL);
    assert!(
        alive(first) && alive(first_kid),
        "the service outlives a killed supd"
    );

    sb.start();
    let second = sb.wait_state("one", "running")["pid"]
        .as_i64()
        .expect("pid") as i32;
    assert_ne!(first, second);
    // The old instance was ended before the new one started: nothing is left of its group.
    assert!(
        !alive(first) && !alive(first_kid),
        "the old instance survived\n{}",
        sb.supd_log()
    );
    let old_group: Vec<i32> = sup::proc::all()
        .into_iter()
        .filter(|s| s.pgrp == first && s.state != 'Z')
        .map(|s| s.pid)
        .collect();
    assert!(
        old_group.is_empty(),
        "members of the old group survived: {old_group:?}"
    );
    // The new instance is whole: its child is alive, in its group.
    let second_kid: i32 = std::fs::read_to_string(&kid)
        .expect("kid pid")
        .trim()
        .parse()
        .expect("pid");
    assert_ne!(second_kid, first_kid);
    assert_eq!(sup::proc::stat(second_kid).map(|s| s.pgrp), Some(second));
    assert!(sb.supd_log().contains("was left by a previous supd"));
    assert!(
        sb.supd_log().contains("replaced the stale socket"),
        "the killed supd's socket file is replaced"
    );
}

#[test]
fn a_recorded_pid_that_was_reused_is_left_alone() {
    let mut sb = Sandbox::new();
    // A live process that is not a service: its pid with a wrong start time in the records.
    // It leads its own process group, as a service would: a wrong kill would hit it.
    let mut bystander = std::process::Command::new("/bin/sleep")
        .arg("3600")
        .process_group(0)
        .spawn()
        .expect("spawn");
    let pid = bystander.id() as i32;
    std::fs::create_dir_all(sb.path("state/pids")).expect("mkdir");
    std::fs::write(sb.path("state/pids/x"), format!("{pid} 1\n")).expect("write");
    sb.config("");
    sb.start();
    assert!(
        alive(pid),
        "supd killed a process whose pid merely matched a record"
    );
    let _ = bystander.kill();
    let _ = bystander.wait();
}

#[test]
fn a_second_supd_on_the_same_socket_refuses_to_start() {
    let mut sb = Sandbox::new();
    sb.config("[service.a]\ncommand = [\"/bin/sleep\", \"3600\"]\n");
    sb.start();
    let pid = sb.wait_state("a", "running")["pid"].clone();
    let out = std::process::Command::new(SUPD)
        .arg("-c")
        .arg(sb.path("sup.toml"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another supd"), "{err}");
    // With another state_dir but the same socket, the socket check refuses.
    std::fs::write(
        sb.path("other.toml"),
        "[supd]\nsocket = \"sup.sock\"\nstate_dir = \"state2\"\nlog_dir = \"log\"\n",
    )
    .expect("write");
    let out = std::process::Command::new(SUPD)
        .arg("-c")
        .arg(sb.path("other.toml"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("another supd is already serving"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        sb.status("a")["pid"],
        pid,
        "the first supd and its service are untouched"
    );
}

#[test]
fn a_broken_config_at_start_keeps_supd_up_until_a_good_reload() {
    let mut sb = Sandbox::new();
    sb.config("[service.a]\ncommand = [\"/bin/sleep\", \"3600\"]\nrestart = \"maybe\"\n");
    sb.start();
    let st = sb.ok(json!({"cmd": "status"}));
    assert_eq!(st["services"], json!([]));
    let errs = st["config_errors"].to_string();
    assert!(errs.contains("sup.toml:10:11: service.a.restart"), "{errs}");
    let out = sb.supctl(&["status"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("the config has errors"));
    sb.config("[service.a]\ncommand = [\"/bin/sleep\", \"3600\"]\n");
    let r = sb.ok(json!({"cmd": "reload"}));
    assert_eq!(r["added"], json!(["a"]));
    sb.wait_state("a", "running");
}

#[test]
fn check_reports_every_error_and_exits_1() {
    let sb = Sandbox::new();
    sb.config("[service.a]\ncommand = [\"/bin/true\"]\nrestart_delay = \"soon\"\nbogus = 1\n");
    let out = std::process::Command::new(SUPD)
        .args(["--check", "-c"])
        .arg(sb.path("sup.toml"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sup.toml:10:17: service.a.restart_delay:"),
        "{err}"
    );
    assert!(
        err.contains("sup.toml:11:1: service.a.bogus: unknown key"),
        "{err}"
    );
    sb.config("[service.a]\ncommand = [\"/bin/true\"]\n");
    let out = std::process::Command::new(SUPD)
        .args(["--check", "-c"])
        .arg(sb.path("sup.toml"))
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn reload_with_errors_changes_nothing_and_a_good_one_restarts_only_what_changed() {
    let mut sb = Sandbox::new();
    let base = "[service.same]\ncommand = [\"/bin/sleep\", \"3600\"]\n\n[service.edit]\ncommand = [\"/bin/sleep\", \"3601\"]\n\n\
                [service.gone]\ncommand = [\"/bin/sleep\", \"3602\"]\n";
    sb.config(base);
    sb.start();
    let same = sb.wait_state("same", "running")["pid"].clone();
    let edit = sb.wait_state("edit", "running")["pid"].clone();
    sb.wait_state("gone", "running");

    sb.config(&format!(
        "{base}\n[service.new]\ncommand = [\"/bin/sleep\", \"3603\"]\nbad_key = true\n"
    ));
    let a = sb.request(json!({"cmd": "reload"}));
    assert_eq!(a["ok"], false);
    assert_eq!(a["error"]["kind"], "invalid-config");
    assert!(
        a["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("service.new.bad_key"),
        "{a}"
    );
    let all = sb.ok(json!({"cmd": "status"}));
    let names: Vec<&str> = all["services"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["edit", "gone", "same"]);
    assert_eq!(sb.status("edit")["pid"], edit);

    sb.config(
        "[service.same]\ncommand = [\"/bin/sleep\", \"3600\"]\n\n[service.edit]\ncommand = [\"/bin/sleep\", \"3604\"]\n\n\
         [service.new]\ncommand = [\"/bin/sleep\", \"3603\"]\n",
    );
    let mut w = sb.watch();
    let r = sb.ok(json!({"cmd": "reload"}));
    assert_eq!(
        (
            r["added"].clone(),
            r["removed"].clone(),
            r["changed"].clone()
        ),
        (json!(["new"]), json!(["gone"]), json!(["edit"]))
    );
    w.state(&sb, "edit", "running");
    sb.wait_state("new", "running");
    // A removed service goes once its run is over (in the pass that says it stopped).
    if !w
        .seen
        .iter()
        .any(|e| e["service"] == "gone" && e["to"] == "stopped")
    {
        w.until(&sb, |e| e["service"] == "gone" && e["to"] == "stopped");
    }
    assert_eq!(
        sb.status("same")["pid"],
        same,
        "an unchanged service keeps running"
    );
    assert_ne!(sb.status("edit")["pid"], edit);
    assert_eq!(
        sb.request(json!({"cmd": "status", "service": "gone"}))["error"]["kind"],
        "unknown-service"
    );
    assert!(processes_with_cmdline(&["/bin/sleep", "3602"])
        .iter()
        .all(|p| !alive(*p) || !sb.recorded_groups().contains(p)));
}

#[test]
fn sighup_reloads() {
    let mut sb = Sandbox::new();
    sb.config("");
    sb.start();
    sb.config("[service.late]\ncommand = [\"/bin/sleep\", \"3600\"]\n");
    let mut w = sb.watch();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(sb.supd_pid()), Signal::SIGHUP).expect("HUP");
    w.state(&sb, "late", "running");
}

#[test]
fn sigterm_stops_services_in_reverse_order_and_exits_0() {
    let mut sb = Sandbox::new();
    let order = sb.path("order");
    let svc = |name: &str| {
        sb.script(&format!("{name}.sh"), &format!("trap 'echo {name} >> {}; exit 0' TERM\necho >&3\nwhile :; do /bin/sleep 1 & wait; done", order.display()))
    };
    let (db, app, web) = (svc("db"), svc("app"), svc("web"));
    sb.config(&format!(
        "[service.db]\ncommand = [\"{db}\"]\nready = \"fd:3\"\n\n[service.app]\ncommand = [\"{app}\"]\nready = \"fd:3\"\nafter = [\"db\"]\n\n\
         [service.web]\ncommand = [\"{web}\"]\nready = \"fd:3\"\nafter = [\"app\"]\n"
    ));
    sb.start();
    sb.wait_state("web", "running");
    let status = sb.stop_supd(Signal::SIGTERM);
    assert_eq!(status.code(), Some(0), "{}", sb.supd_log());
    let text = std::fs::read_to_string(&order).expect("order file");
    assert_eq!(text.lines().collect::<Vec<_>>(), ["web", "app", "db"]);
}

#[test]
fn admin_down_survives_a_restart_of_supd() {
    let mut sb = Sandbox::new();
    sb.config("[service.a]\ncommand = [\"/bin/sleep\", \"3600\"]\n\n[service.b]\ncommand = [\"/bin/sleep\", \"3601\"]\n");
    sb.start();
    sb.wait_state("a", "running");
    let st = sb.ok(json!({"cmd": "stop", "service": "a"}));
    assert_eq!(
        (st["state"].clone(), st["want"].clone()),
        (json!("stopped"), json!("down"))
    );
    sb.stop_supd(Signal::SIGTERM);
    sb.start();
    sb.wait_state("b", "running");
    assert_eq!(sb.status("a")["state"], "stopped");
    sb.ok(json!({"cmd": "start", "service": "a"}));
    sb.wait_state("a", "running");
}

#[test]
fn outside_pid_1_orphans_of_services_are_adopted_and_reaped() {
    let mut sb = Sandbox::new();
    let orphan_pid = sb.path("orphan.pid");
    let fifo = sb.path("release");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    // The subshell exits at once: its child is orphaned, and waits on the fifo.
    let script = sb.script(
        "orphaner.sh",
        &format!(
            "( sh -c 'echo $$ > {p}.tmp; mv {p}.tmp {p}; read x < {f}' & )\nexec /bin/sleep 3600",
            p = orphan_pid.display(),
            f = fifo.display()
        ),
    );
    sb.config(&format!("[service.o]\ncommand = [\"{script}\"]\n"));
    sb.start();
    sb.wait_state("o", "running");
    let start = std::time::Instant::now();
    while !orphan_pid.exists() {
        assert!(start.elapsed() < DEADLINE, "the orphan never wrote its pid");
        sb.wait_state("o", "running");
    }
    let pid: i32 = std::fs::read_to_string(&orphan_pid)
        .expect("pid")
        .trim()
        .parse()
        .expect("pid");
    // Its parent is gone: the orphan belongs to supd, the subreaper, not to init.
    let mut parent = sup::proc::stat(pid).map(|s| s.ppid);
    let end = std::time::Instant::now() + DEADLINE;
    while parent != Some(sb.supd_pid()) {
        assert!(parent.is_some(), "the orphan is gone early");
        assert!(
            std::time::Instant::now() < end,
            "the orphan's parent is {parent:?}, not supd {}",
            sb.supd_pid()
        );
        sb.status("o"); // a round trip, not a guessed sleep: the subshell is exiting
        parent = sup::proc::stat(pid).map(|s| s.ppid);
    }
    std::fs::write(&fifo, "go\n").expect("release the orphan");
    assert!(wait_exit(pid, DEADLINE).is_some());
    // Its SIGCHLD reached supd before this request: after the answer it is reaped.
    sb.ok(serde_json::json!({"cmd": "hello"}));
    assert!(
        sup::proc::stat(pid).is_none(),
        "the orphan was left a zombie"
    );
}
