//! The grant board of the dead-man guards (issue 22), pushed at its edges: a renewal that
//! moves the end earlier, several leases and services, a replaced guard, a reload, what
//! the services hold, how often an idle guard wakes. The promise (supd(8), "Leases"): a
//! leader-only run never outlives its last grant's end plus the kill grace, whatever supd
//! does, and a run whose grant is renewed is never killed by its guard.

mod common;
use common::grants::*;
use common::*;
use nix::sys::signal::Signal;
use serde_json::json;
use std::time::{Duration, Instant};

/// Leader-only services (each starts a child of its own, its pid in `child-NAME`, says
/// it is ready and waits), each of the lease given; every lease named is declared.
fn config(sb: &Sandbox, services: &[(&str, &str)]) {
    config_with_leases(sb, &[], services)
}

/// `config`, with `extra` leases declared too.
fn config_with_leases(sb: &Sandbox, extra: &[&str], services: &[(&str, &str)]) {
    let mut leases: Vec<&str> = services.iter().map(|(_, l)| *l).collect();
    leases.extend(extra);
    leases.sort_unstable();
    leases.dedup();
    let mut text: String = leases.iter().map(|l| format!("[lease.{l}]\n")).collect();
    for (name, lease) in services {
        text.push_str(&service(sb, name, lease));
    }
    sb.config(&text);
}

fn service(sb: &Sandbox, name: &str, lease: &str) -> String {
    let script = with_child_script(
        sb,
        &format!("{name}.sh"),
        &sb.path(&format!("child-{name}")),
    );
    format!(
        "\n[service.{name}]\ncommand = [\"{script}\"]\nready = \"fd:3\"\n\
         leader_only = \"{lease}\"\nstop_timeout = \"10s\"\n"
    )
}

fn child_pid(sb: &Sandbox, name: &str) -> i32 {
    read_pid(sb, &format!("child-{name}"))
}

/// A sandbox whose supd runs the services of `config`.
fn started(services: &[(&str, &str)]) -> Sandbox {
    let mut sb = Sandbox::new();
    config(&sb, services);
    sb.start();
    sb
}

/// The kill grace of the grants here.
const GRACE: Duration = Duration::from_millis(300);

/// Waits for a guard other than `old` that holds a board: a guard forked to replace
/// one. (A helper supd forks, such as a reload's reader, has supd's command line too,
/// for a moment, but holds no board.)
fn new_guard(sb: &Sandbox, old: &[i32]) -> i32 {
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(g) = guards(sb)
            .into_iter()
            .find(|g| !old.contains(g) && held(*g).iter().any(|t| is_board(t)))
        {
            return g;
        }
        assert!(Instant::now() < end, "no new guard\n{}", sb.supd_log());
        sb.status("engine");
    }
}

/// What a process holds open, as /proc says (the targets of its fds).
fn held(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|p| p.display().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn is_board(target: &str) -> bool {
    target.contains("supd-grant")
}

/// A renewal that moves the grant's end earlier (sup-lease's answer to a keepalive
/// that came back late, or a new term granted for less): supd ends the grant at the new
/// end, and so must the guard. Before, the guard slept until the end it had read (the
/// later one) and read the board only then: with supd frozen after the renewal, the run
/// outlived its last grant by the difference.
#[test]
fn a_renewal_that_moves_the_end_earlier_moves_the_guards_end() {
    let sb = started(&[("engine", "engine")]);
    let grace = GRACE;
    sb.ok(grant("engine", 1, Duration::from_secs(30), grace));
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let child = child_pid(&sb, "engine");
    let valid_for = Duration::from_secs(2);
    let renewed = Instant::now();
    sb.ok(grant("engine", 1, valid_for, grace));
    // One guard per run still: one replaced is ended (and reaped), not left beside.
    let end = Instant::now() + DEADLINE;
    while guards(&sb).len() != 1 {
        assert!(Instant::now() < end, "guards: {:?}", guards(&sb));
        sb.status("engine");
    }
    let _frozen = Frozen::new(sb.supd_pid());
    assert!(
        !gone_by(engine, renewed + valid_for - Duration::from_millis(300)),
        "the engine was killed before its grant's end"
    );
    let late = late(renewed, valid_for, grace);
    assert!(
        gone_by(engine, late),
        "the engine outlived its last grant (moved earlier) while supd was frozen"
    );
    assert!(gone_by(child, late), "the engine's child outlived it");
}

/// The same with a new term granted for less than the old term had left.
#[test]
fn a_new_term_with_an_earlier_end_moves_the_guards_end() {
    let sb = started(&[("engine", "engine")]);
    let grace = GRACE;
    sb.ok(grant("engine", 1, Duration::from_secs(30), grace));
    sb.wait_state("engine", "running");
    let valid_for = Duration::from_secs(3);
    let mut w = sb.watch();
    sb.ok(grant("engine", 2, valid_for, grace));
    let granted = Instant::now();
    // The new term restarts the engine (a new fencing token): the new run's guard reads
    // the board afresh; the old run is what must not outlive the new end either.
    w.state(&sb, "engine", "running");
    let engine = pid_of(&sb.status("engine"));
    let _frozen = Frozen::new(sb.supd_pid());
    let late = late(granted, valid_for, grace);
    assert!(
        gone_by(engine, late),
        "the engine outlived its last grant while supd was frozen"
    );
}

/// Two leases, two services on one of them: each guard reads its own lease's board. The
/// renewed lease's services run on with supd frozen until their own end; the lease left
/// to lapse ends its service at its end, not the other lease's.
#[test]
fn each_guard_reads_the_board_of_its_own_lease() {
    let sb = started(&[("a1", "alpha"), ("a2", "alpha"), ("b1", "beta")]);
    let grace = GRACE;
    // alpha long enough for the three starts on a loaded machine; its renewals below
    // bring its end in.
    sb.ok(grant("alpha", 1, Duration::from_secs(60), grace));
    sb.ok(grant("beta", 7, Duration::from_secs(20), grace));
    let a1 = pid_of(&sb.wait_state("a1", "running"));
    let a2 = pid_of(&sb.wait_state("a2", "running"));
    let b1 = pid_of(&sb.wait_state("b1", "running"));
    // alpha renewed past its first end; beta not renewed (its grant is long).
    let mut renewed = Instant::now();
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        renewed = Instant::now();
        sb.ok(grant("alpha", 1, Duration::from_secs(1), grace));
        assert!(
            !gone_by(a1, renewed + Duration::from_millis(300)),
            "a1 was killed though its lease was renewed\n{}",
            sb.supd_log()
        );
    }
    assert!(alive(a2), "a2 was killed though its lease was renewed");
    assert!(alive(b1), "b1 was killed before its lease's end");
    let _frozen = Frozen::new(sb.supd_pid());
    let late = renewed + Duration::from_millis(1300) + SLACK;
    assert!(gone_by(a1, late), "a1 outlived alpha's grant");
    assert!(gone_by(a2, late), "a2 outlived alpha's grant");
    assert!(
        alive(b1),
        "b1 was killed at alpha's end, though beta's is later"
    );
    // Every guard holds its own lease's board only: one board each.
    for g in guards(&sb) {
        let boards = held(g).into_iter().filter(|t| is_board(t)).count();
        assert_eq!(boards, 1, "guard {g} holds {:?}", held(g));
    }
}

/// A guard killed (by an operator, the OOM killer) is replaced by one that reads the
/// board: with supd then frozen, the run still ends at its grant's end.
#[test]
fn a_replaced_guard_holds_the_grants_end() {
    let sb = started(&[("engine", "engine")]);
    let grace = GRACE;
    let valid_for = Duration::from_secs(3);
    sb.ok(grant("engine", 1, valid_for, grace));
    let granted = Instant::now();
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let first = guards(&sb);
    assert_eq!(first.len(), 1, "{first:?}");
    signal(first[0], Signal::SIGKILL);
    let second = new_guard(&sb, &first);
    assert!(
        held(second).iter().any(|t| is_board(t)),
        "the new guard holds no board: {:?}",
        held(second)
    );
    let _frozen = Frozen::new(sb.supd_pid());
    assert!(alive(engine), "the engine ended with its first guard");
    let late = late(granted, valid_for, grace);
    assert!(
        gone_by(engine, late),
        "the engine outlived its grant under its new guard"
    );
}

/// A service never holds a grant board (nor the dead-man pipe): it could keep the pipe
/// open past supd, or write itself a later end. Checked on a run started by a first
/// image and on one started after a `reexec` (whose boards were kept across exec).
#[test]
fn a_service_holds_no_board_before_or_after_a_reexec() {
    let sb = started(&[("engine", "engine"), ("other", "engine")]);
    sb.ok(grant("engine", 1, Duration::from_secs(60), GRACE));
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let fds = held(engine);
    assert!(!fds.iter().any(|t| is_board(t)), "the engine holds {fds:?}");
    // The dead-man pipe, as the guards hold it.
    let g = guards(&sb);
    let pipe: Vec<String> = held(g[0])
        .into_iter()
        .filter(|t| t.starts_with("pipe:"))
        .collect();
    assert_eq!(pipe.len(), 1, "the guard holds {:?}", held(g[0]));
    sb.reexec();
    let mut w = sb.watch();
    sb.ok(json!({"cmd": "restart", "service": "other"}));
    w.state(&sb, "other", "running");
    let other = pid_of(&sb.status("other"));
    for pid in [engine, other, child_pid(&sb, "other")] {
        let fds = held(pid);
        assert!(
            !fds.iter().any(|t| is_board(t)),
            "service process {pid} holds a grant board: {fds:?}"
        );
        assert!(
            !fds.contains(&pipe[0]),
            "service process {pid} holds the dead-man pipe {}: {fds:?}",
            pipe[0]
        );
    }
}

/// Context switches of a process so far (voluntary: each time it slept and woke).
fn wakeups(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches")
}

/// A guard whose grant's end is far off sleeps until then: it does not wake on a tick,
/// nor on renewals (which only move the end further).
#[test]
fn an_idle_guard_sleeps_until_the_end() {
    let sb = started(&[("engine", "engine")]);
    sb.ok(grant("engine", 1, Duration::from_secs(600), GRACE));
    sb.wait_state("engine", "running");
    let g = guards(&sb);
    assert_eq!(g.len(), 1, "{g:?}");
    let before = wakeups(g[0]);
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        sb.ok(grant("engine", 1, Duration::from_secs(600), GRACE));
        std::thread::sleep(Duration::from_millis(100)); // the renewals' pace, not a wait
    }
    let woke = wakeups(g[0]) - before;
    eprintln!("the guard woke {woke} times in 3 s of renewals");
    assert!(
        woke <= 2,
        "the guard woke {woke} times in 3 s with its end 10 min away"
    );
}

/// A reload that moves a running service to another lease: the run of the old lease
/// ends (restarted), and the new run is guarded by the new lease's board: renewing the
/// old lease does not keep it past the new lease's end, and renewing the new lease
/// keeps it.
#[test]
fn a_reload_that_moves_a_service_to_another_lease_moves_its_guard() {
    let sb = started(&[("engine", "alpha"), ("keep", "beta")]);
    let grace = GRACE;
    sb.ok(grant("alpha", 1, Duration::from_secs(60), grace));
    // Long enough for the reload and the new start on a loaded machine; the renewal
    // below brings its end in.
    sb.ok(grant("beta", 1, Duration::from_secs(60), grace));
    let old = pid_of(&sb.wait_state("engine", "running"));
    sb.wait_state("keep", "running");
    config_with_leases(&sb, &["alpha"], &[("engine", "beta"), ("keep", "beta")]);
    let mut w = sb.watch();
    reload(&sb);
    assert!(
        gone_by(old, Instant::now() + DEADLINE),
        "the run of the old lease goes on after the move"
    );
    let st = w.state(&sb, "engine", "running");
    let new = pid_of(&st);
    let renewed = Instant::now();
    sb.ok(grant("alpha", 1, Duration::from_secs(60), grace));
    sb.ok(grant("beta", 1, Duration::from_secs(2), grace));
    let _frozen = Frozen::new(sb.supd_pid());
    let late = renewed + Duration::from_millis(2300) + SLACK;
    assert!(
        gone_by(new, late),
        "the moved service outlived its new lease's grant"
    );
}

/// A leader-only engine that ignores SIGTERM (its stop takes all of `stop_timeout`).
fn stubborn_config(sb: &Sandbox, stop_timeout: &str) {
    let script = stubborn_script(sb, "stubborn.sh");
    engine_config(sb, &script, stop_timeout);
}

/// A sandbox whose supd runs a stubborn engine (`stubborn_config`, a stop_timeout of 30 s).
fn stubborn_started() -> Sandbox {
    let mut sb = Sandbox::new();
    stubborn_config(&sb, "30s");
    sb.start();
    sb
}

/// With supd frozen, a run that ignores SIGTERM is still there, and gone by `late` (else
/// `outlived` is the failure).
fn frozen_bound(sb: &Sandbox, pid: i32, late: Instant, outlived: &str) {
    let _frozen = Frozen::new(sb.supd_pid());
    assert!(alive(pid), "the run ignores SIGTERM");
    assert!(gone_by(pid, late), "{outlived}");
}

/// supd frozen at odd moments of a `reexec` (just after it was asked, in the exec,
/// while the new image takes over): the guards hold the end either way.
#[test]
fn a_supd_frozen_during_a_reexec_does_not_keep_its_engine() {
    for delay_ms in [0u64, 15, 60] {
        let sb = started(&[("engine", "engine")]);
        let (valid_for, grace) = (Duration::from_secs(2), GRACE);
        sb.ok(grant("engine", 1, valid_for, grace));
        let granted = Instant::now();
        let engine = pid_of(&sb.wait_state("engine", "running"));
        let mut reexec = sb.spawn_reexec();
        std::thread::sleep(Duration::from_millis(delay_ms)); // the fault's moment
        let frozen = Frozen::new(sb.supd_pid());
        let late = late(granted, valid_for, grace);
        let gone = gone_by(engine, late);
        drop(frozen);
        let _ = reexec.wait();
        assert!(
            gone,
            "frozen {delay_ms} ms into a reexec, supd kept the engine past its grant\n{}",
            sb.supd_log()
        );
        sb.wait_state("engine", "stopped");
    }
}

/// Whether `pid` is stopped (SIGSTOP), as /proc says.
fn stopped(pid: i32) -> bool {
    sup::proc::stat(pid).is_some_and(|s| s.state == 'T')
}

/// The guard fires while supd is between its last reap and the exec of a `reexec`
/// (stopped there by a test failpoint): the run's processes exit (the engine, and its
/// child, an orphan of supd's by then), and their SIGCHLD is pending at the exec. The new
/// image must still reap them and end the run. Before, it reaped the leader by its pidfd
/// but never the orphan (the new image's reset of signal dispositions to their defaults
/// discards a pending SIGCHLD, whose default is to be ignored): the engine stayed
/// "stopping ... waiting for the rest of its run to exit" for good.
#[test]
fn exits_during_the_exec_of_a_reexec_are_reaped_by_the_new_image() {
    let mut sb = Sandbox::new();
    config(&sb, &[("engine", "engine")]);
    let mut cmd = std::process::Command::new(SUPD);
    cmd.env("SUP_FAILPOINT", "reexec-stops-before-exec");
    if std::env::var_os("SUP_TEST_LINUX_3_10").is_some() && oldkernel::supported() {
        // Without pidfds, not even the leader is found but by a scan.
        oldkernel::linux_3_10(&mut cmd);
    }
    sb.start_with(cmd, &["-c"]);
    let (valid_for, grace) = (Duration::from_secs(2), GRACE);
    sb.ok(grant("engine", 1, valid_for, grace));
    let granted = Instant::now();
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let child = child_pid(&sb, "engine");
    let mut reexec = sb.spawn_reexec();
    let supd = sb.supd_pid();
    let end = Instant::now() + DEADLINE;
    while !stopped(supd) {
        assert!(Instant::now() < end, "supd did not stop before its exec");
        std::thread::sleep(Duration::from_millis(10)); // /proc has no event for a stop
    }
    let frozen = Frozen(supd);
    let late = late(granted, valid_for, grace);
    let gone = [engine, child].map(|p| gone_by(p, late));
    assert_eq!(gone, [true, true], "the guard did not end the run");
    drop(frozen);
    let _ = reexec.wait();
    let st = sb.wait_state("engine", "stopped");
    assert_eq!(st["state"], "stopped", "{st}");
    let zombie = sup::proc::stat(child).is_some_and(|s| s.state == 'Z');
    assert!(!zombie, "the engine's child is left a zombie");
}

/// A release stops the engine gracefully, but not past the grant's end plus the kill
/// grace: with supd frozen in the middle of the stop (its SIGKILL due only after
/// `stop_timeout`), the guard kills the engine there.
#[test]
fn a_supd_frozen_during_a_release_does_not_keep_its_engine() {
    let sb = stubborn_started();
    let (valid_for, grace) = (Duration::from_secs(3), GRACE);
    sb.ok(grant("engine", 1, valid_for, grace));
    let granted = Instant::now();
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let mut w = sb.watch();
    let mut c = sb.client();
    c.send_raw(b"{\"cmd\":\"lease-release\",\"lease\":\"engine\",\"id\":1}\n");
    w.state(&sb, "engine", "stopping");
    frozen_bound(
        &sb,
        engine,
        late(granted, valid_for, grace),
        "the engine outlived its grant in a release while supd was frozen",
    );
    let r = c.read().expect("the release's answer");
    assert_eq!(r["ok"], true, "{r}");
}

/// A zero kill grace: the guard kills at the grant's end itself.
#[test]
fn a_zero_kill_grace_ends_the_run_at_the_grants_end() {
    let sb = started(&[("engine", "engine")]);
    let valid_for = Duration::from_secs(2);
    sb.ok(grant("engine", 1, valid_for, Duration::ZERO));
    let granted = Instant::now();
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let _frozen = Frozen::new(sb.supd_pid());
    assert!(
        !gone_by(engine, granted + valid_for - Duration::from_millis(300)),
        "killed before the grant's end"
    );
    assert!(
        gone_by(engine, granted + valid_for + SLACK),
        "the engine outlived its grant"
    );
}

/// A kill grace far longer than any TTL (a confused or hostile sender): supd refuses
/// it, as it refuses a validity over an hour; else a frozen supd would keep the run for
/// as long as the grace says.
#[test]
fn an_absurd_kill_grace_is_refused() {
    let sb = started(&[("engine", "engine")]);
    let mut g = grant("engine", 1, Duration::from_secs(10), GRACE);
    g["kill_grace"] = json!("7000h");
    let r = sb.request(g);
    assert_eq!(r["ok"], false, "a grant with 7000 h of kill grace: {r}");
    assert_ne!(sb.status("engine")["state"], "running");
}

/// A reload that removes a lease and its service while the run is stopping slowly (it
/// ignores SIGTERM): the removed run is still bounded by its last grant, with supd
/// frozen; grants of the removed lease are refused.
#[test]
fn a_reload_that_removes_the_lease_keeps_its_runs_bound() {
    let sb = stubborn_started();
    let (valid_for, grace) = (Duration::from_secs(3), GRACE);
    sb.ok(grant("engine", 1, valid_for, grace));
    let granted = Instant::now();
    let engine = pid_of(&sb.wait_state("engine", "running"));
    sb.config("");
    reload(&sb);
    let r = sb.request(grant("engine", 1, valid_for, grace));
    assert_eq!(r["ok"], false, "a grant of a removed lease: {r}");
    frozen_bound(
        &sb,
        engine,
        late(granted, valid_for, grace),
        "the removed engine outlived its grant while supd was frozen",
    );
}

/// supd killed and started again while a leader-only run exists: the old guards end the
/// run and themselves; the new supd's run has one guard, which holds its board.
#[test]
fn a_restarted_supd_leaves_no_guard_of_the_old_one() {
    let mut sb = started(&[("engine", "engine"), ("other", "engine")]);
    let grace = GRACE;
    sb.ok(grant("engine", 1, Duration::from_secs(60), grace));
    let engine = pid_of(&sb.wait_state("engine", "running"));
    sb.wait_state("other", "running");
    let old = guards(&sb);
    assert_eq!(old.len(), 2, "{old:?}");
    sb.stop_supd(Signal::SIGKILL);
    let end = Instant::now() + Duration::from_secs(2);
    assert!(gone_by(engine, end), "the engine outlived supd");
    for g in &old {
        assert!(gone_by(*g, end), "guard {g} outlived its run");
    }
    sb.start();
    sb.ok(grant("engine", 2, Duration::from_secs(60), grace));
    sb.wait_state("engine", "running");
    sb.wait_state("other", "running");
    let new = guards(&sb);
    assert_eq!(new.len(), 2, "{new:?}");
    for g in new {
        assert!(held(g).iter().any(|t| is_board(t)), "{:?}", held(g));
    }
}

/// A new term granted for less than the old one had left, while the old term's run is
/// still stopping (it ignores SIGTERM; its stop_timeout is long): the old run is bound
/// by the new, earlier end too. Before, its guard slept until the old term's end.
#[test]
fn a_new_term_with_an_earlier_end_bounds_the_stopping_run() {
    let sb = stubborn_started();
    let grace = GRACE;
    sb.ok(grant("engine", 1, Duration::from_secs(30), grace));
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let valid_for = Duration::from_secs(3);
    let mut w = sb.watch();
    sb.ok(grant("engine", 2, valid_for, grace));
    let granted = Instant::now();
    w.state(&sb, "engine", "stopping");
    frozen_bound(
        &sb,
        engine,
        late(granted, valid_for, grace),
        "the old term's run outlived the new term's grant while supd was frozen",
    );
}

/// A grant that arrives after its end changes nothing: the run goes on, its guard is
/// not replaced, and the end it holds stays.
#[test]
fn a_grant_arriving_after_its_end_changes_nothing() {
    let sb = started(&[("engine", "engine")]);
    let grace = GRACE;
    sb.ok(grant("engine", 1, Duration::from_secs(60), grace));
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let before = guards(&sb);
    let mut late = grant("engine", 1, Duration::from_secs(1), grace);
    late["until_boot_ms"] = json!(sup::time::Boot::now().as_ms().saturating_sub(500));
    let r = sb.ok(late);
    assert_eq!(r["valid_for_ms"], 0, "{r}");
    assert_eq!(guards(&sb), before, "the guard was replaced");
    assert!(
        !gone_by(engine, Instant::now() + Duration::from_secs(1)),
        "the engine was killed by a grant that had ended"
    );
}

/// A reload moves a running service to another lease; the old run, which ignores
/// SIGTERM, is still stopping when its guard is killed. The replacement guard must hold
/// the board of the run's own lease (the one it was started under), not of the lease
/// the config now names: with supd frozen, the old run is gone by its own grant's end,
/// though the other lease is held far longer.
#[test]
fn a_replaced_guard_holds_the_board_of_the_runs_own_lease() {
    let mut sb = Sandbox::new();
    let script = stubborn_script(&sb, "stubborn.sh");
    let cfg = |lease: &str| {
        format!(
            "[lease.alpha]\n[lease.beta]\n\n[service.engine]\ncommand = [\"{script}\"]\n\
             ready = \"fd:3\"\nleader_only = \"{lease}\"\nstop_timeout = \"30s\"\n"
        )
    };
    sb.config(&cfg("alpha"));
    sb.start();
    let grace = GRACE;
    let valid_for = Duration::from_secs(3);
    sb.ok(grant("beta", 1, Duration::from_secs(60), grace));
    sb.ok(grant("alpha", 1, valid_for, grace));
    let granted = Instant::now();
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let first = guards(&sb);
    assert_eq!(first.len(), 1, "{first:?}");
    sb.config(&cfg("beta"));
    let mut w = sb.watch();
    reload(&sb);
    w.state(&sb, "engine", "stopping");
    signal(first[0], Signal::SIGKILL);
    new_guard(&sb, &first);
    frozen_bound(
        &sb,
        engine,
        late(granted, valid_for, grace),
        "the old run (of lease alpha) outlived alpha's grant: its new guard read beta's board",
    );
}

/// Without memfds (before Linux 3.17) the board is a file of the temp directory; a
/// TMPDIR that cannot be written must not keep leader-only services from starting.
#[test]
fn a_board_without_memfd_does_not_need_a_writable_tmpdir() {
    if !oldkernel::supported() {
        return;
    }
    let mut sb = Sandbox::new();
    config(&sb, &[("engine", "engine")]);
    let mut cmd = std::process::Command::new(SUPD);
    cmd.env("TMPDIR", sb.path("no-such-dir"));
    oldkernel::linux_3_10(&mut cmd);
    sb.start_with(cmd, &["-c"]);
    sb.ok(grant("engine", 1, Duration::from_secs(60), GRACE));
    let st = sb.wait_state("engine", "running");
    assert_eq!(st["state"], "running", "{st}\n{}", sb.supd_log());
}
