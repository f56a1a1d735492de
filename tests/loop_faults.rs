//! The event loop under attack (issue 15's loop: slots touched, indices synced per turn,
//! leaders reaped by pidfd, a scan of all children owed after a SIGCHLD of a watched
//! leader). Scenarios that could miss a touch, lose an event, route an fd to the wrong
//! service, spin the loop, or leave a service never started or never reaped. Debug
//! builds check the indices after each turn: a failed check re-executes supd, which
//! each test looks for in supd's log. After each scenario supd must sleep: its CPU time
//! over a second of idleness stays near zero.

mod common;
use common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// supd's CPU time (user + system) in clock ticks, and its voluntary context switches.
fn cpu_of(pid: i32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command (which may hold spaces): state is field 3; utime 14, stime 15.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let vol = status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches");
    (ticks, vol)
}

/// Over a second in which nothing happens, `pid` (supd) uses under 50 ms of CPU and
/// hardly wakes. The second is the measurement itself, not a wait for an event. Up to
/// three seconds are looked at, and one idle second is enough: the end of what a
/// scenario set going (an owed scan within a second, the log writer, a late reap) may
/// spill into the first on a loaded machine, while a spinning loop fails all three.
fn assert_idle(sb: &Sandbox, pid: i32, what: &str) {
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (t0, v0) = cpu_of(pid);
        assert!(
            wait_exit(pid, Duration::from_secs(1)).is_none(),
            "{what}: supd exited\n{}",
            sb.supd_log()
        );
        let (t1, v1) = cpu_of(pid);
        let ms = (t1 - t0) * 1000 / hz;
        if ms < 50 && v1 - v0 <= 5 {
            return;
        }
        seen.push((ms, v1 - v0));
    }
    panic!(
        "{what}: supd was not idle in any of three seconds of idleness (ms of CPU, wake-ups): {seen:?}\n{}",
        tail(&sb.supd_log())
    );
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(80)..].join("\n")
}

/// Each panic in supd's log with its message (the lines up to its backtrace).
fn panics(log: &str) -> String {
    let mut out = Vec::new();
    let mut lines = log.lines();
    while let Some(l) = lines.next() {
        if l.contains("panicked at") {
            out.push(l);
            out.extend(
                lines
                    .by_ref()
                    .take_while(|m| !m.contains("stack backtrace")),
            );
        }
    }
    out.join("\n")
}

/// No debug check failed (a panic re-executes supd).
fn assert_no_panic(sb: &Sandbox) {
    let log = sb.supd_log();
    assert!(
        !log.contains("panicked"),
        "supd panicked:\n{}",
        panics(&log)
    );
}

/// Every service's status, by name.
fn all(sb: &Sandbox) -> BTreeMap<String, Value> {
    let a = sb.ok(json!({"cmd": "status"}));
    a["services"]
        .as_array()
        .expect("services")
        .iter()
        .map(|s| (s["name"].as_str().expect("name").to_string(), s.clone()))
        .collect()
}

fn pid_of(v: &Value) -> Option<i32> {
    v["pid"].as_i64().map(|p| p as i32)
}

/// Waits until `pred` holds of every service's status (asking supd again on each event
/// of the watch stream, or every 50 ms when none comes); returns the statuses.
fn wait_all(
    sb: &Sandbox,
    what: &str,
    pred: impl Fn(&BTreeMap<String, Value>) -> bool,
) -> BTreeMap<String, Value> {
    let mut w = sb.watch();
    let end = Instant::now() + DEADLINE;
    loop {
        let now = all(sb);
        if pred(&now) {
            return now;
        }
        assert!(
            Instant::now() < end,
            "{what}: not within {DEADLINE:?}; statuses:\n{:#?}\n{}",
            now.values()
                .map(|s| format!(
                    "{} {} pid {} (alive: {}) restarts {} {}",
                    s["name"],
                    s["state"],
                    s["pid"],
                    pid_of(s).is_some_and(alive),
                    s["restarts"],
                    s["reason"]
                ))
                .collect::<Vec<_>>(),
            tail(&sb.supd_log())
        );
        w.next_within(Duration::from_millis(50));
    }
}

fn running(s: &Value) -> bool {
    s["state"] == "running" && pid_of(s).is_some_and(alive)
}

/// A check command whose exit comes with another service's: the check kills that
/// service's leader and exits at once, so both SIGCHLDs are likely folded into one that
/// tells of the leader. The check must still be reaped in time, not found by the scan
/// owed a second later (its timeout is shorter): the checked service stays healthy.
#[test]
fn a_check_command_exiting_with_a_leader_is_not_timed_out() {
    let mut sb = Sandbox::new();
    let pidfile = sb.path("victim.pid");
    let victim = sb.script(
        "victim.sh",
        &format!(
            "echo $$ > {p}.tmp; mv {p}.tmp {p}\nexec /bin/sleep 3600",
            p = pidfile.display()
        ),
    );
    let check = sb.script(
        "check.sh",
        &format!(
            "p=$(cat {} 2>/dev/null) && kill -9 $p 2>/dev/null\nexit 0",
            pidfile.display()
        ),
    );
    sb.config(&format!(
        r#"
[service.victim]
command = ["{victim}"]
restart_delay = "10ms"
restart_delay_max = "10ms"
crash_loop = {{ restarts = 100000, window = "1m" }}

[service.checked]
command = ["/bin/sleep", "3600"]
health = {{ command = ["{check}"], interval = "150ms", timeout = "700ms", failures = 1 }}
crash_loop = {{ restarts = 100000, window = "1m" }}
"#
    ));
    sb.start();
    let first = sb.wait_state("checked", "running");
    // Twenty kills by the check, each coinciding with the check's own exit.
    wait_all(&sb, "the victim killed 20 times", |s| {
        s["victim"]["restarts"].as_u64().unwrap_or(0) >= 20
    });
    let st = sb.status("checked");
    assert_eq!(
        (
            st["pid"].clone(),
            st["restarts"].clone(),
            st["health"].clone()
        ),
        (first["pid"].clone(), json!(0), json!("healthy")),
        "the checked service failed its check: {st}\n{}",
        tail(&sb.supd_log())
    );
    assert_no_panic(&sb);
}

/// The same, made certain: supd is stopped (SIGSTOP) while a service's leader exits and
/// then a check command of another service exits, so the kernel holds one SIGCHLD for
/// both, telling of the leader. The check (timeout 800ms) must be reaped when supd runs
/// again, not a second later by the owed scan of all children.
#[test]
fn a_check_exit_folded_into_a_leaders_sigchld_is_reaped_at_once() {
    let mut sb = Sandbox::new();
    let dir = sb.dir.display().to_string();
    let check = sb.script(
        "check.sh",
        &format!("touch {dir}/check-$$\nwhile [ ! -e {dir}/go ]; do /bin/sleep 0.01; done\nexit 0"),
    );
    sb.config(&format!(
        r#"
[service.victim]
command = ["/bin/sleep", "3600"]
restart_delay = "0s"

[service.checked]
command = ["/bin/sleep", "3600"]
health = {{ command = ["{check}"], interval = "1h", timeout = "800ms", failures = 1 }}
"#
    ));
    sb.start();
    let mut w = sb.watch();
    let victim = pid_of(&sb.wait_state("victim", "running")).expect("victim pid");
    let marker = files::wait_file_named(&sb.dir, "check-");
    let check_pid: i32 = marker["check-".len()..].parse().expect("check pid");
    let supd = nix::unistd::Pid::from_raw(sb.supd_pid());
    nix::sys::signal::kill(supd, nix::sys::signal::Signal::SIGSTOP).expect("STOP supd");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim),
        nix::sys::signal::Signal::SIGKILL,
    );
    let victim_gone = wait_exit(victim, DEADLINE).is_some();
    std::fs::write(sb.path("go"), "").expect("go");
    let check_gone = wait_exit(check_pid, DEADLINE).is_some();
    nix::sys::signal::kill(supd, nix::sys::signal::Signal::SIGCONT).expect("CONT supd");
    assert!(
        victim_gone && check_gone,
        "the victim or the check did not exit"
    );
    let e = w.until(&sb, |e| e["event"] == "health" && e["service"] == "checked");
    assert_eq!(
        e["to"],
        "healthy",
        "the check was taken for timed out: {e}\n{}",
        tail(&sb.supd_log())
    );
    assert_no_panic(&sb);
}

/// 60 services with captured output (to files and to followers), killed all at once:
/// every one restarts with a new pid, none is left unreaped; then supd sleeps.
#[test]
fn sixty_killed_at_once_all_restart_and_supd_then_sleeps() {
    let mut sb = Sandbox::new();
    let chatty = sb.script(
        "chatty.sh",
        "i=0\nwhile [ $i -lt 20 ]; do echo \"line $i of $$\"; echo \"err $i\" >&2; i=$((i+1)); done\nexec /bin/sleep 3600",
    );
    let mut cfg = String::new();
    for i in 0..60 {
        let log = ["file", "inherit", "null"][i % 3];
        cfg.push_str(&format!(
            "[service.s{i:02}]\ncommand = [\"{chatty}\"]\nlog = \"{log}\"\nrestart_delay = \"0s\"\n\n"
        ));
    }
    sb.config(&cfg);
    sb.start();
    let before = wait_all(&sb, "all 60 up", |s| {
        s.len() == 60 && s.values().all(running)
    });
    let pids: Vec<i32> = before.values().filter_map(pid_of).collect();
    for round in 0..3 {
        let now = all(&sb);
        let pids: Vec<i32> = now.values().filter_map(pid_of).collect();
        for p in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        wait_all(&sb, &format!("round {round}: all 60 restarted"), |s| {
            s.values()
                .all(|x| running(x) && pid_of(x).is_some_and(|p| !pids.contains(&p)))
        });
    }
    for p in &pids {
        assert!(
            sup::proc::stat(*p).is_none(),
            "{p} is left as a zombie\n{}",
            tail(&sb.supd_log())
        );
    }
    assert_idle(&sb, sb.supd_pid(), "after 3 rounds of 60 kills");
    assert_no_panic(&sb);
}

/// Reloads that remove a running service and add it back under the same name before it
/// is down, change `instances`, and change a service waiting out a long backoff: each
/// ends as the config says, and supd sleeps after.
#[test]
fn reloads_remove_readd_and_resize_while_services_run_or_wait() {
    let mut sb = Sandbox::new();
    // Ignores TERM: a removal keeps it stopping for its stop_timeout.
    let stubborn = sb.script(
        "stubborn.sh",
        "trap '' TERM\nwhile :; do /bin/sleep 1; done",
    );
    let config = |n: usize, with_stubborn: bool, crash: &str| {
        let mut c = format!(
            "[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\ninstances = {n}\n\n\
             [service.crash]\ncommand = [\"/bin/sh\", \"-c\", \"{crash}\"]\nrestart_delay = \"1h\"\nrestart_delay_max = \"1h\"\n\n\
             [service.after_web]\ncommand = [\"/bin/sleep\", \"3600\"]\nafter = [\"web\"]\n\n"
        );
        if with_stubborn {
            c.push_str(&format!(
                "[service.stubborn]\ncommand = [\"{stubborn}\"]\nstop_timeout = \"1500ms\"\n\n"
            ));
        }
        c
    };
    sb.config(&config(3, true, "exit 1"));
    sb.start();
    wait_all(&sb, "first config up", |s| {
        ["web@0", "web@1", "web@2", "after_web", "stubborn"]
            .iter()
            .all(|n| s.get(*n).is_some_and(running))
            && s["crash"]["state"] == "backoff"
    });
    let stub1 = pid_of(&sb.status("stubborn")).expect("pid");
    // Remove the stubborn one (it keeps stopping) and grow web; then add it back at once.
    sb.config(&config(5, false, "exit 1"));
    let a = sb.ok(json!({"cmd": "reload"}));
    assert_eq!(a["removed"], json!(["stubborn"]), "{a}");
    assert_eq!(sb.status("stubborn")["state"], "stopping");
    sb.config(&config(2, true, "exec /bin/sleep 3600"));
    let a = sb.ok(json!({"cmd": "reload"}));
    assert!(
        a["changed"]
            .as_array()
            .expect("changed")
            .contains(&json!("crash")),
        "{a}"
    );
    // The old stubborn process is killed after its stop_timeout; a new one runs.
    assert!(wait_exit(stub1, DEADLINE).is_some(), "old stubborn left");
    let s = wait_all(&sb, "second config up", |s| {
        ["web@0", "web@1", "after_web", "stubborn", "crash"]
            .iter()
            .all(|n| s.get(*n).is_some_and(running))
            && !s.contains_key("web@2")
            && !s.contains_key("web@3")
            && !s.contains_key("web@4")
    });
    assert_ne!(pid_of(&s["stubborn"]), Some(stub1));
    // Down to one instance.
    sb.config(&config(1, true, "exec /bin/sleep 3600"));
    sb.ok(json!({"cmd": "reload"}));
    wait_all(&sb, "web@1 gone", |s| !s.contains_key("web@1"));
    let supd = sb.supd_pid();
    assert_idle(&sb, supd, "after the reloads");
    // Kill each and see it come back: nothing lost its pidfd in the reloads.
    let now = all(&sb);
    for (n, s) in &now {
        if let Some(p) = pid_of(s) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = n;
        }
    }
    wait_all(&sb, "all back after kills", |s| {
        s.iter().all(|(n, x)| {
            (n == "crash" && x["state"] == "backoff")
                || (running(x) && pid_of(x) != pid_of(&now[n]))
        })
    });
    assert_no_panic(&sb);
}

/// A diamond of `after` with readiness of every kind (fd:3, notify, started), a
/// dependency that fails and is then started by hand, and restarts of the root.
#[test]
fn a_diamond_with_readiness_and_a_failed_dependency_started_by_hand() {
    let mut sb = Sandbox::new();
    let fd3 = sb.script(
        "fd3.sh",
        "/bin/sleep 0.2\necho ready >&3\nexec 3>&-\nexec /bin/sleep 3600",
    );
    let notify = sb.file(
        "notify.py",
        "#!/usr/bin/env python3\nimport os, socket, time\ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
         a = os.environ['NOTIFY_SOCKET']\ns.connect(a)\ns.send(b'STATUS=warming')\ntime.sleep(0.1)\n\
         s.send(b'READY=1\\nSTATUS=up')\nwhile True:\n    time.sleep(0.05)\n    s.send(b'WATCHDOG=1')\n",
    );
    let flag = sb.path("fixed");
    let flaky = sb.script(
        "flaky.sh",
        &format!("[ -e {} ] || exit 1\nexec /bin/sleep 3600", flag.display()),
    );
    sb.config(&format!(
        r#"
[service.root]
command = ["{fd3}"]
ready = "fd:3"
restart_delay = "0s"

[service.left]
command = ["{notify}"]
ready = "notify"
watchdog = "2s"
after = ["root"]

[service.right]
command = ["/bin/sleep", "3600"]
after = ["root"]

[service.bottom]
command = ["/bin/sleep", "3600"]
after = ["left", "right", "flaky"]

[service.flaky]
command = ["{flaky}"]
restart = "never"

[service.loner]
command = ["/bin/sleep", "3600"]
after = ["bottom"]
"#
    ));
    sb.start();
    let s = wait_all(&sb, "all but flaky's dependents up", |s| {
        ["root", "left", "right"].iter().all(|n| running(&s[*n])) && s["flaky"]["state"] == "failed"
    });
    assert_eq!(s["bottom"]["state"], "stopped", "{:?}", s["bottom"]);
    std::fs::write(&flag, "").expect("flag");
    let out = sb.supctl(&["start", "flaky"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    wait_all(&sb, "the whole diamond up", |s| s.values().all(running));
    // The root restarts (killed) three times; the others stay up and the tree holds.
    for _ in 0..3 {
        let p = pid_of(&sb.status("root")).expect("root pid");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
        wait_all(&sb, "root back", |s| {
            running(&s["root"]) && pid_of(&s["root"]) != Some(p)
        });
    }
    wait_all(&sb, "all up after the root's restarts", |s| {
        s.values().all(running)
    });
    // Stop and start many at once.
    let names = ["loner", "bottom", "left", "right", "root", "flaky"];
    let mut args = vec!["stop"];
    args.extend(names);
    assert_eq!(sb.supctl(&args).status.code(), Some(0));
    wait_all(&sb, "all stopped", |s| {
        s.values()
            .all(|x| x["state"] == "stopped" && x["pid"].is_null())
    });
    let mut args = vec!["start"];
    args.extend(names);
    let out = sb.supctl(&args);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    wait_all(&sb, "all up again", |s| s.values().all(running));
    let mut args = vec!["restart"];
    args.extend(names);
    let out = sb.supctl(&args);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    wait_all(&sb, "all up after restart", |s| s.values().all(running));
    assert_no_panic(&sb);
}

/// `reexec` with running services: their later exits are still reaped and restarted.
#[test]
fn after_a_reexec_exits_are_still_reaped_and_restarted() {
    let mut sb = Sandbox::new();
    let mut cfg = String::new();
    for i in 0..10 {
        cfg.push_str(&format!(
            "[service.r{i}]\ncommand = [\"/bin/sleep\", \"3600\"]\nrestart_delay = \"0s\"\n\n"
        ));
    }
    cfg.push_str(
        "[service.checked]\ncommand = [\"/bin/sleep\", \"3600\"]\nhealth = { command = [\"/bin/true\"], interval = \"100ms\", timeout = \"2s\", failures = 1 }\n",
    );
    sb.config(&cfg);
    sb.start();
    let mut before = wait_all(&sb, "all up", |s| s.len() == 11 && s.values().all(running));
    for round in 0..2 {
        let out = sb.supctl(&["reexec"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}\n{}", sb.supd_log());
        let now = all(&sb);
        for (n, s) in &now {
            assert_eq!(
                pid_of(s),
                pid_of(&before[n]),
                "{n} changed pid over a reexec"
            );
        }
        let victims: Vec<i32> = now
            .iter()
            .filter(|(n, _)| n.starts_with('r'))
            .filter_map(|(_, s)| pid_of(s))
            .collect();
        for p in &victims {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let s = wait_all(&sb, &format!("round {round}: restarted"), |s| {
            s.iter()
                .filter(|(n, _)| n.starts_with('r'))
                .all(|(_, x)| running(x) && pid_of(x).is_some_and(|p| !victims.contains(&p)))
        });
        for p in &victims {
            assert!(sup::proc::stat(*p).is_none(), "{p} left unreaped");
        }
        assert_eq!(s["checked"]["health"], "healthy", "{:?}", s["checked"]);
        before = s;
    }
    assert_no_panic(&sb);
}

/// supd as PID 1 of a PID namespace: services whose whole process group dies at once
/// (`kill -9 0`: the leader and a child it started), leaving the child to PID 1 as a
/// zombie whose SIGCHLD may fold into the leader's; and orphans double-forked by
/// another service. Every run must be reaped and restarted, no zombie left.
#[test]
fn as_pid_1_groups_dying_at_once_are_reaped_and_restarted() {
    if !is_root() {
        eprintln!("skipped: needs root for unshare --pid");
        return;
    }
    let mut sb = Sandbox::new();
    let suicide = sb.script("suicide.sh", "/bin/sleep 3600 &\n/bin/sleep 0.2\nkill -9 0");
    let forker = sb.script(
        "forker.sh",
        "( /bin/sleep 0.1 & )\n( /bin/sleep 0.1 & )\n/bin/sleep 0.05\nexit 1",
    );
    let mut cfg = String::new();
    for i in 0..4 {
        cfg.push_str(&format!(
            "[service.group{i}]\ncommand = [\"{suicide}\"]\nrestart_delay = \"0s\"\nrestart_delay_max = \"0s\"\ncrash_loop = {{ restarts = 100000, window = \"1m\" }}\n\n"
        ));
    }
    cfg.push_str(&format!(
        "[service.forker]\ncommand = [\"{forker}\"]\nrestart_delay = \"0s\"\nrestart_delay_max = \"0s\"\ncrash_loop = {{ restarts = 100000, window = \"1m\" }}\n"
    ));
    sb.config(&cfg);
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child", SUPD]);
    sb.start_with(cmd, &["-c"]);
    let unshare = sb.supd_pid();
    let init: i32 = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
        .expect("children")
        .split_whitespace()
        .next()
        .expect("a child")
        .parse()
        .expect("pid");
    let t0 = Instant::now();
    wait_all(&sb, "each group restarted 8 times", |s| {
        (0..4).all(|i| s[&format!("group{i}")]["restarts"].as_u64().unwrap_or(0) >= 8)
            && s["forker"]["restarts"].as_u64().unwrap_or(0) >= 8
    });
    eprintln!("8 restarts of 4 groups (0.2s runs) took {:?}", t0.elapsed());
    sb.ok(json!({"cmd": "stop", "service": "forker"}));
    for i in 0..4 {
        sb.ok(json!({"cmd": "stop", "service": format!("group{i}")}));
    }
    // What is left of the orphans ends within 0.1s; then none may stay a zombie.
    let end = Instant::now() + DEADLINE;
    loop {
        let zombies: Vec<i32> =
            std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .filter(|p: &i32| sup::proc::stat(*p).is_some_and(|s| s.state == 'Z'))
                .collect();
        let kids = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
            .unwrap_or_default();
        // supd's own helpers (its spawner, its log writer: the run markers go to the
        // services' log files) run its image; anything else is what a run left.
        let supd_image = std::fs::canonicalize(SUPD).ok();
        let left = kids
            .split_whitespace()
            .filter(|p| std::fs::read_link(format!("/proc/{p}/exe")).ok() != supd_image)
            .count();
        if zombies.is_empty() && left == 0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "PID 1 keeps zombies {zombies:?} (children {kids})\n{}",
            tail(&sb.supd_log())
        );
        sb.ok(json!({"cmd": "hello"}));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_idle(&sb, init, "PID 1 after the storm");
    assert_no_panic(&sb);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("TERM to PID 1");
    assert!(wait_exit(unshare, DEADLINE).is_some(), "PID 1 did not stop");
    let status = sb.supd.take().expect("unshare").wait().expect("wait");
    assert_eq!(status.code(), Some(0), "{}", tail(&sb.supd_log()));
}

/// Leader-only services in an `after` chain with a plain one after them: a grant starts
/// the chain in order, its end stops them, a new grant starts them again; meanwhile an
/// unrelated service crashes and restarts. supd sleeps once a grant holds.
#[test]
fn leader_only_chains_follow_grants_and_supd_sleeps_while_one_holds() {
    let mut sb = Sandbox::new();
    let fd3 = sb.script(
        "fd3.sh",
        "/bin/sleep 0.1\necho ready >&3\nexec /bin/sleep 3600",
    );
    sb.config(&format!(
        r#"
[lease.engine]

[service.e1]
command = ["{fd3}"]
ready = "fd:3"
leader_only = "engine"

[service.e2]
command = ["{fd3}"]
ready = "fd:3"
leader_only = "engine"
after = ["e1"]

[service.plain]
command = ["/bin/sleep", "3600"]
after = ["e2"]

[service.crashy]
command = ["/bin/sh", "-c", "/bin/sleep 0.05; exit 1"]
restart_delay = "0s"
restart_delay_max = "0s"
crash_loop = {{ restarts = 100000, window = "1m" }}
"#
    ));
    sb.start();
    let s = all(&sb);
    assert_eq!(s["e1"]["state"], "stopped", "{:?}", s["e1"]);
    for round in 0..3 {
        sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": round + 1, "valid_for": "1500ms"}));
        wait_all(&sb, &format!("round {round}: chain up"), |s| {
            ["e1", "e2", "plain"].iter().all(|n| running(&s[*n]))
        });
        wait_all(&sb, &format!("round {round}: grant ran out"), |s| {
            ["e1", "e2"].iter().all(|n| s[*n]["state"] == "stopped")
        });
    }
    sb.ok(json!({"cmd": "stop", "service": "crashy"}));
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 9, "valid_for": "1h"}));
    wait_all(&sb, "chain up for good", |s| {
        ["e1", "e2", "plain"].iter().all(|n| running(&s[*n]))
    });
    assert_idle(&sb, sb.supd_pid(), "with a grant held");
    assert_no_panic(&sb);
}

/// Socket checks (TCP, HTTP) of services that restart, against a listener the test runs:
/// each check's socket goes with its run, the next run's is watched anew.
#[test]
fn socket_checks_of_restarting_services_keep_their_sockets_apart() {
    use std::io::{Read, Write};
    let mut sb = Sandbox::new();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    listener.set_nonblocking(true).expect("nonblocking");
    let server = std::thread::spawn(move || {
        let mut n = 0u64;
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut c, _)) => {
                    n += 1;
                    // Every third answer is slow: its check runs while its service restarts.
                    let slow = n % 3 == 0;
                    std::thread::spawn(move || {
                        let _ = c.set_nonblocking(false);
                        let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
                        let mut buf = [0u8; 512];
                        let _ = c.read(&mut buf);
                        if slow {
                            std::thread::sleep(Duration::from_millis(150));
                        }
                        let _ = c.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n");
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    let mut cfg = String::new();
    for i in 0..6 {
        let check = if i % 2 == 0 {
            format!("http = \"http://127.0.0.1:{port}/h{i}\"")
        } else {
            format!("tcp = \"127.0.0.1:{port}\"")
        };
        cfg.push_str(&format!(
            "[service.c{i}]\ncommand = [\"/bin/sh\", \"-c\", \"/bin/sleep 0.{}; exit 1\"]\nrestart_delay = \"0s\"\nrestart_delay_max = \"0s\"\ncrash_loop = {{ restarts = 100000, window = \"1m\" }}\nhealth = {{ {check}, interval = \"50ms\", timeout = \"1s\", failures = 100 }}\n\n",
            3 + i
        ));
    }
    cfg.push_str(&format!(
        "[service.steady]\ncommand = [\"/bin/sleep\", \"3600\"]\nhealth = {{ http = \"http://127.0.0.1:{port}/steady\", interval = \"50ms\", timeout = \"1s\", failures = 1 }}\n"
    ));
    sb.config(&cfg);
    sb.start();
    let first = sb.wait_state("steady", "running");
    wait_all(&sb, "each restarted 5 times", |s| {
        (0..6).all(|i| s[&format!("c{i}")]["restarts"].as_u64().unwrap_or(0) >= 5)
    });
    let st = sb.status("steady");
    assert_eq!(
        (
            st["pid"].clone(),
            st["restarts"].clone(),
            st["health"].clone()
        ),
        (first["pid"].clone(), json!(0), json!("healthy")),
        "{st}\n{}",
        tail(&sb.supd_log())
    );
    for i in 0..6 {
        sb.ok(json!({"cmd": "stop", "service": format!("c{i}")}));
    }
    sb.ok(json!({"cmd": "stop", "service": "steady"}));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    server.join().expect("server");
    assert_idle(&sb, sb.supd_pid(), "after the checks stopped");
    assert_no_panic(&sb);
}

/// Notify services (STATUS=, READY=1, WATCHDOG=1) restarting fast beside a chain after
/// one of them, and one that stops pinging its watchdog: each restart's socket is
/// watched anew; the pinging ones stay healthy.
#[test]
fn notify_services_restarting_fast_keep_their_sockets_and_watchdogs() {
    let mut sb = Sandbox::new();
    let py = |name: &str, life: &str, pings: bool| {
        sb.file(
            name,
            &format!(
                "#!/usr/bin/env python3\nimport os, socket, time\ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
                 s.connect(os.environ['NOTIFY_SOCKET'])\ns.send(b'STATUS=warming')\n\
                 s.send(b'READY=1\\nSTATUS=up %d' % os.getpid())\nend = time.time() + {life}\n\
                 while time.time() < end:\n    time.sleep(0.02)\n    {}\n",
                if pings { "s.send(b'WATCHDOG=1')" } else { "pass" }
            ),
        )
    };
    let fast = py("fast.py", "0.15", true);
    let steady = py("steady.py", "3600", true);
    let silent = py("silent.py", "3600", false);
    let mut cfg = String::new();
    for i in 0..5 {
        cfg.push_str(&format!(
            "[service.n{i}]\ncommand = [\"{fast}\"]\nready = \"notify\"\nwatchdog = \"1s\"\nrestart_delay = \"0s\"\nrestart_delay_max = \"0s\"\ncrash_loop = {{ restarts = 100000, window = \"1m\" }}\n\n"
        ));
    }
    cfg.push_str(&format!(
        "[service.steady]\ncommand = [\"{steady}\"]\nready = \"notify\"\nwatchdog = \"500ms\"\n\n\
         [service.after_steady]\ncommand = [\"/bin/sleep\", \"3600\"]\nafter = [\"steady\"]\n\n\
         [service.silent]\ncommand = [\"{silent}\"]\nready = \"notify\"\nwatchdog = \"300ms\"\nrestart_delay = \"0s\"\nrestart_delay_max = \"0s\"\ncrash_loop = {{ restarts = 100000, window = \"1m\" }}\n"
    ));
    sb.config(&cfg);
    sb.start();
    let first = sb.wait_state("steady", "running");
    let s = wait_all(&sb, "fast ones restarted 10 times, silent 3", |s| {
        (0..5).all(|i| s[&format!("n{i}")]["restarts"].as_u64().unwrap_or(0) >= 10)
            && s["silent"]["restarts"].as_u64().unwrap_or(0) >= 3
            && running(&s["after_steady"])
    });
    assert_eq!(
        (pid_of(&s["steady"]), s["steady"]["restarts"].clone()),
        (pid_of(&first), json!(0)),
        "{:?}\n{}",
        s["steady"],
        tail(&sb.supd_log())
    );
    assert_eq!(s["steady"]["health"], "healthy", "{:?}", s["steady"]);
    let status = s["steady"]["status"].as_str().unwrap_or("").to_string();
    assert_eq!(status, format!("up {}", pid_of(&first).expect("pid")));
    let out = sb.supctl(&[
        "stop",
        "n0",
        "n1",
        "n2",
        "n3",
        "n4",
        "silent",
        "steady",
        "after_steady",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    wait_all(&sb, "all stopped", |s| {
        s.values().all(|x| x["state"] == "stopped")
    });
    assert_idle(&sb, sb.supd_pid(), "after the notify services stopped");
    assert_no_panic(&sb);
}

/// A five-long `after` chain restarted and stopped as a whole, many times over, with
/// `supctl restart` of all at once; then supd stops the chain in reverse order on
/// SIGTERM and exits 0.
#[test]
fn a_chain_restarted_as_a_whole_and_shut_down_in_order() {
    let mut sb = Sandbox::new();
    let order = sb.path("order");
    let svc = sb.script(
        "svc.sh",
        &format!(
            "trap 'echo stop $1 >> {o}; exit 0' TERM\necho start $1 >> {o}\n/bin/sleep 0.05\necho ready >&3\nexec 3>&-\nwhile :; do /bin/sleep 1 & wait $!; done",
            o = order.display()
        ),
    );
    let mut cfg = String::new();
    for i in 0..5 {
        let after = if i == 0 {
            String::new()
        } else {
            format!("after = [\"k{}\"]\n", i - 1)
        };
        cfg.push_str(&format!(
            "[service.k{i}]\ncommand = [\"{svc}\", \"k{i}\"]\nready = \"fd:3\"\n{after}\n"
        ));
    }
    sb.config(&cfg);
    sb.start();
    let names: Vec<String> = (0..5).map(|i| format!("k{i}")).collect();
    wait_all(&sb, "chain up", |s| s.values().all(running));
    for round in 0..4 {
        let mut args = vec!["restart"];
        // Named against the chain's order.
        args.extend(names.iter().rev().map(String::as_str));
        let out = sb.supctl(&args);
        assert_eq!(out.status.code(), Some(0), "round {round}: {out:?}");
        wait_all(&sb, &format!("round {round}: chain up again"), |s| {
            s.values().all(running)
        });
    }
    std::fs::write(&order, "").expect("clear order");
    let status = sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(status.code(), Some(0), "{}", tail(&sb.supd_log()));
    let text = std::fs::read_to_string(&order).expect("order");
    let stops: Vec<&str> = text.lines().filter(|l| l.starts_with("stop")).collect();
    assert_eq!(
        stops,
        ["stop k4", "stop k3", "stop k2", "stop k1", "stop k0"],
        "{text}"
    );
    assert_no_panic(&sb);
}

/// `reexec` while services are being started: a service spawned just before the exec,
/// whose report of its own exec the old image had not read, must not stay `starting`
/// (it would be killed as not ready after `ready_timeout`).
#[test]
fn a_reexec_among_starts_leaves_no_service_starting() {
    let mut sb = Sandbox::new();
    let mut cfg = String::new();
    for i in 0..30 {
        cfg.push_str(&format!(
            "[service.s{i:02}]\ncommand = [\"/bin/sleep\", \"3600\"]\nready_timeout = \"1h\"\n\n"
        ));
    }
    sb.config(&cfg);
    sb.start();
    wait_all(&sb, "all up", |s| s.values().all(running));
    let names: Vec<String> = (0..30).map(|i| format!("s{i:02}")).collect();
    for round in 0..15 {
        // The reexec's check of the config runs while the restarts are carried out.
        let mut reexec = sb.spawn_reexec();
        let mut c = sb.client();
        c.send_raw(
            format!(
                "{}\n",
                json!({"id": 1, "cmd": "restart", "services": names})
            )
            .as_bytes(),
        );
        let done = wait_exit(reexec.id() as i32, DEADLINE).is_some();
        if !done {
            let _ = reexec.kill();
        }
        let _ = reexec.wait();
        assert!(done, "supctl reexec did not finish");
        drop(c);
        // Wait for supd to answer again (the new image), then for every service.
        let end = Instant::now() + DEADLINE;
        while std::os::unix::net::UnixStream::connect(&sb.socket).is_err() {
            assert!(Instant::now() < end, "supd does not answer after reexec");
            std::thread::sleep(Duration::from_millis(10));
        }
        wait_all(&sb, &format!("round {round}: all running"), |s| {
            s.values().all(running)
        });
    }
    assert_no_panic(&sb);
}

/// 150 instances (more than a pass starts) with a service after all of them, resized by
/// reloads while some wait out a backoff; a removed service added back under its name
/// while it waits out a backoff; a start that times out (never ready) and one that is
/// ready by `fd:3`. Every timer fires, nothing is left unstarted, supd sleeps after.
#[test]
fn many_instances_resized_with_backoffs_and_ready_timeouts() {
    let mut sb = Sandbox::new();
    let never = sb.script("never.sh", "exec /bin/sleep 3600");
    let config = |n: usize, with_flappy: bool| {
        let mut c = format!(
            "[service.w]\ncommand = [\"/bin/sleep\", \"3600\"]\ninstances = {n}\n\n\
             [service.tail]\ncommand = [\"/bin/sleep\", \"3600\"]\nafter = [\"w\"]\n\n\
             [service.unready]\ncommand = [\"{never}\"]\nready = \"fd:3\"\nready_timeout = \"300ms\"\nrestart_delay = \"200ms\"\nrestart_delay_max = \"200ms\"\ncrash_loop = {{ restarts = 100000, window = \"1m\" }}\n\n"
        );
        if with_flappy {
            c.push_str(
                "[service.flappy]\ncommand = [\"/bin/sh\", \"-c\", \"exit 3\"]\nrestart_delay = \"400ms\"\nrestart_delay_max = \"400ms\"\ncrash_loop = { restarts = 100000, window = \"1m\" }\n\n",
            );
        }
        c
    };
    sb.config(&config(150, true));
    sb.start();
    let up = |n: usize| {
        move |s: &BTreeMap<String, Value>| {
            (0..n).all(|i| s.get(&format!("w@{i}")).is_some_and(running))
                && !s.contains_key(&format!("w@{n}"))
                && s.get("tail").is_some_and(running)
        }
    };
    wait_all(&sb, "150 instances and the tail up", up(150));
    wait_all(
        &sb,
        "unready timed out twice, flappy restarted twice",
        |s| {
            s["unready"]["restarts"].as_u64().unwrap_or(0) >= 2
                && s["flappy"]["restarts"].as_u64().unwrap_or(0) >= 2
        },
    );
    // Remove flappy (in backoff or just started) and grow; then add it back at once.
    sb.config(&config(200, false));
    sb.ok(json!({"cmd": "reload"}));
    sb.config(&config(200, true));
    sb.ok(json!({"cmd": "reload"}));
    wait_all(&sb, "200 instances and the tail up", up(200));
    wait_all(&sb, "flappy back and restarting", |s| {
        s.get("flappy")
            .is_some_and(|f| f["restarts"].as_u64().unwrap_or(0) >= 2)
    });
    sb.config(&config(70, false));
    sb.ok(json!({"cmd": "reload"}));
    wait_all(&sb, "70 instances and the tail up, flappy gone", |s| {
        up(70)(s) && !s.contains_key("flappy")
    });
    let out = sb.supctl(&["stop", "unready"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    wait_all(&sb, "unready stopped", |s| {
        s["unready"]["state"] == "stopped"
    });
    assert_idle(&sb, sb.supd_pid(), "after the resizes");
    assert_no_panic(&sb);
}

/// As PID 1: a service's leader and its child die together while supd is stopped; the
/// child, left to PID 1, is a zombie in the run's group until reaped. The run must
/// drain and the service restart (the time it takes is printed, not asserted).
#[test]
fn as_pid_1_a_group_dying_together_drains_and_restarts() {
    if !is_root() {
        eprintln!("skipped: needs root for unshare --pid");
        return;
    }
    let mut sb = Sandbox::new();
    let svc = sb.script(
        "svc.sh",
        &format!(
            "/bin/sleep 3600 &\necho $! > {d}/child.tmp; mv {d}/child.tmp {d}/child\nexec /bin/sleep 3600",
            d = sb.dir.display()
        ),
    );
    sb.config(&format!(
        "[service.pair]\ncommand = [\"{svc}\"]\nrestart_delay = \"0s\"\n"
    ));
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child", SUPD]);
    sb.start_with(cmd, &["-c"]);
    let unshare = sb.supd_pid();
    let init: i32 = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
        .expect("children")
        .split_whitespace()
        .next()
        .expect("a child")
        .parse()
        .expect("pid");
    let mut took = Vec::new();
    sb.wait_state("pair", "running");
    for _ in 0..5 {
        files::wait_file(&sb.path("child"), |t| !t.is_empty());
        // The leader seen from here: supd's only child in its namespace with a child.
        let kids: Vec<i32> = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
            .expect("children")
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        let leader = kids
            .iter()
            .copied()
            .find(|k| {
                std::fs::read_to_string(format!("/proc/{k}/task/{k}/children"))
                    .is_ok_and(|c| !c.trim().is_empty())
            })
            .expect("the leader, with its child");
        let pgid = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(leader))).expect("pgid");
        let supd = nix::unistd::Pid::from_raw(init);
        let mut w = sb.watch();
        nix::sys::signal::kill(supd, nix::sys::signal::Signal::SIGSTOP).expect("STOP");
        // The next run writes it anew.
        std::fs::remove_file(sb.path("child")).expect("remove child");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(leader),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = wait_exit(leader, DEADLINE);
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        // Both dead (the child a zombie of PID 1), both SIGCHLDs pending as one.
        let t0 = Instant::now();
        nix::sys::signal::kill(supd, nix::sys::signal::Signal::SIGCONT).expect("CONT");
        w.until(&sb, |e| {
            e["event"] == "state" && e["service"] == "pair" && e["to"] == "running"
        });
        took.push(t0.elapsed());
    }
    eprintln!("restart after a group died together, as PID 1: {took:?}");
    assert_no_panic(&sb);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("TERM to PID 1");
    assert!(wait_exit(unshare, DEADLINE).is_some(), "PID 1 did not stop");
    let _ = sb.supd.take().expect("unshare").wait();
}

/// SIGTERM while supd is still starting hundreds of services (a pass cut at its limit
/// asks for the next turn at once): the shutdown that follows waits for the services'
/// stop_timeout without spinning.
#[test]
fn a_shutdown_during_a_burst_of_starts_does_not_spin() {
    let mut sb = Sandbox::new();
    let mut cfg = String::new();
    // t000 is ready once it ignores TERM, and the burst of the 399 others follows it: a
    // TERM before any service ignored it would end them all at once, and supd with
    // them, before the test could look.
    for i in 0..400 {
        let (ready, after) = match i {
            0 => ("echo >&3; ", "ready = \"fd:3\"\n"),
            _ => ("", "after = [\"t000\"]\n"),
        };
        cfg.push_str(&format!(
            "[service.t{i:03}]\ncommand = [\"/bin/sh\", \"-c\", \"trap '' TERM; {ready}exec /bin/sleep 3600\"]\n{after}stop_timeout = \"15s\"\nlog = \"null\"\n\n"
        ));
    }
    sb.config(&cfg);
    sb.start();
    sb.wait_state("t000", "running");
    let supd = sb.supd_pid();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(supd),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("TERM");
    // Every service that was started is being stopped (TERM ignored: they wait for
    // their stop_timeout), none starts any more; t000 runs until they are down.
    let s = wait_all(&sb, "all stopping or stopped", |s| {
        s.iter().all(|(name, x)| {
            x["state"] == "stopping"
                || x["state"] == "stopped"
                || (name.as_str() == "t000" && x["state"] == "running")
        })
    });
    assert_idle(&sb, supd, "shutting down, waiting for stop_timeout");
    // No need to wait for the stop_timeout: ended by pid.
    for p in s.values().filter_map(pid_of) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let status = sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(status.code(), Some(0), "{}", tail(&sb.supd_log()));
}

/// A leader stopped by SIGSTOP (its SIGCHLD tells of a watched leader that has not
/// exited) leaves supd asleep once the owed scan is done; continued and killed, it is
/// reaped and restarted.
#[test]
fn a_stopped_leader_leaves_supd_asleep_and_is_reaped_once_killed() {
    let mut sb = Sandbox::new();
    sb.config(
        "[service.frozen]\ncommand = [\"/bin/sleep\", \"3600\"]\nrestart_delay = \"0s\"\n\n\
         [service.other]\ncommand = [\"/bin/sleep\", \"3600\"]\n",
    );
    sb.start();
    let p = pid_of(&sb.wait_state("frozen", "running")).expect("pid");
    sb.wait_state("other", "running");
    let pid = nix::unistd::Pid::from_raw(p);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("STOP");
    // The owed scan comes within a second; then nothing is left to do.
    sb.ok(json!({"cmd": "hello"}));
    assert!(wait_exit(sb.supd_pid(), Duration::from_millis(1100)).is_none());
    assert_idle(&sb, sb.supd_pid(), "a leader stopped");
    assert_eq!(sb.status("frozen")["pid"], json!(p));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("CONT");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("KILL");
    wait_all(&sb, "frozen restarted", |s| {
        running(&s["frozen"]) && pid_of(&s["frozen"]) != Some(p)
    });
    assert!(sup::proc::stat(p).is_none(), "{p} left unreaped");
    assert_no_panic(&sb);
}

/// `restart` of a service and the two that come after it, one of which takes a while to
/// stop: the quick one must not start again before the service they come after has
/// restarted, or that service, held until both are down at once, would never restart
/// (and the restart would never answer).
#[test]
fn a_restart_of_a_diamond_with_a_slow_stopper_restarts_the_root() {
    let mut sb = Sandbox::new();
    let slow = sb.script(
        "slow.sh",
        "trap '/bin/sleep 0.5; exit 0' TERM\nwhile :; do /bin/sleep 1 & wait $!; done",
    );
    sb.config(&format!(
        r#"
[service.root]
command = ["/bin/sleep", "3600"]

[service.quick]
command = ["/bin/sleep", "3600"]
after = ["root"]

[service.slow]
command = ["{slow}"]
after = ["root"]
"#
    ));
    sb.start();
    let before = wait_all(&sb, "all up", |s| s.values().all(running));
    let out = sb.supctl(&["restart", "root", "quick", "slow"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{out:?}\n{}",
        tail(&sb.supd_log())
    );
    let after = wait_all(&sb, "all up again", |s| s.values().all(running));
    for n in ["root", "quick", "slow"] {
        assert_ne!(
            pid_of(&after[n]),
            pid_of(&before[n]),
            "{n} was not restarted"
        );
    }
    assert_no_panic(&sb);
}

/// 300 services killed at once: more leaders' pidfds ready than one look at the epoll
/// set takes (256), and more starts than one pass makes (64). All restart; supd then
/// sleeps.
#[test]
fn three_hundred_killed_at_once_all_restart() {
    let mut sb = Sandbox::new();
    let mut cfg = String::new();
    for i in 0..300 {
        cfg.push_str(&format!(
            "[service.k{i:03}]\ncommand = [\"/bin/sleep\", \"3600\"]\nrestart_delay = \"0s\"\nlog = \"null\"\n\n"
        ));
    }
    sb.config(&cfg);
    sb.start();
    let before = wait_all(&sb, "all 300 up", |s| {
        s.len() == 300 && s.values().all(running)
    });
    let pids: Vec<i32> = before.values().filter_map(pid_of).collect();
    for p in &pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    wait_all(&sb, "all 300 restarted", |s| {
        s.values()
            .all(|x| running(x) && pid_of(x).is_some_and(|p| !pids.contains(&p)))
    });
    for p in &pids {
        assert!(sup::proc::stat(*p).is_none(), "{p} left unreaped");
    }
    assert_idle(&sb, sb.supd_pid(), "after 300 restarts");
    assert_no_panic(&sb);
}
