//! The loop keeps going round: nothing one service does holds up another's restart or a
//! control answer (issue 10).

mod common;
use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;
use std::time::{Duration, Instant};

/// How long one `status` round trip takes.
fn status_time(sb: &Sandbox) -> Duration {
    let t = Instant::now();
    sb.ok(json!({"cmd": "status"}));
    t.elapsed()
}

#[test]
fn a_start_that_fails_at_once_with_zero_delay_does_not_spin() {
    let mut sb = Sandbox::new();
    sb.config(
        "[service.spin]\ncommand = [\"/nonexistent/program\"]\nrestart_delay = \"0s\"\n\
         crash_loop = { restarts = 100000, window = \"1h\" }\n\n\
         [service.other]\ncommand = [\"/bin/sleep\", \"3600\"]\nrestart_delay = \"0s\"\n",
    );
    sb.start();
    let first = sb.wait_state("other", "running")["pid"]
        .as_i64()
        .expect("pid") as i32;
    let mut w = sb.watch();
    let begun = Instant::now();
    let slowest = (0..20).map(|_| status_time(&sb)).max().unwrap_or_default();
    kill(Pid::from_raw(first), Signal::SIGKILL).expect("kill other");
    let killed = Instant::now();
    let again = w.until(&sb, |e| {
        e["service"] == "other" && e["to"] == "running" && e["pid"].as_i64() != Some(first as i64)
    });
    let restart = killed.elapsed();
    // Four more failed starts of `spin` take at least 300 ms: 100 ms between tries.
    let before = sb.status("spin")["restarts"].as_u64().expect("restarts");
    let t = Instant::now();
    for _ in 0..4 {
        w.until(&sb, |e| e["service"] == "spin" && e["to"] == "backoff");
    }
    let four = t.elapsed();
    assert!(four >= Duration::from_millis(300), "4 tries in {four:?}");
    let attempts = sb.status("spin")["restarts"].as_u64().expect("restarts");
    assert!(attempts >= before + 4);
    let window = begun.elapsed();
    eprintln!(
        "slowest status {slowest:?}; other restarted in {restart:?} ({again}); spin tried {attempts} times in {window:?}"
    );
    assert!(
        slowest < Duration::from_millis(500),
        "status took {slowest:?}"
    );
    assert!(
        restart < Duration::from_millis(500),
        "restart took {restart:?}"
    );
    // At most one try per 100 ms, plus the first.
    let bound = window.as_millis() as u64 / 100 + 5;
    assert!(
        attempts <= bound,
        "a failing start was retried {attempts} times in {window:?}"
    );
}
