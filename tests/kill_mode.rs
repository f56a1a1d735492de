//! `kill_mode`: what a stop, a restart, a crash of the main process and a new supd end
//! of a run. The service's main process starts a child in a session of its own (as sshd
//! does for each ssh session) and one in its process group; for each mode, with and
//! without cgroups, each step says which of them survive. Survivors of a step must
//! survive every later step too (a later stop or a new supd must not end them by the
//! cgroup they share with the next runs). And a main process that forks into the
//! background and exits 0 is named as daemonized, counted as a failure, and what it
//! left is ended.

mod common;
use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;
use std::time::Instant;

/// The pids of the processes a test left running on purpose: killed at the end.
struct Survivors(Vec<i32>);

impl Drop for Survivors {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
        }
    }
}

fn pid_of(v: &serde_json::Value) -> i32 {
    v["pid"].as_i64().expect("a pid") as i32
}

/// The pid a child of the service wrote into `name` (waited for with the deadline).
fn pid_in(sb: &Sandbox, name: &str) -> i32 {
    let text = common::files::wait_file(&sb.path(name), |t| t.ends_with('\n'));
    text.trim().parse().expect("a pid")
}

/// The service: a child in its own session (`setsid`), a child in its process group,
/// both written down before it says it is ready on fd 3; then its main process sleeps.
fn service(sb: &Sandbox, mode: &str, cgroups: bool) {
    let (s, g) = (sb.path("session"), sb.path("member"));
    let child = |f: &std::path::Path| {
        format!(
            "'echo $$ > {f}.tmp; mv {f}.tmp {f}; exec sleep 3600' &",
            f = f.display()
        )
    };
    let svc = sb.script(
        "svc",
        &format!(
            "rm -f {s} {g}\nsetsid sh -c {}\nsh -c {}\n\
             while [ ! -s {s} ] || [ ! -s {g} ]; do :; done\necho >&3\nexec sleep 3600",
            child(&s),
            child(&g),
            s = s.display(),
            g = g.display()
        ),
    );
    let supd = if cgroups { "" } else { "cgroups = \"off\"" };
    sb.config_with(
        supd,
        &format!(
            "[service.sshd]\ncommand = [\"{svc}\"]\nready = \"fd:3\"\nrestart_delay = \"0s\"\n\
             stop_timeout = \"2s\"\nkill_mode = \"{mode}\"\n"
        ),
    );
}

/// The session child and the group member of the current run.
fn children(sb: &Sandbox) -> (i32, i32) {
    (pid_in(sb, "session"), pid_in(sb, "member"))
}

/// Waits (with the deadline) until the service runs with another main process than
/// `old`; returns the new one.
fn new_run(sb: &Sandbox, old: i32) -> i32 {
    // The stream first, then a look: a change between the two is in the stream.
    let mut w = sb.watch();
    let s = sb.status("sshd");
    if s["state"] == "running" && s["pid"].as_i64().is_some_and(|p| p as i32 != old) {
        return pid_of(&s);
    }
    let e = w.until(sb, |e| {
        e["event"] == "state"
            && e["service"] == "sshd"
            && e["to"] == "running"
            && e["pid"].as_i64().is_some_and(|p| p as i32 != old)
    });
    pid_of(&e)
}

/// What a mode ends: (the session child, the group member).
fn ends(mode: &str, cgroups: bool) -> (bool, bool) {
    match mode {
        // Without cgroups a process in a session of its own cannot be told from any
        // other (supd(8): services must not daemonize there).
        "cgroup" => (cgroups, true),
        "group" => (false, true),
        _ => (false, false),
    }
}

/// Checks one step: the children of the run it ended are dead or alive as `mode` says,
/// and every survivor of earlier steps still lives.
fn check(
    sb: &Sandbox,
    step: &str,
    mode: &str,
    cgroups: bool,
    (session, member): (i32, i32),
    kept: &mut Survivors,
) {
    let (end_session, end_member) = ends(mode, cgroups);
    let what = format!("{mode}, cgroups {cgroups}, {step}");
    for (pid, ended, name) in [
        (session, end_session, "the session child"),
        (member, end_member, "the group member"),
    ] {
        if ended {
            assert!(
                wait_exit(pid, DEADLINE).is_some() && !alive(pid),
                "{what}: {name} {pid} must be ended\n{}",
                sb.supd_log()
            );
        } else {
            assert!(
                alive(pid),
                "{what}: {name} {pid} must survive\n{}",
                sb.supd_log()
            );
            kept.0.push(pid);
        }
    }
    for p in &kept.0 {
        assert!(
            alive(*p),
            "{what}: {p}, a survivor of an earlier step, was ended\n{}",
            sb.supd_log()
        );
    }
}

/// Starts supd; `group_only`: as on a kernel without the children files (a run
/// without a cgroup is then its process group alone).
fn start(sb: &mut Sandbox, group_only: bool) {
    if group_only {
        sb.start_group_only();
    } else {
        sb.start();
    }
}

fn each_step(mode: &str, cgroups: bool) {
    each_step_as(mode, cgroups, false);
}

fn each_step_as(mode: &str, cgroups: bool, group_only: bool) {
    let mut sb = Sandbox::new();
    let mut kept = Survivors(Vec::new());
    service(&sb, mode, cgroups);
    start(&mut sb, group_only);
    let mut main = pid_of(&sb.wait_state("sshd", "running"));

    // stop
    let run = children(&sb);
    sb.ok(json!({"cmd": "stop", "service": "sshd"}));
    assert!(!alive(main), "{mode}: stop ends the main process");
    check(&sb, "stop", mode, cgroups, run, &mut kept);

    // restart
    sb.ok(json!({"cmd": "start", "service": "sshd"}));
    main = pid_of(&sb.wait_state("sshd", "running"));
    let run = children(&sb);
    sb.ok(json!({"cmd": "restart", "service": "sshd"}));
    main = new_run(&sb, main);
    check(&sb, "restart", mode, cgroups, run, &mut kept);

    // kill -9 of the main process: a crash, restarted
    let run = children(&sb);
    kill(Pid::from_raw(main), Signal::SIGKILL).expect("kill the main process");
    main = new_run(&sb, main);
    check(
        &sb,
        "a crash of the main process",
        mode,
        cgroups,
        run,
        &mut kept,
    );

    // SIGKILL of supd, then a new supd
    let run = children(&sb);
    sb.stop_supd(Signal::SIGKILL);
    assert!(alive(main), "the main process outlives its killed supd");
    start(&mut sb, group_only);
    let new = new_run(&sb, main);
    assert!(
        wait_exit(main, DEADLINE).is_some() && !alive(main),
        "{mode}: the new supd ends the main process the killed one left"
    );
    check(&sb, "a new supd", mode, cgroups, run, &mut kept);
    assert!(alive(new));

    // A last stop still leaves what earlier runs left.
    let run = children(&sb);
    sb.ok(json!({"cmd": "stop", "service": "sshd"}));
    check(&sb, "the last stop", mode, cgroups, run, &mut kept);
}

fn needs_root() -> bool {
    if !is_root() {
        eprintln!("skipped: needs root for cgroups");
    }
    is_root()
}

#[test]
fn kill_mode_main_leaves_what_the_main_process_started() {
    if needs_root() {
        each_step("main", true);
    }
}

#[test]
fn kill_mode_group_ends_the_process_group_alone() {
    if needs_root() {
        each_step("group", true);
    }
}

#[test]
fn kill_mode_cgroup_ends_every_process_of_the_run() {
    if needs_root() {
        each_step("cgroup", true);
    }
}

#[test]
fn without_cgroups_each_mode_ends_what_it_says() {
    for mode in ["main", "group", "cgroup"] {
        each_step(mode, false);
    }
}

/// The same where the kernel has no children files: what "cgroup" and "group" end is
/// the process group (the session child is left by both ways).
#[test]
fn without_cgroups_or_children_files_each_mode_ends_what_it_says() {
    for mode in ["group", "cgroup"] {
        each_step_as(mode, false, true);
    }
}

/// `supctl signal` addresses what `kill_mode` says: the main process alone with "main".
#[test]
fn signal_reaches_the_main_process_alone_with_kill_mode_main() {
    let mut sb = Sandbox::new();
    service(&sb, "main", false);
    sb.start();
    let main = pid_of(&sb.wait_state("sshd", "running"));
    let (session, member) = children(&sb);
    // Under kill_mode "main" both outlive the test's supd.
    let _kept = Survivors(vec![session, member]);
    sb.ok(json!({"cmd": "signal", "service": "sshd", "signal": "STOP"}));
    let stopped = |p: i32| sup::proc::stat(p).is_some_and(|s| s.state == 'T');
    let end = Instant::now() + DEADLINE;
    while !stopped(main) {
        assert!(Instant::now() < end, "the main process was not stopped");
        // A process stopped by a signal makes no event anyone but its parent can wait
        // on: the pace of the look.
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(!stopped(member), "the group member was signalled too");
    sb.ok(json!({"cmd": "signal", "service": "sshd", "signal": "CONT"}));
}

/// A daemonizing main process: it starts `left` in the background and exits 0.
fn daemonizing(sb: &Sandbox, left: &str, cgroups: bool) {
    let svc = sb.script("svc", &format!("{left} &\nexit 0"));
    let supd = if cgroups { "" } else { "cgroups = \"off\"" };
    sb.config_with(
        supd,
        &format!(
            "[service.redis]\ncommand = [\"{svc}\"]\nrestart = \"on-failure\"\n\
             restart_delay = \"1h\"\nrestart_delay_max = \"1h\"\n"
        ),
    );
}

fn assert_named_and_ended(sb: &Sandbox, argv: &[&str], what: &str) {
    let s = sb.wait_state("redis", "backoff");
    let reason = s["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("forked into the background: run it in the foreground")
            && reason.contains("restarting in"),
        "{what}: status must name it, as a failure: {s}"
    );
    assert!(
        sb.supd_log().contains("forked into the background"),
        "{what}: the log must say so\n{}",
        sb.supd_log()
    );
    wait_gone(argv, &format!("{what}: what it left must be ended"));
}

/// Without cgroups or children files the run is counted by its process group, after
/// its leader was reaped; what the leader left is named and ended all the same.
#[test]
fn without_children_files_a_main_process_that_forks_into_the_background_is_named_and_ended() {
    let mut sb = Sandbox::new();
    let secs = format!("{}", 900_000 + sb.tag);
    daemonizing(&sb, &format!("sleep {secs}"), false);
    sb.start_group_only();
    assert_named_and_ended(
        &sb,
        &["sleep", &secs],
        "plain background, no children files",
    );
}

/// A main process that exits 0 leaving only a child that exited and was never waited
/// for (a zombie, which supd adopts): nothing of its run remained, so it is a success,
/// not a daemonized failure, however supd tracks it.
#[test]
fn a_zombie_left_by_a_main_process_is_not_a_process_that_remained() {
    for group_only in [false, true] {
        let mut sb = Sandbox::new();
        let svc = sb.script(
            "svc",
            // The child has exited, unreaped (WNOWAIT), when the main process exits.
            "exec python3 -c 'import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)\n'",
        );
        sb.config_with(
            "cgroups = \"off\"",
            &format!(
                "[service.once]\ncommand = [\"{svc}\"]\nrestart = \"on-failure\"\n\
                 restart_delay = \"1h\"\nrestart_delay_max = \"1h\"\n"
            ),
        );
        start(&mut sb, group_only);
        let s = sb.wait_state("once", "exited");
        assert!(
            !s["reason"].as_str().unwrap_or_default().contains("forked"),
            "group_only {group_only}: {s}\n{}",
            sb.supd_log()
        );
    }
}

#[test]
fn a_main_process_that_forks_into_the_background_is_named_and_ended() {
    let cases: &[(&str, bool)] = if is_root() {
        &[("setsid", true), ("plain", true), ("plain", false)]
    } else {
        &[("plain", false)]
    };
    for (how, cgroups) in cases {
        let mut sb = Sandbox::new();
        let secs = format!("{}", 900_000 + sb.tag);
        let left = match *how {
            "setsid" => format!("setsid sleep {secs}"),
            _ => format!("sleep {secs}"),
        };
        daemonizing(&sb, &left, *cgroups);
        sb.start();
        assert_named_and_ended(
            &sb,
            &["sleep", &secs],
            &format!("{how} background, cgroups {cgroups}"),
        );
    }
}

/// With kill_mode = "main" what the main process leaves is by design (sshd's sessions):
/// its exit is judged by its code, and nothing it left is ended.
#[test]
fn with_kill_mode_main_a_success_exit_leaves_the_rest_running() {
    let mut sb = Sandbox::new();
    let secs = format!("{}", 900_000 + sb.tag);
    let svc = sb.script("svc", &format!("sleep {secs} &\nexit 0"));
    sb.config(&format!(
        "[service.launcher]\ncommand = [\"{svc}\"]\nrestart = \"on-failure\"\nkill_mode = \"main\"\n"
    ));
    sb.start();
    let s = sb.wait_state("launcher", "exited");
    assert!(
        !s["reason"].as_str().unwrap_or_default().contains("forked"),
        "{s}"
    );
    let left = wait_present(&["sleep", &secs], "the child it left");
    let _kept = Survivors(vec![left]);
    assert!(alive(left));
}

/// A one-shot (`ready = "exited"`) whose program does its work and exits 0 while
/// something it started incidentally is still there (gpg starting gpg-agent, ssh's
/// ControlPersist master): its exit is its contract, so it is a success, not a
/// daemonizing failure, and what it started is ended with its run as before. A
/// service that waits for it (`after`) starts.
#[test]
fn a_one_shot_that_exits_0_leaving_a_helper_is_a_success() {
    let cases: &[(bool, bool)] = if is_root() {
        &[(true, false), (false, false), (false, true)]
    } else {
        &[(false, false), (false, true)]
    };
    for (cgroups, group_only) in cases {
        let mut sb = Sandbox::new();
        let secs = format!("{}", 900_000 + sb.tag);
        let setup = sb.script("setup", &format!("sleep {secs} &\nexit 0"));
        let supd = if *cgroups { "" } else { "cgroups = \"off\"" };
        sb.config_with(
            supd,
            &format!(
                "[service.setup]\ncommand = [\"{setup}\"]\nready = \"exited\"\n\
                 restart = \"on-failure\"\nrestart_delay = \"1h\"\nrestart_delay_max = \"1h\"\n\n\
                 [service.app]\ncommand = [\"sleep\", \"3600\"]\nafter = [\"setup\"]\n"
            ),
        );
        start(&mut sb, *group_only);
        let s = sb.wait_state("app", "running");
        let setup = sb.status("setup");
        assert_eq!(
            setup["state"], "exited",
            "cgroups {cgroups}, group_only {group_only}: the one-shot did its work: {setup}\n{s}"
        );
        assert!(
            setup["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("ended with it"),
            "cgroups {cgroups}, group_only {group_only}: what it left is said: {setup}"
        );
        wait_gone(
            &["sleep", &secs],
            &format!("cgroups {cgroups}: what the one-shot left is ended with its run"),
        );
    }
}

/// A reexec while a stop waits out its stop_timeout (every process ignores SIGTERM):
/// the new image finishes the stop with the run's kill_mode, ending what it says and
/// nothing more.
#[test]
fn a_reexec_in_the_middle_of_a_stop_ends_what_the_mode_says() {
    let cases: Vec<(&str, bool)> = ["main", "group", "cgroup"]
        .into_iter()
        .flat_map(|m| {
            let c: &[bool] = if is_root() { &[true, false] } else { &[false] };
            c.iter().map(move |c| (m, *c))
        })
        .collect();
    for (mode, cgroups) in cases {
        let mut sb = Sandbox::new();
        let mut kept = Survivors(Vec::new());
        service(&sb, mode, cgroups);
        let svc = sb.path("svc");
        let body = std::fs::read_to_string(&svc).expect("the script");
        std::fs::write(&svc, body.replacen('\n', "\ntrap '' TERM\n", 1)).expect("write");
        sb.start();
        let main = pid_of(&sb.wait_state("sshd", "running"));
        let run = children(&sb);
        let mut c = sb.client();
        c.send_raw(b"{\"cmd\":\"stop\",\"service\":\"sshd\",\"id\":1}\n");
        sb.wait_state("sshd", "stopping");
        sb.reexec();
        sb.wait_state("sshd", "stopped");
        assert!(
            !alive(main),
            "{mode}, cgroups {cgroups}: the main process was ended"
        );
        check(&sb, "a reexec mid-stop", mode, cgroups, run, &mut kept);
    }
}

/// A new supd ends what a killed one left as the run's kill_mode said when it started,
/// not as the config says now (as a reload stops the old run as it was started): an
/// operator who changes kill_mode and restarts supd rather than reloading loses no ssh
/// session (main, then cgroup) and keeps no old worker beside the new run forever
/// (cgroup, then main: nothing would end it).
#[test]
fn a_new_supd_ends_a_run_as_its_kill_mode_was_when_it_started() {
    if !needs_root() {
        return;
    }
    for (old, new) in [("cgroup", "main"), ("main", "cgroup"), ("group", "main")] {
        let mut sb = Sandbox::new();
        let mut kept = Survivors(Vec::new());
        service(&sb, old, true);
        sb.start();
        let main = pid_of(&sb.wait_state("sshd", "running"));
        let run = children(&sb);
        sb.stop_supd(Signal::SIGKILL);
        service(&sb, new, true);
        sb.start();
        new_run(&sb, main);
        // What the new run starts outlives the test's supd under kill_mode "main".
        let now = children(&sb);
        kept.0.extend([now.0, now.1]);
        assert!(
            wait_exit(main, DEADLINE).is_some() && !alive(main),
            "{old} then {new}: the new supd ends the main process the killed one left"
        );
        check(
            &sb,
            &format!("a new supd, the config changed to {new}"),
            old,
            true,
            run,
            &mut kept,
        );
    }
}
