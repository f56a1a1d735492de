//! System mode as PID 1 of a PID namespace: `poweroff` stops services in order, then
//! TERM and KILL to every stray process, sync, and `reboot(2)`, which ends the namespace.

mod common;
use common::*;
use std::process::Command;

#[test]
fn poweroff_stops_services_in_order_then_every_stray_and_ends_the_namespace() {
    if !is_root() {
        eprintln!("skipped: needs root for unshare --pid");
        return;
    }
    let mut sb = Sandbox::new();
    let order = sb.path("order");
    let stray = sb.path("stray.pid");
    let svc = |name: &str| {
        sb.script(&format!("{name}.sh"), &format!("trap 'echo {name} >> {}; exit 0' TERM\necho >&3\nwhile :; do /bin/sleep 1 & wait; done", order.display()))
    };
    let (db, web) = (svc("db"), svc("web"));
    // A stray: its own session (out of its service's group), ignoring TERM.
    let spawner = sb.script(
        "spawner.sh",
        &format!("setsid /bin/sh -c 'trap \"\" TERM; echo $$ > {p}.tmp; mv {p}.tmp {p}; while :; do /bin/sleep 1; done' &\nexec /bin/sleep 3600", p = stray.display()),
    );
    sb.config(&format!(
        "[service.db]\ncommand = [\"{db}\"]\nready = \"fd:3\"\n\n[service.web]\ncommand = [\"{web}\"]\nready = \"fd:3\"\nafter = [\"db\"]\n\n\
         [service.spawner]\ncommand = [\"{spawner}\"]\n"
    ));
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", SUPD, "--system"]);
    sb.start_with(cmd, &["-c"]);
    sb.wait_state("web", "running");
    sb.wait_state("spawner", "running");
    let end = std::time::Instant::now() + DEADLINE;
    while !stray.exists() {
        assert!(std::time::Instant::now() < end, "the stray never started");
        sb.status("spawner");
    }
    let out = sb.supctl(&["poweroff"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let unshare = sb.supd_pid();
    assert!(
        wait_exit(unshare, DEADLINE).is_some(),
        "the namespace did not end\n{}",
        sb.supd_log()
    );
    let _ = sb.supd.take().expect("unshare").wait();
    let text = std::fs::read_to_string(&order).expect("order");
    assert_eq!(
        text.lines().collect::<Vec<_>>(),
        ["web", "db"],
        "reverse `after` order"
    );
    let log = sb.supd_log();
    for step in [
        "poweroff: stopping every service",
        "sending TERM to every remaining process",
        "sending KILL to what is left",
        "calling reboot(2)",
    ] {
        assert!(log.contains(step), "missing '{step}' in\n{log}");
    }
}

#[test]
fn poweroff_is_refused_outside_system_mode() {
    let mut sb = Sandbox::new();
    sb.config("[service.a]\ncommand = [\"/bin/sleep\", \"3600\"]\n");
    sb.start();
    let out = sb.supctl(&["poweroff"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("system mode"));
    sb.wait_state("a", "running");
}

/// `--system` outside PID 1 (here: a PID namespace whose init is a shell) ends its own
/// services and exits; a process it did not start is never signalled.
#[test]
fn system_mode_outside_pid_1_signals_nobody_else() {
    if !is_root() {
        eprintln!("skipped: needs root for unshare --pid");
        return;
    }
    let mut sb = Sandbox::new();
    sb.config("[service.a]\ncommand = [\"/bin/sleep\", \"3600\"]\n");
    let d = sb.dir.display().to_string();
    let script = format!(
        "/bin/sleep 3600 & b=$!\n\"$0\" \"$@\"\nif kill -0 $b 2>/dev/null; then echo alive; else echo killed; fi > {d}/bystander\nkill $b"
    );
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--pid",
        "--fork",
        "--mount-proc",
        "sh",
        "-c",
        &script,
        SUPD,
        "--system",
    ]);
    sb.start_with(cmd, &["-c"]);
    sb.wait_state("a", "running");
    let out = sb.supctl(&["poweroff"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        wait_exit(sb.supd_pid(), DEADLINE).is_some(),
        "supd did not exit\n{}",
        sb.supd_log()
    );
    let _ = sb.supd.take().expect("unshare").wait();
    assert_eq!(
        std::fs::read_to_string(sb.path("bystander"))
            .expect("result")
            .trim(),
        "alive",
        "a process supd did not start was signalled\n{}",
        sb.supd_log()
    );
    assert!(sb.supd_log().contains("not PID 1"));
}
