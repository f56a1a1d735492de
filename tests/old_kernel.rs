//! supd on an old kernel (issue 12): RHEL 7's 3.10, RHEL 8's 4.18, Debian 10's 4.19.
//! supd runs under a seccomp filter that fails every system call newer than 3.10 with
//! ENOSYS (pidfds, close_range, ...) and CLOCK_BOOTTIME timers with EINVAL, and, for
//! the cgroup tests, with `cgroup.kill` and `cgroup.freeze` hidden. Each test shows a
//! promise kept by the fallback: one instance of a service after supd was killed, a
//! stop that ends every process, no inherited fd in a service or a guard, a guarded
//! leader-only run, a grant that ends.

mod common;
use common::grants::{guards, read_pid, with_child_script, Frozen};
use common::locking::{assert_no_dups, lines, locking_service, wait_pid_file};
use common::oldkernel::{has_cgroup2, hide_files_shim, linux_3_10, supported};
use common::*;
use nix::sys::signal::Signal;
use serde_json::json;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Starts supd under the filter.
fn start_old(sb: &mut Sandbox) {
    let mut cmd = Command::new(SUPD);
    linux_3_10(&mut cmd);
    sb.start_with(cmd, &["-c"]);
}

/// Starts supd under the filter, with the files `hide` names (comma-separated) hidden
/// from it and from what it starts.
fn start_old_hiding(sb: &mut Sandbox, hide: &str) {
    let shim = hide_files_shim(sb);
    let mut cmd = Command::new(SUPD);
    linux_3_10(&mut cmd);
    cmd.env("LD_PRELOAD", shim).env("SUP_TEST_HIDE", hide);
    sb.start_with(cmd, &["-c"]);
}

fn skip() -> bool {
    if !supported() {
        eprintln!("skipped: the filter's system call numbers are x86_64's");
        return true;
    }
    false
}

/// [`skip`], and skips too where supd would get no cgroups.
fn skip_without_cgroup2() -> bool {
    if skip() {
        return true;
    }
    if !has_cgroup2() {
        eprintln!("skipped: needs root and a cgroup2 hierarchy");
        return true;
    }
    false
}

fn pid_of(v: &serde_json::Value) -> i32 {
    v["pid"].as_i64().expect("a pid") as i32
}

/// A shell line that starts, in the background, a daemon that leaves the session,
/// writes its pid to `pid_file` and sleeps; `ignore_term` makes it ignore SIGTERM.
fn daemon(pid_file: &Path, ignore_term: bool) -> String {
    let trap = if ignore_term { "trap \"\" TERM; " } else { "" };
    format!(
        "setsid sh -c '{trap}echo $$ > {g}.tmp; mv {g}.tmp {g}; exec sleep 3600' &",
        g = pid_file.display()
    )
}

/// The config of the service `svc` running `command`.
fn svc_config(command: &str, stop_timeout: &str) -> String {
    format!("[service.svc]\ncommand = [\"{command}\"]\nstop_timeout = \"{stop_timeout}\"\n")
}

/// The config of the leader-only service `engine` (ready on fd 3) running `command`.
fn engine_section(command: &str) -> String {
    format!(
        "[lease.engine]\n\n[service.engine]\ncommand = [\"{command}\"]\nready = \"fd:3\"\n\
         leader_only = \"engine\"\nstop_timeout = \"10s\"\n"
    )
}

/// A locking service (running `pre`, then sleeping) under a supd without cgroups, whose
/// supd is then killed: returns the pid of the run it left behind.
fn leftover_of_killed_supd(sb: &mut Sandbox, pre: &str, stop_timeout: &str) -> i32 {
    let svc = locking_service(sb, pre, "exec sleep 3600");
    sb.config_with("cgroups = \"off\"", &svc_config(&svc, stop_timeout));
    sb.start();
    let old = first_run(sb);
    sb.stop_supd(Signal::SIGKILL);
    old
}

/// Fails unless every one of `pids` has ended within `within` (supd was killed); ends
/// those left before it fails.
fn assert_all_end(pids: &[i32], within: Duration) {
    let end = Instant::now() + within;
    let left: Vec<i32> = pids
        .iter()
        .copied()
        .filter(|&pid| wait_exit(pid, end.saturating_duration_since(Instant::now())).is_none())
        .collect();
    for &pid in &left {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
    }
    assert!(left.is_empty(), "{left:?} outlived supd's death");
}

/// Waits until the first run has taken the lock (`running` comes at the fork, before
/// the script got that far), and returns its pid.
fn first_run(sb: &Sandbox) -> i32 {
    let pid = pid_of(&sb.wait_state("svc", "running"));
    common::files::wait_file(&sb.path("starts"), |t| t.ends_with('\n'));
    pid
}

/// Waits for the service's second start (`starts` has two lines) and returns the
/// status then.
fn second_run(sb: &Sandbox) -> serde_json::Value {
    let end = Instant::now() + DEADLINE;
    loop {
        let s = sb.status("svc");
        if s["state"] == "running" && lines(sb, "starts").len() >= 2 {
            return s;
        }
        assert!(
            Instant::now() < end,
            "the service did not start again within {DEADLINE:?}: {s}\n{}",
            sb.supd_log()
        );
        // A round trip per look: supd has had its turn.
    }
}

/// kill -9 supd while its service ignores SIGTERM; a new supd without pidfds must
/// end the leftover (by pid, its start time checked) before the service starts again.
#[test]
fn a_leftover_that_ignores_term_is_ended_before_the_service_starts_again() {
    if skip() {
        return;
    }
    let mut sb = Sandbox::new();
    let old = leftover_of_killed_supd(&mut sb, "trap '' TERM", "1s");
    assert!(alive(old), "the leftover is there");
    start_old(&mut sb);
    let new = pid_of(&second_run(&sb));
    assert_ne!(new, old);
    assert!(
        !alive(old),
        "the old instance runs beside the new one\n{}",
        sb.supd_log()
    );
    assert_no_dups(&sb);
    assert!(
        sb.supd_log().contains("no pidfds"),
        "the filter hid pidfds\n{}",
        sb.supd_log()
    );
}

/// The same with cgroups but neither `cgroup.kill` nor `cgroup.freeze` (Linux 4.19):
/// the leftover is a daemon that left the service's session, holds the lock and
/// ignores SIGTERM; only its cgroup names it.
#[test]
fn a_daemonized_leftover_is_ended_by_its_cgroup_without_cgroup_kill() {
    if skip_without_cgroup2() {
        return;
    }
    let mut sb = Sandbox::new();
    let gc = sb.path("grandchild");
    let svc = locking_service(
        &sb,
        "",
        &format!("{}\nexec 9>&-\nexec sleep 3600", daemon(&gc, true)),
    );
    sb.config(&svc_config(&svc, "1s"));
    start_old_hiding(&mut sb, "cgroup.kill,cgroup.freeze");
    let old = pid_of(&sb.wait_state("svc", "running"));
    let daemon = wait_pid_file(&gc);
    sb.stop_supd(Signal::SIGKILL);
    // The leader is ended by the group; the daemon, which holds the lock, by its
    // cgroup alone.
    start_old_hiding(&mut sb, "cgroup.kill,cgroup.freeze");
    second_run(&sb);
    assert!(
        !alive(daemon) && !alive(old),
        "the old run's daemon runs beside the new run\n{}",
        sb.supd_log()
    );
    assert_no_dups(&sb);
}

/// A leftover that obeys SIGTERM is seen gone by the re-check timer: the service starts
/// again long before the grace (a minute) is over.
#[test]
fn a_leftover_that_obeys_term_is_awaited_by_a_timer_not_the_grace() {
    if skip() {
        return;
    }
    let mut sb = Sandbox::new();
    let old = leftover_of_killed_supd(&mut sb, "", "60s");
    let restarted = Instant::now();
    start_old(&mut sb);
    second_run(&sb);
    assert!(
        restarted.elapsed() < Duration::from_secs(20),
        "took {:?}",
        restarted.elapsed()
    );
    assert!(!alive(old));
    assert_no_dups(&sb);
}

/// A stop ends a daemon that left the service's session (its grandchild, which
/// ignores SIGTERM) without `cgroup.kill`: with `cgroup.freeze` (Linux 5.2 to 5.13),
/// and without it either (4.18, 4.19).
#[test]
fn a_stop_ends_a_daemonized_grandchild_without_cgroup_kill() {
    if skip_without_cgroup2() {
        return;
    }
    for hide in ["cgroup.kill", "cgroup.kill,cgroup.freeze"] {
        let mut sb = Sandbox::new();
        let gc = sb.path("grandchild");
        let svc = sb.script("svc", &format!("{}\nexec sleep 3600", daemon(&gc, true)));
        sb.config(&svc_config(&svc, "1s"));
        start_old_hiding(&mut sb, hide);
        let leader = pid_of(&sb.wait_state("svc", "running"));
        assert!(
            sb.supd_log().contains("services run in cgroups"),
            "{}",
            sb.supd_log()
        );
        let grandchild = wait_pid_file(&gc);
        let st = sup::proc::stat(grandchild).expect("the grandchild runs");
        assert_ne!(st.session, leader, "the grandchild left the session");
        let out = sb.supctl(&["stop", "svc"]);
        assert!(
            out.status.success(),
            "{hide} hidden: stop failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            sb.supd_log()
        );
        assert_eq!(sb.status("svc")["state"], "stopped");
        assert!(
            !alive(grandchild),
            "{hide} hidden: the daemon outlived the stop\n{}",
            sb.supd_log()
        );
        drop(sb);
    }
}

/// supd started with many fds open and not close-on-exec: without close_range, its
/// service gets none of them, only 0, 1 and 2.
#[test]
fn a_service_gets_no_inherited_fd_without_close_range() {
    if skip() {
        return;
    }
    let mut sb = Sandbox::new();
    sb.config("[service.svc]\ncommand = [\"sleep\", \"3600\"]\n");
    let mut cmd = Command::new(SUPD);
    // SAFETY: in the forked child before exec: dup and fcntl on integers only.
    unsafe {
        cmd.pre_exec(|| {
            for _ in 0..40 {
                let fd = libc::dup(2);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::fcntl(fd, libc::F_SETFD, 0);
            }
            Ok(())
        });
    }
    linux_3_10(&mut cmd);
    sb.start_with(cmd, &["-c"]);
    let pid = pid_of(&sb.wait_state("svc", "running"));
    let fds = open_fds(pid);
    assert_eq!(fds, vec![0, 1, 2], "\n{}", sb.supd_log());
}

/// The fd numbers `pid` holds.
fn open_fds(pid: i32) -> Vec<i32> {
    let mut fds: Vec<i32> = fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the process's fds")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort();
    fds
}

/// A leader-only engine with a child of its own; `[lease.engine]`.
fn engine_config(sb: &Sandbox) {
    let engine = with_child_script(sb, "engine.sh", &sb.path("child"));
    sb.config_with("cgroups = \"off\"", &engine_section(&engine));
}

/// Without pidfds a leader-only service still starts, guarded: its guard holds only the
/// dead-man pipe, the leader's /proc directory, the grant board (without memfds, an
/// unlinked file of the temp directory) and its own timer (close_range is missing
/// too), and ends the run when supd is killed.
#[test]
fn a_leader_only_run_is_guarded_without_pidfds() {
    if skip() {
        return;
    }
    let mut sb = Sandbox::new();
    engine_config(&sb);
    start_old(&mut sb);
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 1, "valid_for": "1h"}));
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let child = read_pid(&sb, "child");
    let guards = guards(&sb);
    assert_eq!(guards.len(), 1, "one guard: {guards:?}\n{}", sb.supd_log());
    let fds = open_fds(guards[0]);
    let held: Vec<String> = fds
        .iter()
        .filter_map(|fd| fs::read_link(format!("/proc/{}/fd/{fd}", guards[0])).ok())
        .map(|p| p.display().to_string())
        .collect();
    assert_eq!(fds.len(), 4, "the guard holds {fds:?}: {held:?}");
    assert!(
        held.contains(&format!("/proc/{engine}")),
        "the guard holds the leader's /proc directory: {held:?}"
    );
    assert!(
        held.iter().any(|h| h.starts_with("pipe:")),
        "the guard holds the dead-man pipe: {held:?}"
    );
    assert!(
        held.iter()
            .any(|h| h.contains("supd-grant-") && h.ends_with("(deleted)")),
        "the guard holds the grant board, an unlinked file without memfds: {held:?}"
    );
    assert!(
        held.iter().any(|h| h.contains("timerfd")),
        "the guard holds its timer: {held:?}"
    );
    sb.stop_supd(Signal::SIGKILL);
    assert_all_end(&[engine, child], Duration::from_secs(2));
}

/// Without memfds and CLOCK_BOOTTIME timers (before 3.15), the guard still holds the
/// grant's end (a wall-clock timer, a board in an unlinked file): a frozen supd does
/// not keep the engine past it.
#[test]
fn a_frozen_supd_does_not_keep_its_engine_past_the_grant_on_an_old_kernel() {
    if skip() {
        return;
    }
    let mut sb = Sandbox::new();
    engine_config(&sb);
    start_old(&mut sb);
    let granted = Instant::now();
    sb.ok(
        json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 1,
                 "valid_for": "2s", "kill_grace": "300ms"}),
    );
    let engine = pid_of(&sb.wait_state("engine", "running"));
    let child = read_pid(&sb, "child");
    let frozen = Frozen::new(sb.supd_pid());
    let end = granted + Duration::from_millis(2300);
    let ended = [engine, child].map(|p| {
        wait_exit(
            p,
            (end + Duration::from_millis(700)).saturating_duration_since(Instant::now()),
        )
        .is_some()
    });
    drop(frozen);
    assert!(
        Instant::now() >= end - Duration::from_millis(300),
        "killed before the end"
    );
    assert_eq!(
        ended,
        [true, true],
        "the engine or its child outlived the grant while supd was frozen\n{}",
        sb.supd_log()
    );
}

/// Without CLOCK_BOOTTIME timers (before 3.15) a grant still ends, and supd says its
/// wake-up after a suspend is a wall-clock timer.
#[test]
fn a_grant_ends_without_boottime_timers() {
    if skip() {
        return;
    }
    let mut sb = Sandbox::new();
    engine_config(&sb);
    start_old(&mut sb);
    let mut w = sb.watch();
    let granted = Instant::now();
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 1, "valid_for": "1s"}));
    // Running first (just after the grant it may still be `stopped`, its fork asked of
    // the spawner), then stopped by the grant's end.
    let to = |state: &'static str| {
        move |e: &serde_json::Value| {
            e["event"] == "state" && e["service"] == "engine" && e["to"] == state
        }
    };
    w.until(&sb, to("running"));
    w.until(&sb, to("stopped"));
    assert!(granted.elapsed() >= Duration::from_secs(1));
    assert!(
        sb.supd_log().contains("no CLOCK_BOOTTIME timers"),
        "{}",
        sb.supd_log()
    );
}

/// With cgroups but without `cgroup.kill` (Linux 4.19), a killed supd's guard ends a
/// leader-only run's daemon, which left the run's session, through `cgroup.procs`.
#[test]
fn a_guard_ends_a_leader_only_runs_daemon_without_cgroup_kill() {
    if skip_without_cgroup2() {
        return;
    }
    let mut sb = Sandbox::new();
    let pid_file = sb.path("daemon");
    let engine = sb.script(
        "engine.sh",
        &format!("{}\necho >&3\nexec sleep 3600", daemon(&pid_file, false)),
    );
    sb.config(&engine_section(&engine));
    start_old_hiding(&mut sb, "cgroup.kill,cgroup.freeze");
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": 1, "valid_for": "1h"}));
    let leader = pid_of(&sb.wait_state("engine", "running"));
    let daemon = wait_pid_file(&pid_file);
    assert_ne!(sup::proc::stat(daemon).expect("the daemon").session, leader);
    sb.stop_supd(Signal::SIGKILL);
    assert_all_end(&[leader, daemon], Duration::from_secs(2));
    // No supd is left to remove the run's (now empty) cgroups.
    if let Ok(root) = fs::read_to_string(sb.path("state/cgroup")) {
        let root = std::path::Path::new(root.trim());
        for e in fs::read_dir(root).into_iter().flatten().flatten() {
            let _ = fs::remove_dir(e.path());
        }
        let _ = fs::remove_dir(root);
    }
}

/// Before /dev is there (an init's first moments) on a kernel without getrandom (before
/// 3.17), nothing in supd may need random numbers (std's HashMap keys would panic when
/// /dev/urandom cannot be read): it serves and runs its services.
#[test]
fn supd_runs_without_getrandom_before_dev_exists() {
    if skip() {
        return;
    }
    if !is_root() {
        eprintln!("skipped: needs root for a mount namespace");
        return;
    }
    let mut sb = Sandbox::new();
    sb.config("[service.svc]\ncommand = [\"/bin/sleep\", \"3600\"]\n");
    let mut cmd = Command::new("unshare");
    cmd.args([
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount -t tmpfs none /dev && exec \"$0\" \"$@\"",
        SUPD,
    ]);
    linux_3_10(&mut cmd);
    sb.start_with(cmd, &["-c"]);
    let st = sb.wait_state("svc", "running");
    assert!(alive(pid_of(&st)), "{st}");
}
