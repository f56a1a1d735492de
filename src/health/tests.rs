use super::*;
use crate::config::{Check, HealthConfig};

fn cfg() -> HealthConfig {
    let mut h = HealthConfig::new(Check::Tcp("127.0.0.1:8080".parse().expect("addr")));
    h.interval = Duration::from_secs(10);
    h.timeout = Duration::from_secs(2);
    h.failures = 3;
    h.start_delay = Duration::from_secs(5);
    h
}

fn at(s: u64) -> Mono {
    Mono(s * 1_000_000_000)
}

#[test]
fn the_first_run_comes_after_the_start_delay_then_every_interval() {
    let c = cfg();
    let mut s = CheckState::default();
    assert_eq!(s.deadline(), None, "not started: nothing to wake for");
    s.start(&c, at(100));
    assert_eq!(s.health, Health::Unknown);
    assert!(!s.due(at(104)));
    assert!(s.due(at(105)));
    s.begin(&c, at(105));
    assert_eq!(s.deadline(), Some(at(107)), "the run's timeout comes first");
    assert_eq!(
        s.finish(&c, Ok(()), at(106), 1).map(|c| c.to),
        Some(Health::Healthy)
    );
    assert_eq!(s.deadline(), Some(at(115)));
    assert!(!s.due(at(114)));
    assert!(s.due(at(115)));
}

#[test]
fn a_run_under_way_is_never_started_again_and_missed_turns_are_skipped() {
    let mut c = cfg();
    c.timeout = Duration::from_secs(25); // longer than the interval
    let mut s = CheckState::default();
    s.start(&c, at(0));
    s.begin(&c, at(5));
    assert!(!s.due(at(15)), "due, but the run is still under way");
    assert!(!s.due(at(29)));
    assert_eq!(s.deadline(), Some(at(30)));
    s.finish(&c, Ok(()), at(27), 1);
    // due at 15 and 25 were missed: the next is 35, not at once
    assert_eq!(s.next_due, Some(at(35)));
}

#[test]
fn failures_count_consecutively_and_the_threshold_gives_one_verdict() {
    let c = cfg();
    let mut s = CheckState::default();
    s.start(&c, at(0));
    let run = |s: &mut CheckState, t: u64, r: Result<(), String>| {
        s.begin(&c, at(t));
        s.finish(&c, r, at(t + 1), t * 1000)
    };
    assert_eq!(run(&mut s, 5, Err("HTTP 500 from x".into())), None);
    assert_eq!(s.failures, 1);
    assert_eq!(s.health, Health::Unknown);
    assert_eq!(run(&mut s, 15, Err("HTTP 500 from x".into())), None);
    let v = run(&mut s, 25, Err("HTTP 500 from x".into())).expect("verdict");
    assert_eq!(v.to, Health::Unhealthy);
    assert_eq!(
        v.reason.as_deref(),
        Some("health: 3 failures: HTTP 500 from x")
    );
    assert_eq!(s.unhealthy_since_ms, Some(25_000));
    assert_eq!(s.last_failure.as_ref().map(|f| f.time_ms), Some(25_000));
    // No second verdict while it stays unhealthy.
    assert_eq!(run(&mut s, 35, Err("HTTP 500 from x".into())), None);
    // A success mends it.
    let back = run(&mut s, 45, Ok(())).expect("change");
    assert_eq!((back.from, back.to), (Health::Unhealthy, Health::Healthy));
    assert_eq!(s.failures, 0);
}

#[test]
fn a_flaky_failure_below_the_threshold_keeps_it_healthy_and_is_forgotten_on_success() {
    let c = cfg();
    let mut s = CheckState::default();
    s.start(&c, at(0));
    s.begin(&c, at(5));
    s.finish(&c, Ok(()), at(5), 0);
    s.begin(&c, at(15));
    assert_eq!(s.finish(&c, Err("refused".into()), at(15), 0), None);
    assert_eq!(s.health, Health::Healthy);
    s.begin(&c, at(25));
    assert_eq!(s.finish(&c, Ok(()), at(25), 0), None);
    assert_eq!(s.failures, 0);
    assert_eq!(
        s.last_failure.as_ref().map(|f| f.reason.as_str()),
        Some("refused")
    );
}

#[test]
fn a_run_past_its_timeout_has_timed_out_and_a_late_result_is_ignored() {
    let c = cfg();
    let mut s = CheckState::default();
    s.start(&c, at(0));
    s.begin(&c, at(5));
    assert!(!s.timed_out(at(6)));
    assert!(s.timed_out(at(7)));
    s.finish(&c, Err(CheckState::timeout_reason(&c)), at(7), 0);
    assert_eq!(
        s.last_failure.as_ref().map(|f| f.reason.as_str()),
        Some("no answer from 127.0.0.1:8080 within 2s")
    );
    assert_eq!(s.finish(&c, Ok(()), at(8), 0), None, "no run under way");
    assert_eq!(s.successes, 0);
}

#[test]
fn a_start_resets_the_verdict_but_keeps_the_last_failure_and_a_stop_ends_the_runs() {
    let mut c = cfg();
    c.failures = 1;
    let mut s = CheckState::default();
    s.start(&c, at(0));
    s.begin(&c, at(5));
    assert!(s.finish(&c, Err("x".into()), at(5), 7).is_some());
    s.stop();
    assert_eq!(s.deadline(), None);
    assert_eq!(s.health, Health::Unhealthy, "shown until the next start");
    s.start(&c, at(50));
    assert_eq!(s.health, Health::Unknown);
    assert_eq!(s.failures, 0);
    assert!(s.last_failure.is_some());
    assert_eq!(s.unhealthy_since_ms, Some(7));
}

#[test]
fn the_watchdog_fires_once_unless_pinged_and_not_while_disarmed() {
    let d = Duration::from_secs(30);
    let mut w = Watchdog::default();
    w.ping(d, at(0));
    assert_eq!(w.deadline, None, "a ping does not arm it");
    w.start(d, at(0));
    w.ping(d, at(20));
    assert_eq!(w.expired(d, at(49)), None);
    assert_eq!(
        w.expired(d, at(50)).as_deref(),
        Some("watchdog: no WATCHDOG=1 within 30s")
    );
    assert_eq!(w.expired(d, at(90)), None, "one verdict");
    w.start(d, at(100));
    w.stop();
    assert_eq!(w.expired(d, at(200)), None);
}
