use super::*;
use crate::config::{CrashLoop, Policy};
use std::time::Duration;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn at(n: u64) -> Mono {
    Mono(n * 1_000_000)
}

fn cfg() -> ServiceConfig {
    let mut c = ServiceConfig::new("t", vec!["/bin/t".into()], "/".into());
    c.policy = Policy {
        restart_delay: ms(10),
        restart_delay_max: ms(80),
        stable_after: ms(1000),
        crash_loop: CrashLoop {
            restarts: 3,
            window: ms(10_000),
        },
        cooldown: ms(5000),
        ..Policy::default()
    };
    c.stop_timeout = ms(300);
    c.ready_timeout = ms(2000);
    c
}

/// A service in `state`, wanted up, with a process (pid 7) where the state has one.
fn in_state(state: State) -> Service {
    let mut s = Service::new(Want::Up);
    s.state = state;
    if matches!(state, State::Starting | State::Running | State::Stopping) {
        s.pid = Some(7);
        s.started_at = Some(at(0));
    }
    s
}

struct Row {
    what: &'static str,
    from: State,
    cfg: fn(&mut ServiceConfig),
    event: Event,
    now: u64,
    to: State,
    actions: Vec<Action>,
    deadline: Option<u64>,
}

fn same(_: &mut ServiceConfig) {}

fn rows() -> Vec<Row> {
    use State::*;
    let term = Action::Signal(Signal::SIGTERM);
    vec![
        Row {
            what: "start a stopped service: pending",
            from: Stopped,
            cfg: same,
            event: Event::Start,
            now: 0,
            to: Stopped,
            actions: vec![],
            deadline: None,
        },
        Row {
            what: "spawned: starting until its exec, within ready_timeout",
            from: Stopped,
            cfg: same,
            event: Event::Spawned(7),
            now: 5,
            to: Starting,
            actions: vec![],
            deadline: Some(2005),
        },
        Row {
            what: "its program runs: ready at exec",
            from: Starting,
            cfg: same,
            event: Event::Execd,
            now: 6,
            to: Running,
            actions: vec![],
            deadline: None,
        },
        Row {
            what: "its program runs, notify: still waiting for READY=1",
            from: Starting,
            cfg: |c| c.ready = Ready::Notify,
            event: Event::Execd,
            now: 6,
            to: Starting,
            actions: vec![],
            deadline: None,
        },
        Row {
            what: "spawned, notify: wait with ready_timeout",
            from: Stopped,
            cfg: |c| c.ready = Ready::Notify,
            event: Event::Spawned(7),
            now: 5,
            to: Starting,
            actions: vec![],
            deadline: Some(2005),
        },
        Row {
            what: "ready",
            from: Starting,
            cfg: same,
            event: Event::Ready,
            now: 9,
            to: Running,
            actions: vec![],
            deadline: None,
        },
        Row {
            what: "ready twice is harmless",
            from: Running,
            cfg: same,
            event: Event::Ready,
            now: 9,
            to: Running,
            actions: vec![],
            deadline: None,
        },
        Row {
            what: "failure: backoff restart_delay",
            from: Running,
            cfg: same,
            event: Event::Exited(Exit::Code(1)),
            now: 50,
            to: Backoff,
            actions: vec![],
            deadline: Some(60),
        },
        Row {
            what: "killed by a signal is a failure",
            from: Running,
            cfg: same,
            event: Event::Exited(Exit::Signal(9)),
            now: 50,
            to: Backoff,
            actions: vec![],
            deadline: Some(60),
        },
        Row {
            what: "on-failure + success code: exited",
            from: Running,
            cfg: |c| {
                c.policy.restart = RestartMode::OnFailure;
                c.policy.success_codes = vec![0, 3];
            },
            event: Event::Exited(Exit::Code(3)),
            now: 50,
            to: Exited,
            actions: vec![],
            deadline: None,
        },
        Row {
            what: "on-failure + failure code: backoff",
            from: Running,
            cfg: |c| c.policy.restart = RestartMode::OnFailure,
            event: Event::Exited(Exit::Code(4)),
            now: 50,
            to: Backoff,
            actions: vec![],
            deadline: Some(60),
        },
        Row {
            what: "never + failure: failed",
            from: Running,
            cfg: |c| c.policy.restart = RestartMode::Never,
            event: Event::Exited(Exit::Code(1)),
            now: 50,
            to: Failed,
            actions: vec![],
            deadline: None,
        },
        Row {
            what: "one-shot done: exited (ready)",
            from: Starting,
            cfg: |c| {
                c.ready = Ready::Exited;
                c.policy.restart = RestartMode::Never;
            },
            event: Event::Exited(Exit::Code(0)),
            now: 50,
            to: Exited,
            actions: vec![],
            deadline: None,
        },
        Row {
            what: "zero delay: pending at once",
            from: Running,
            cfg: |c| c.policy.restart_delay = Duration::ZERO,
            event: Event::Exited(Exit::Code(1)),
            now: 50,
            to: Stopped,
            actions: vec![],
            deadline: None,
        },
        Row {
            what: "spawn failure counts as a failure",
            from: Stopped,
            cfg: same,
            event: Event::SpawnFailed("ENOENT".into()),
            now: 5,
            to: Backoff,
            actions: vec![],
            deadline: Some(15),
        },
        Row {
            what: "zero delay: a failed spawn still waits, not retried at once",
            from: Stopped,
            cfg: |c| c.policy.restart_delay = Duration::ZERO,
            event: Event::SpawnFailed("ENOENT".into()),
            now: 5,
            to: Backoff,
            actions: vec![],
            deadline: Some(105),
        },
        Row {
            what: "backoff over: pending",
            from: Backoff,
            cfg: same,
            event: Event::Timer,
            now: 60,
            to: Stopped,
            actions: vec![],
            deadline: None,
        },
        Row {
            what: "cooldown over: pending",
            from: Cooldown,
            cfg: same,
            event: Event::Timer,
            now: 60,
            to: Stopped,
            actions: vec![],
            deadline: None,
        },
        Row {
            what: "stop a running service",
            from: Running,
            cfg: same,
            event: Event::Stop,
            now: 100,
            to: Stopping,
            actions: vec![term.clone()],
            deadline: Some(400),
        },
        Row {
            what: "stop uses stop_signal",
            from: Running,
            cfg: |c| c.stop_signal = Signal::SIGINT,
            event: Event::Stop,
            now: 100,
            to: Stopping,
            actions: vec![Action::Signal(Signal::SIGINT)],
            deadline: Some(400),
        },
        Row {
            what: "stop_timeout: SIGKILL, and KILL_WAIT for it to work",
            from: Stopping,
            cfg: same,
            event: Event::Timer,
            now: 400,
            to: Stopping,
            actions: vec![Action::Signal(Signal::SIGKILL)],
            deadline: Some(400 + KILL_WAIT.as_millis() as u64),
        },
        Row {
            what: "stop during backoff: stopped",
            from: Backoff,
            cfg: same,
            event: Event::Stop,
            now: 20,
            to: Stopped,
            actions: vec![],
            deadline: None,
        },
        Row {
            what: "restart a running service",
            from: Running,
            cfg: same,
            event: Event::Restart,
            now: 100,
            to: Stopping,
            actions: vec![term.clone()],
            deadline: Some(400),
        },
        Row {
            what: "ready timeout: stop it",
            from: Starting,
            cfg: |c| c.ready = Ready::Notify,
            event: Event::Timer,
            now: 2000,
            to: Stopping,
            actions: vec![term, Action::NotReady("not ready within 2s".into())],
            deadline: Some(2300),
        },
        Row {
            what: "start a failed service: pending",
            from: Failed,
            cfg: same,
            event: Event::Start,
            now: 0,
            to: Stopped,
            actions: vec![],
            deadline: None,
        },
        Row {
            what: "start while running: nothing",
            from: Running,
            cfg: same,
            event: Event::Start,
            now: 0,
            to: Running,
            actions: vec![],
            deadline: None,
        },
    ]
}

#[test]
fn transitions() {
    for row in rows() {
        let mut c = cfg();
        (row.cfg)(&mut c);
        let mut s = in_state(row.from);
        if row.from == State::Stopping {
            s.deadline = Some(at(400));
        }
        let actions = s.step(&c, row.event.clone(), at(row.now));
        assert_eq!(s.state, row.to, "{}: state", row.what);
        assert_eq!(actions, row.actions, "{}: actions", row.what);
        assert_eq!(s.deadline, row.deadline.map(at), "{}: deadline", row.what);
    }
}

#[test]
fn stop_then_exit_stays_down_and_restart_then_exit_is_pending() {
    let c = cfg();
    let mut s = in_state(State::Running);
    s.step(&c, Event::Stop, at(10));
    s.step(&c, Event::Exited(Exit::Signal(15)), at(20));
    assert_eq!((s.state, s.want, s.pid), (State::Stopped, Want::Down, None));
    assert!(!s.pending());
    assert_eq!(s.restarts, 0, "an operator's stop is not a restart");

    let mut s = in_state(State::Running);
    s.step(&c, Event::Restart, at(10));
    s.step(&c, Event::Exited(Exit::Signal(15)), at(20));
    assert_eq!(s.state, State::Stopped);
    assert!(s.pending());
}

#[test]
fn ready_timeout_counts_as_a_failed_start() {
    let mut c = cfg();
    c.ready = Ready::Notify;
    let mut s = in_state(State::Starting);
    s.step(&c, Event::Timer, at(2000));
    let actions = s.step(&c, Event::Exited(Exit::Signal(15)), at(2010));
    assert_eq!(actions, vec![]);
    assert_eq!(s.state, State::Backoff);
    assert_eq!(s.history.streak, 1);
    assert!(
        s.reason
            .as_deref()
            .unwrap_or("")
            .starts_with("not ready within 2s"),
        "{:?}",
        s.reason
    );
}

/// Runs a service that fails every time it starts until the machine stops restarting it.
fn crash_until_settled(c: &ServiceConfig) -> (Service, Vec<Action>, u32) {
    let mut s = Service::new(Want::Up);
    let mut now = 0;
    for starts in 1..100 {
        s.step(c, Event::Spawned(100 + starts), at(now));
        s.step(c, Event::Execd, at(now));
        now += 1;
        let actions = s.step(c, Event::Exited(Exit::Code(2)), at(now));
        if s.state != State::Backoff {
            return (s, actions, starts as u32);
        }
        assert_eq!(
            s.step(c, Event::Timer, s.deadline.expect("backoff deadline")),
            vec![]
        );
        now = s
            .deadline
            .map(|d| d.0 / 1_000_000)
            .unwrap_or(now)
            .max(now + 100);
    }
    panic!("never settled");
}

#[test]
fn crash_loop_outcomes() {
    let mut c = cfg();
    let (s, actions, starts) = crash_until_settled(&c);
    assert_eq!((s.state, starts, s.restarts), (State::Cooldown, 4, 3));
    let lp = |a: &[Action]| matches!(a.first(), Some(Action::CrashLoop(r)) if r.starts_with("crash loop: 3 restarts within"));
    assert!(lp(&actions) && actions.len() == 1, "{actions:?}");
    assert!(
        s.reason
            .as_deref()
            .unwrap_or("")
            .starts_with("crash loop: 3 restarts within"),
        "{:?}",
        s.reason
    );
    assert!(s.deadline.is_some());

    c.policy.on_crash_loop = OnCrashLoop::Stop;
    let (s, actions, _) = crash_until_settled(&c);
    assert_eq!(
        (s.state, actions.len(), s.deadline),
        (State::Failed, 1, None)
    );
    assert!(lp(&actions), "{actions:?}");

    c.policy.on_crash_loop = OnCrashLoop::Shutdown;
    let (s, actions, _) = crash_until_settled(&c);
    assert_eq!(s.state, State::Failed);
    assert!(
        lp(&actions) && actions[1..] == [Action::Shutdown(1)],
        "{actions:?}"
    );
}

#[test]
fn after_cooldown_the_history_is_fresh() {
    let c = cfg();
    let (mut s, _, _) = crash_until_settled(&c);
    let until = s.deadline.expect("cooldown deadline");
    s.step(&c, Event::Timer, until);
    assert!(s.pending());
    assert_eq!(s.history.streak, 0);
    s.step(&c, Event::Spawned(9), until);
    s.step(&c, Event::Execd, until);
    s.step(&c, Event::Exited(Exit::Code(1)), until.plus(ms(1)));
    assert_eq!(s.state, State::Backoff);
    assert_eq!(s.deadline, Some(until.plus(ms(11))), "first delay again");
}

#[test]
fn a_changed_definition_ends_a_cooldown_or_backoff_at_once() {
    let c = cfg();
    let (mut s, _, _) = crash_until_settled(&c);
    assert_eq!(s.state, State::Cooldown);
    let now = at(20);
    s.step(&c, Event::Changed, now);
    assert!(s.pending(), "{s:?}");
    assert_eq!((s.deadline, s.history.streak), (None, 0));
    let mut b = in_state(State::Backoff);
    b.deadline = Some(at(500));
    b.step(&c, Event::Changed, now);
    assert!(b.pending());
    // Stopped by the operator, running, or finished: nothing to do.
    for state in [State::Running, State::Exited, State::Stopped] {
        let mut x = in_state(state);
        assert!(x.step(&c, Event::Changed, now).is_empty());
        assert_eq!(x.state, state);
    }
    let mut down = in_state(State::Cooldown);
    down.want = Want::Down;
    down.step(&c, Event::Changed, now);
    assert_eq!(down.state, State::Cooldown);
}

#[test]
fn readiness_for_dependents() {
    let mut c = cfg();
    assert!(in_state(State::Running).is_ready(&c));
    assert!(!in_state(State::Starting).is_ready(&c));
    assert!(!in_state(State::Exited).is_ready(&c));
    c.ready = Ready::Exited;
    assert!(in_state(State::Exited).is_ready(&c));
}

#[test]
fn an_unhealthy_service_is_stopped_then_restarted_as_a_failure_counted_for_the_crash_loop() {
    let c = cfg();
    let mut s = in_state(State::Running);
    let why = "health: 3 failures: HTTP 500 from 127.0.0.1:8080/healthz".to_string();
    let actions = s.step(&c, Event::Unhealthy(why.clone()), at(500));
    assert_eq!(
        actions,
        vec![
            Action::Signal(c.stop_signal),
            Action::Unhealthy(why.clone())
        ]
    );
    assert_eq!(s.state, State::Stopping);
    assert_eq!(s.deadline, Some(at(800)), "SIGKILL after stop_timeout");
    s.step(&c, Event::Exited(Exit::Signal(15)), at(510));
    assert_eq!(s.state, State::Backoff);
    assert_eq!(s.history.streak, 1);
    assert_eq!(s.restarts, 1);
    assert!(
        s.reason.as_deref().unwrap_or("").starts_with(&why),
        "{:?}",
        s.reason
    );
    // Not up: a late verdict changes nothing.
    assert_eq!(s.step(&c, Event::Unhealthy(why), at(520)), vec![]);
    assert_eq!(s.state, State::Backoff);
}

#[test]
fn a_run_that_outlives_sigkill_is_killed_again_on_a_backoff_and_waited_for() {
    let c = cfg();
    let kill = || vec![Action::Signal(Signal::SIGKILL)];
    let mut s = in_state(State::Running);
    s.step(&c, Event::Stop, at(0));
    assert_eq!(s.step(&c, Event::Timer, at(300)), kill());
    assert_eq!(s.deadline, Some(at(300).plus(KILL_WAIT)));
    assert_eq!(s.unkillable(), None, "given KILL_WAIT to die first");
    let mut waits = Vec::new();
    for _ in 0..6 {
        let now = s.deadline.expect("a deadline: the KILL is sent again");
        assert_eq!(s.step(&c, Event::Timer, now), kill());
        waits.push(s.deadline.expect("again").since(now).as_secs());
    }
    assert_eq!(waits, [10, 20, 40, 60, 60, 60], "a backoff, never a loop");
    assert_eq!(s.unkillable(), Some(at(300)), "since the first SIGKILL");
    assert_eq!(s.state, State::Stopping, "no deadline ends the stop");
    // A start meanwhile waits for the end of the run: never two instances.
    s.step(&c, Event::Start, at(200_000));
    assert_eq!((s.state, s.pending()), (State::Stopping, false));
    s.step(&c, Event::Exited(Exit::Signal(9)), at(300_000));
    assert_eq!((s.state, s.pending()), (State::Stopped, true));
    assert_eq!((s.unkillable(), s.kills, s.killed_at), (None, 0, None));
}

#[test]
fn a_success_exit_leaving_processes_behind_is_a_daemonized_failure() {
    let mut c = cfg();
    c.command = vec!["/usr/bin/redis-server".into()];
    c.policy.restart = RestartMode::OnFailure;
    // Exited with 0, others left: a failure, named, restarted on the backoff.
    let mut s = in_state(State::Running);
    s.step(&c, Event::Daemonized(Exit::Code(0), Some(2)), at(50));
    assert_eq!(s.state, State::Backoff, "on-failure restarts it: a failure");
    let why = s.reason.clone().unwrap_or_default();
    assert!(
        why.contains("forked into the background: run it in the foreground")
            && why.contains("daemonize no")
            && why.contains("2 other processes"),
        "{why}"
    );
    assert_eq!(s.history.streak, 1, "counted as a failure");
    // The same exit with nothing left is a success: on-failure does not restart it.
    let mut s = in_state(State::Running);
    s.step(&c, Event::Exited(Exit::Code(0)), at(50));
    assert_eq!(s.state, State::Exited);
    // A failing code with others left is the failure it was, not named daemonized.
    let mut s = in_state(State::Starting);
    s.step(&c, Event::Daemonized(Exit::Code(3), Some(1)), at(50));
    assert_eq!(s.state, State::Backoff);
    assert!(!s.reason.unwrap_or_default().contains("forked"));
    // Stopping: the stop's own end, whatever was left.
    let mut s = in_state(State::Stopping);
    s.want = Want::Down;
    s.step(&c, Event::Daemonized(Exit::Code(0), Some(1)), at(50));
    assert_eq!(s.state, State::Stopped);
    // Daemonized ones count toward the crash loop.
    let mut s = in_state(State::Running);
    let mut loops = 0;
    for i in 0..6 {
        s.state = State::Running;
        s.pid = Some(7);
        let acts = s.step(&c, Event::Daemonized(Exit::Code(0), Some(1)), at(100 * i));
        loops += acts
            .iter()
            .filter(|a| matches!(a, Action::CrashLoop(_)))
            .count();
    }
    assert!(
        loops >= 1,
        "a crash loop after {} restarts",
        c.policy.crash_loop.restarts
    );
}

#[test]
fn a_one_shot_that_exits_0_leaving_others_is_a_success() {
    let mut c = cfg();
    c.ready = Ready::Exited;
    c.policy.restart = RestartMode::OnFailure;
    let mut s = in_state(State::Starting);
    s.step(&c, Event::Daemonized(Exit::Code(0), Some(1)), at(50));
    assert_eq!(s.state, State::Exited, "its exit is its contract");
    let why = s.reason.clone().unwrap_or_default();
    assert!(
        !why.contains("forked") && why.contains("ended with it"),
        "{why}"
    );
    assert_eq!(s.history.streak, 0, "not counted as a failure");
    // A failing code stays the failure it was.
    let mut s = in_state(State::Starting);
    s.step(&c, Event::Daemonized(Exit::Code(1), Some(1)), at(50));
    assert_eq!(s.state, State::Backoff);
}
