//! Health: the rule of one service's check and watchdog, as plain data over time.
//!
//! A check runs first `start_delay` after the service's start, then every `interval`
//! from the start of one run to the start of the next. A run still under way when the
//! next is due is not started twice: the missed turns are skipped. A run longer than
//! `timeout` is a failure. `failures` consecutive failures make the service unhealthy
//! (a verdict the supervisor acts on: the service is stopped and restarted, or its
//! probation fails); a success makes it healthy again. The watchdog is a deadline that
//! each `WATCHDOG=1` pushes back. No I/O and no clock here: the runners are in
//! `health/run.rs`, the part that holds a service's check and watchdog for its run is
//! `health/watch.rs`, `now` comes from the loop.

pub mod run;
mod watch;

pub use watch::{Carried, CheckPids, Fired, Followed, Watch};

use crate::config::HealthConfig;
use crate::time::{Human, Mono};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How a service is, as its check sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Health {
    /// No verdict yet since its start.
    Unknown,
    Healthy,
    Unhealthy,
}

impl Health {
    /// The name used in `status` and events.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Unknown => "unknown",
            Health::Healthy => "healthy",
            Health::Unhealthy => "unhealthy",
        }
    }
}

/// A failed run, for people: why, and when (Unix milliseconds).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    pub reason: String,
    pub time_ms: u64,
}

/// A change of health, for events and the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub from: Health,
    pub to: Health,
    /// The failure that made it unhealthy ("health: 3 failures: ..."), `None` otherwise.
    pub reason: Option<String>,
}

/// The check of one service during one run of it (reset at each start; handed over
/// by `reexec`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckState {
    pub health: Health,
    /// Consecutive failures.
    pub failures: u32,
    /// Successes since the start.
    pub successes: u32,
    /// The last failure, kept across starts (why it was last restarted).
    pub last_failure: Option<Failure>,
    /// When it last became unhealthy (Unix milliseconds), kept across starts.
    pub unhealthy_since_ms: Option<u64>,
    /// When the next run is due (`None`: not checked now, the service is not up).
    pub next_due: Option<Mono>,
    /// The deadline of the run under way.
    pub running_until: Option<Mono>,
}

impl Default for CheckState {
    fn default() -> Self {
        CheckState {
            health: Health::Unknown,
            failures: 0,
            successes: 0,
            last_failure: None,
            unhealthy_since_ms: None,
            next_due: None,
            running_until: None,
        }
    }
}

impl CheckState {
    /// The service has started (its process exists): unknown again, the first run due
    /// after `start_delay`.
    pub fn start(&mut self, cfg: &HealthConfig, now: Mono) {
        self.health = Health::Unknown;
        self.failures = 0;
        self.successes = 0;
        self.running_until = None;
        self.next_due = Some(now.plus(cfg.start_delay));
    }

    /// The service is no longer up: no more runs (one under way is the caller's to end).
    /// Its health and last failure stay for `status` until the next start.
    pub fn stop(&mut self) {
        self.next_due = None;
        self.running_until = None;
    }

    pub fn running(&self) -> bool {
        self.running_until.is_some()
    }

    /// Whether a run is to be started now: due, and none under way.
    pub fn due(&self, now: Mono) -> bool {
        !self.running() && self.next_due.is_some_and(|d| d <= now)
    }

    /// A run starts now: it must end by `now + timeout`; the next is due an interval
    /// after this one's start.
    pub fn begin(&mut self, cfg: &HealthConfig, now: Mono) {
        self.running_until = Some(now.plus(cfg.timeout));
        self.next_due = Some(now.plus(cfg.interval));
    }

    /// Whether the run under way has outlived its timeout.
    pub fn timed_out(&self, now: Mono) -> bool {
        self.running_until.is_some_and(|d| d <= now)
    }

    /// The reason of a run that timed out.
    pub fn timeout_reason(cfg: &HealthConfig) -> String {
        match &cfg.check {
            crate::config::Check::Command(_) => {
                format!("check command timed out after {}", Human(cfg.timeout))
            }
            c => format!(
                "no answer from {} within {}",
                c.target(),
                Human(cfg.timeout)
            ),
        }
    }

    /// The run under way ended (`Err` names why it failed). Returns a change of health
    /// if there is one; a change `to: Unhealthy` is the verdict to act on.
    pub fn finish(
        &mut self,
        cfg: &HealthConfig,
        result: Result<(), String>,
        now: Mono,
        wall_ms: u64,
    ) -> Option<Change> {
        if !self.running() {
            return None;
        }
        self.running_until = None;
        // Turns missed while this run was under way are skipped, not made up at once.
        if let Some(due) = self.next_due.as_mut() {
            while *due <= now {
                *due = due.plus(cfg.interval.max(Duration::from_millis(1)));
            }
        }
        let from = self.health;
        match result {
            Ok(()) => {
                self.failures = 0;
                self.successes = self.successes.saturating_add(1);
                self.health = Health::Healthy;
                (from != Health::Healthy).then_some(Change {
                    from,
                    to: Health::Healthy,
                    reason: None,
                })
            }
            Err(reason) => {
                self.failures = self.failures.saturating_add(1);
                self.last_failure = Some(Failure {
                    reason: reason.clone(),
                    time_ms: wall_ms,
                });
                if self.failures < cfg.failures || from == Health::Unhealthy {
                    return None;
                }
                self.health = Health::Unhealthy;
                self.unhealthy_since_ms = Some(wall_ms);
                let n = self.failures;
                let what = if n == 1 { "failure" } else { "failures" };
                Some(Change {
                    from,
                    to: Health::Unhealthy,
                    reason: Some(format!("health: {n} {what}: {reason}")),
                })
            }
        }
    }

    /// The next moment this check needs the loop: the end of the run under way, else
    /// the next run.
    pub fn deadline(&self) -> Option<Mono> {
        self.running_until.or(self.next_due)
    }
}

/// A service's watchdog: `WATCHDOG=1` must come within `timeout` of the start or of the
/// last one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watchdog {
    pub deadline: Option<Mono>,
    /// A `WATCHDOG=1` came in this run: a probation commits only after one, so that a
    /// version that never pings is not committed before its deadline tells.
    pub pinged: bool,
}

impl Watchdog {
    /// Armed at the start of the service.
    pub fn start(&mut self, timeout: Duration, now: Mono) {
        self.deadline = Some(now.plus(timeout));
        self.pinged = false;
    }

    /// Disarmed while the service is not up.
    pub fn stop(&mut self) {
        self.deadline = None;
    }

    /// `WATCHDOG=1`: the deadline moves on.
    pub fn ping(&mut self, timeout: Duration, now: Mono) {
        if self.deadline.is_some() {
            self.deadline = Some(now.plus(timeout));
            self.pinged = true;
        }
    }

    /// The failure to act on, if the deadline has passed (disarmed then).
    pub fn expired(&mut self, timeout: Duration, now: Mono) -> Option<String> {
        if self.deadline.is_some_and(|d| d <= now) {
            self.deadline = None;
            return Some(format!("watchdog: no WATCHDOG=1 within {}", Human(timeout)));
        }
        None
    }
}

#[cfg(test)]
mod tests;
