//! Restart policy against real processes: backoff that doubles, crash loops, success
//! codes, and programs that cannot start.

mod common;
use common::*;
use serde_json::json;

#[test]
fn restart_delays_double_up_to_the_max() {
    let mut sb = Sandbox::new();
    sb.config(
        r#"
[service.fail]
command = ["/bin/sh", "-c", "exit 1"]
restart_delay = "40ms"
restart_delay_max = "320ms"
crash_loop = { restarts = 1000, window = "1m" }
"#,
    );
    sb.start();
    let mut w = sb.watch();
    // Collect six backoffs with the starts that follow them.
    let mut gaps = Vec::new();
    let mut reasons = Vec::new();
    for _ in 0..6 {
        let b = w.state(&sb, "fail", "backoff");
        let r = w.state(&sb, "fail", "running");
        reasons.push(b["reason"].as_str().unwrap_or("").to_string());
        gaps.push(
            r["time"]
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(b["time"].as_u64().unwrap_or(0)),
        );
    }
    // The first event seen may belong to any streak position; find where the sequence of
    // reasons is: 40, 80, 160, 320, 320, ... from there on.
    let delays = ["40ms", "80ms", "160ms", "320ms"];
    let start = delays
        .iter()
        .position(|d| reasons[0].ends_with(&format!("restarting in {d}")))
        .expect("a known delay");
    for (i, reason) in reasons.iter().enumerate() {
        let expected = delays[(start + i).min(3)];
        assert!(
            reason.starts_with("exited with code 1; restarting in "),
            "{reason}"
        );
        assert!(
            reason.ends_with(expected),
            "restart {i}: expected {expected}, got {reason}; all: {reasons:?}"
        );
        let ms: u64 = expected.trim_end_matches("ms").parse().expect("ms");
        // Event times are whole milliseconds: allow one of rounding.
        assert!(
            gaps[i] + 1 >= ms,
            "restart {i} came after {}ms, before its delay of {ms}ms",
            gaps[i]
        );
    }
    let st = sb.status("fail");
    assert!(st["restarts"].as_u64().unwrap_or(0) >= 6, "{st}");
    assert_eq!(st["last_exit"], json!({"code": 1}));
}

#[test]
fn a_crash_loop_cools_down_then_tries_again() {
    let mut sb = Sandbox::new();
    sb.config(
        r#"
[service.loop]
command = ["/bin/sh", "-c", "exit 2"]
restart_delay = "10ms"
crash_loop = { restarts = 3, window = "1m" }
on_crash_loop = "cooldown"
cooldown = "700ms"
"#,
    );
    sb.start();
    let mut w = sb.watch();
    let cool = sb.wait_state("loop", "cooldown");
    assert!(
        cool["reason"]
            .as_str()
            .unwrap_or("")
            .starts_with("crash loop: 3 restarts within"),
        "{cool}"
    );
    assert_eq!(cool["restarts"], 3);
    let entered = w
        .seen
        .iter()
        .rev()
        .find(|e| e["to"] == "cooldown")
        .map(|e| e["time"].as_u64().unwrap_or(0));
    let again = w.state(&sb, "loop", "running");
    if let Some(t) = entered {
        let waited = again["time"].as_u64().unwrap_or(0) - t;
        assert!(
            waited + 1 >= 700,
            "tried again after {waited}ms, before the cooldown of 700ms"
        );
    }
}

#[test]
fn a_crash_loop_with_stop_fails_for_good() {
    let mut sb = Sandbox::new();
    sb.config(
        r#"
[service.loop]
command = ["/bin/sh", "-c", "exit 2"]
restart_delay = "10ms"
crash_loop = { restarts = 4, window = "1m" }
on_crash_loop = "stop"
"#,
    );
    sb.start();
    let st = sb.wait_state("loop", "failed");
    assert_eq!(st["restarts"], 4);
    assert!(
        st["reason"].as_str().unwrap_or("").ends_with("gave up"),
        "{st}"
    );
    assert_eq!(st["pid"], json!(null));
    // An operator's start gives it a fresh try. `start` answers once the service is up
    // or clearly is not: this one exits at once, so either answer may come, but the new
    // run must.
    let mut w = sb.watch();
    let answer = sb.request(json!({"cmd": "start", "service": "loop"}));
    assert!(
        answer["ok"] == true
            || answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("exited with code 2")),
        "{answer}"
    );
    w.state(&sb, "loop", "running");
}

#[test]
fn crash_loop_shutdown_ends_supd_with_status_1() {
    let mut sb = Sandbox::new();
    sb.config(
        r#"
[service.loop]
command = ["/bin/sh", "-c", "exit 2"]
restart_delay = "10ms"
crash_loop = { restarts = 2, window = "1m" }
on_crash_loop = "shutdown"

[service.bystander]
command = ["/bin/sleep", "3600"]
"#,
    );
    sb.start();
    let pid = sb.supd_pid();
    assert!(
        wait_exit(pid, DEADLINE).is_some(),
        "supd did not exit\n{}",
        sb.supd_log()
    );
    let status = sb.supd.take().expect("child").wait().expect("wait");
    assert_eq!(status.code(), Some(1), "{}", sb.supd_log());
    assert!(
        sb.supd_log().contains("shutting down supd"),
        "{}",
        sb.supd_log()
    );
}

#[test]
fn on_failure_respects_success_codes() {
    let mut sb = Sandbox::new();
    sb.config(
        r#"
[service.done]
command = ["/bin/sh", "-c", "exit 3"]
restart = "on-failure"
success_codes = [0, 3]
restart_delay = "10ms"

[service.broken]
command = ["/bin/sh", "-c", "exit 4"]
restart = "on-failure"
success_codes = [0, 3]
restart_delay = "10ms"
crash_loop = { restarts = 2, window = "1m" }
on_crash_loop = "stop"

[service.once]
command = ["/bin/sh", "-c", "exit 5"]
restart = "never"
"#,
    );
    sb.start();
    let done = sb.wait_state("done", "exited");
    assert_eq!(
        (done["restarts"].clone(), done["last_exit"].clone()),
        (json!(0), json!({"code": 3}))
    );
    let broken = sb.wait_state("broken", "failed");
    assert_eq!(
        broken["restarts"], 2,
        "a failure code is restarted: {broken}"
    );
    let once = sb.wait_state("once", "failed");
    assert_eq!(once["restarts"], 0);
    assert!(
        once["reason"]
            .as_str()
            .unwrap_or("")
            .contains("not restarted"),
        "{once}"
    );
}

#[test]
fn a_missing_program_is_a_failed_start_with_its_reason() {
    let mut sb = Sandbox::new();
    sb.config(
        r#"
[service.ghost]
command = ["/nonexistent/program", "--flag"]
restart_delay = "10ms"
crash_loop = { restarts = 2, window = "1m" }
on_crash_loop = "stop"

[service.noexec]
command = ["./not-executable.sh"]
restart_delay = "10ms"
crash_loop = { restarts = 1, window = "1m" }
on_crash_loop = "stop"

[service.nobody]
command = ["/bin/true"]
user = "no-such-user-for-sup"
restart_delay = "10ms"
crash_loop = { restarts = 1, window = "1m" }
on_crash_loop = "stop"
"#,
    );
    std::fs::write(sb.path("not-executable.sh"), "#!/bin/sh\n").expect("write");
    sb.start();
    let st = sb.wait_state("ghost", "failed");
    let reason = st["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("cannot start: /nonexistent/program: No such file or directory"),
        "{reason}"
    );
    assert_eq!(
        st["restarts"], 2,
        "failed starts count toward the crash loop"
    );
    let st = sb.wait_state("noexec", "failed");
    assert!(
        st["reason"]
            .as_str()
            .unwrap_or("")
            .contains("permission denied: user 'root' may not execute"),
        "{st}"
    );
    let st = sb.wait_state("nobody", "failed");
    assert!(
        st["reason"]
            .as_str()
            .unwrap_or("")
            .contains("unknown user 'no-such-user-for-sup'"),
        "{st}"
    );
    // supd itself is fine.
    assert_eq!(sb.ok(json!({"cmd": "hello"}))["protocol"], 1);
}

/// A leader's exit wakes supd through its pidfd and is reaped by pid: the scan of all
/// children (which the kernel makes by walking every one) is not what finds it. Kernels
/// without pidfds (the Linux 3.10 reruns) find it by the scan.
#[test]
fn a_leaders_exit_is_found_through_its_pidfd() {
    let mut sb = Sandbox::new();
    sb.config(
        r#"
[service.a]
command = ["/bin/sleep", "1000"]
restart_delay = "10ms"

[service.b]
command = ["/bin/sleep", "1000"]
"#,
    );
    sb.start();
    let first = sb.wait_state("a", "running")["pid"].as_i64().expect("pid") as i32;
    sb.wait_state("b", "running");
    let mut w = sb.watch();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill a");
    let again = w.until(&sb, |e| {
        e["service"] == "a" && e["to"] == "running" && e["pid"].as_i64() != Some(first as i64)
    });
    assert!(again["pid"].as_i64().is_some());
    let log = sb.supd_log();
    let reaped = format!("a: reaped its leader {first} ");
    let line = log
        .lines()
        .find(|l| l.contains(&reaped))
        .unwrap_or_else(|| panic!("no line says how {first} was reaped:\n{log}"));
    let old_kernel =
        std::env::var_os("SUP_TEST_LINUX_3_10").is_some() && common::oldkernel::supported();
    let how = if old_kernel {
        "in a scan of all children"
    } else {
        "by its pidfd"
    };
    assert!(line.contains(how), "{first} was not reaped {how}: {line}");
}
