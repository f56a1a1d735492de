//! The state machine of one service: `(state, event, now) → (state, actions)`.
//!
//! What the operator *wants* ([`Want`]) is kept apart from what the service *is*
//! ([`State`]). A service that is wanted up and is `stopped` is pending: the supervisor
//! spawns it as soon as the services it comes `after` are ready. Every timer of a
//! service is its one `deadline`, whose meaning depends on the state (ready timeout,
//! kill escalation, backoff, cooldown). No I/O here: the shell performs the actions.

use crate::config::{OnCrashLoop, Ready, RestartMode, ServiceConfig};
use crate::restart::{History, Verdict};
use crate::time::{Human, Mono};
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The least wait before a start that failed at once is tried again.
pub const SPAWN_RETRY_MIN: std::time::Duration = std::time::Duration::from_millis(100);

/// What a service is now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Stopped,
    Starting,
    Running,
    Stopping,
    Backoff,
    Cooldown,
    Failed,
    Exited,
}

impl State {
    /// The name used in `status` and events.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Stopped => "stopped",
            State::Starting => "starting",
            State::Running => "running",
            State::Stopping => "stopping",
            State::Backoff => "backoff",
            State::Cooldown => "cooldown",
            State::Failed => "failed",
            State::Exited => "exited",
        }
    }
}

/// What the operator (or the config's `autostart`) asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Want {
    Up,
    Down,
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exited with code {c}"),
            Exit::Signal(s) => write!(f, "killed by signal {}", signal_label(*s)),
        }
    }
}

/// "KILL" for 9; the number for a signal nix does not know.
pub fn signal_label(n: i32) -> String {
    Signal::try_from(n)
        .map(|s| crate::config::signal_name(s).to_string())
        .unwrap_or_else(|_| n.to_string())
}

/// What to do once the process being stopped has exited.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AfterStop {
    /// Stay down.
    Down,
    /// Start again at once (`restart`, or a changed definition).
    Up,
    /// It was stopped because it failed (not ready in time): apply the restart policy.
    Failure(String),
}

/// Something that happened to a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Start,
    Stop,
    Restart,
    Spawned(i32),
    /// The spawned process runs its program (its exec succeeded).
    Execd,
    SpawnFailed(String),
    /// It cannot be started until something outside changes (a tool with no current
    /// version; a start the kernel refused for want of permission): `failed` with the
    /// reason, no restart, no crash counted, still wanted up.
    Unavailable(String),
    Ready,
    Exited(Exit),
    /// Its run failed after the kernel's OOM killer killed one of its processes (its
    /// memory cgroup's OOM-kill count rose during the run): the reason, "killed by the
    /// kernel: out of memory (memory_max 64MiB)". A crash, counted for the crash loop.
    /// (`oom_kills` counts the processes killed: [`Service::count_oom_kills`].)
    OutOfMemory(Exit, String),
    /// Its main process exited so, while this many other processes of its run (as
    /// `kill_mode` counts them; never with `"main"`) remained: with a success code, it
    /// daemonized, and the run is a failure, named so (`daemonize.rs`). `None`: some,
    /// not counted (a run tracked by its process group alone).
    Daemonized(Exit, Option<u32>),
    /// The service's deadline has come.
    Timer,
    /// Its health check or watchdog failed (the reason says which): a failure. It is
    /// stopped and then restarted under the restart policy, counted for the crash loop.
    Unhealthy(String),
    /// A reload changed its definition while it has no process: one waiting out a
    /// backoff or a cooldown, or failed, starts again at once with a fresh history (the
    /// fix it waited for may be this one). A running one gets `Restart` instead.
    Changed,
}

/// What the shell must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send this signal to the service's process group, then SIGCONT (unless KILL).
    Signal(Signal),
    /// Stop every service and exit `supd` with this status (`on_crash_loop = "shutdown"`).
    Shutdown(i32),
    /// A crash loop happened, for this reason (an upgrade in probation rolls back).
    CrashLoop(String),
    /// A start was not ready in time, for this reason (likewise).
    NotReady(String),
    /// A health check or the watchdog failed, for this reason (likewise).
    Unhealthy(String),
}

/// The state of one service, owned by the supervisor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    pub want: Want,
    pub state: State,
    pub pid: Option<i32>,
    /// When the current (or last) process was spawned.
    pub started_at: Option<Mono>,
    pub deadline: Option<Mono>,
    pub history: History,
    /// Automatic restarts of its current run of the current version (`status`'s
    /// RESTARTS): back to 0 when the version that runs changes, when a reload changes
    /// the service, and at an operator's `start` or `restart` (`count_afresh`). The
    /// crash loop counts in `history`, apart.
    pub restarts: u32,
    /// Automatic restarts since supd started (carried across `reexec`; a handoff of an
    /// older image, whose `restarts` counted so, gives it from there: `handoff::read`).
    #[serde(default)]
    pub restarts_total: u32,
    /// Processes of its ended runs the kernel OOM-killed since supd started (carried
    /// across `reexec`; `status` adds those of the run that goes on).
    #[serde(default)]
    pub oom_kills: u32,
    pub last_exit: Option<Exit>,
    /// Why it is in its state, for people.
    pub reason: Option<String>,
    pub after_stop: AfterStop,
    /// SIGKILL was sent to the current process.
    pub killed: bool,
    /// When the first SIGKILL of this stop was sent, and how many were sent: from the
    /// second on, the run outlived one by [`KILL_WAIT`] (it cannot die now: an
    /// uninterruptible sleep, a frozen cgroup). `stop` is answered then, saying so, and
    /// the KILL is sent again on a backoff until the run is over: the service is not
    /// started again before.
    #[serde(default)]
    pub killed_at: Option<Mono>,
    #[serde(default)]
    pub kills: u32,
}

pub use crate::unkillable::KILL_WAIT;

impl Service {
    /// A service that has not started yet.
    pub fn new(want: Want) -> Service {
        Service {
            want,
            state: State::Stopped,
            pid: None,
            started_at: None,
            deadline: None,
            history: History::default(),
            restarts: 0,
            restarts_total: 0,
            oom_kills: 0,
            last_exit: None,
            reason: None,
            after_stop: AfterStop::Down,
            killed: false,
            killed_at: None,
            kills: 0,
        }
    }

    /// Wanted up but not started: the supervisor should spawn it once its `after`
    /// services are ready.
    pub fn pending(&self) -> bool {
        self.want == Want::Up && self.state == State::Stopped
    }

    /// Its restarts are counted afresh (`restarts`; `restarts_total` keeps counting).
    pub fn count_afresh(&mut self) {
        self.restarts = 0;
    }

    /// A run of another version than the last one's begins: its restarts and last exit
    /// are that version's, and start afresh (the other's stay in its tool's record,
    /// `versions`, and in its bad mark's reason).
    pub fn other_version(&mut self) {
        self.count_afresh();
        self.last_exit = None;
    }

    /// Since when the process being stopped outlives SIGKILL: it was sent [`KILL_WAIT`]
    /// ago or more and the run is not over.
    pub fn unkillable(&self) -> Option<Mono> {
        self.killed_at
            .filter(|_| self.state == State::Stopping && self.kills >= 2)
    }

    /// Counts `n` of its processes killed by the kernel's OOM killer in a run that
    /// ended (whether the run failed for it or went on).
    pub fn count_oom_kills(&mut self, n: u64) {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        self.oom_kills = self.oom_kills.saturating_add(n);
    }

    /// Ready, for services that come `after` it.
    pub fn is_ready(&self, cfg: &ServiceConfig) -> bool {
        match self.state {
            State::Running => true,
            State::Exited => cfg.ready == Ready::Exited,
            _ => false,
        }
    }

    /// Applies `ev` at `now`.
    pub fn step(&mut self, cfg: &ServiceConfig, ev: Event, now: Mono) -> Vec<Action> {
        use State::*;
        match (self.state, ev) {
            (Stopped | Failed | Exited | Backoff | Cooldown, Event::Start | Event::Restart) => {
                if matches!(self.state, Failed | Exited | Cooldown) || self.want == Want::Down {
                    self.history.reset();
                }
                self.want = Want::Up;
                self.enter(Stopped, None);
                vec![]
            }
            (Starting | Running, Event::Start) => {
                self.want = Want::Up;
                vec![]
            }
            (Stopping, Event::Start | Event::Restart) => {
                self.want = Want::Up;
                self.after_stop = AfterStop::Up;
                vec![]
            }
            (Starting | Running, Event::Stop) => {
                self.want = Want::Down;
                self.begin_stop(cfg, AfterStop::Down, now)
            }
            (Starting | Running, Event::Restart) => {
                self.want = Want::Up;
                self.begin_stop(cfg, AfterStop::Up, now)
            }
            (Stopping, Event::Stop) => {
                self.want = Want::Down;
                self.after_stop = AfterStop::Down;
                vec![]
            }
            (Stopped | Failed | Exited | Backoff | Cooldown, Event::Stop) => {
                self.want = Want::Down;
                self.enter(Stopped, None);
                self.reason = None;
                vec![]
            }
            (_, Event::Spawned(pid)) => {
                self.pid = Some(pid);
                self.started_at = Some(now);
                self.killed = false;
                (self.killed_at, self.kills) = (None, 0);
                self.reason = None;
                // Ready at exec (`started`) or later: starting until then, a program that
                // never gets to run (a hung file system) times out like an unready one.
                self.enter(Starting, Some(now.plus(cfg.ready_timeout)));
                vec![]
            }
            (Starting, Event::Execd) if cfg.ready == Ready::Started => {
                self.enter(Running, None);
                vec![]
            }
            (
                Starting | Stopped | Running | Stopping | Backoff | Cooldown | Failed | Exited,
                Event::Execd,
            ) => {
                vec![]
            }
            (_, Event::SpawnFailed(why)) => {
                self.pid = None;
                self.started_at = Some(now);
                let actions = self.settle(cfg, true, format!("cannot start: {why}"), now);
                // A start that failed at once is not retried at once, whatever
                // `restart_delay` says: it would fail the same way, as fast as supd can fork.
                if self.state == State::Stopped && self.want == Want::Up {
                    self.enter(State::Backoff, Some(now.plus(SPAWN_RETRY_MIN)));
                    self.reason = Some(format!(
                        "cannot start: {why}; trying again in {}",
                        Human(SPAWN_RETRY_MIN)
                    ));
                }
                actions
            }
            (_, Event::Unavailable(why)) => {
                self.pid = None;
                self.enter(Failed, None);
                self.reason = Some(why);
                vec![]
            }
            (Starting, Event::Ready) => {
                self.enter(Running, None);
                vec![]
            }
            (Stopped | Running | Stopping | Backoff | Cooldown | Failed | Exited, Event::Ready) => {
                vec![]
            }
            (Starting | Running, Event::OutOfMemory(exit, why)) => {
                self.exited(exit);
                self.settle(cfg, true, why, now)
            }
            (
                Stopped | Stopping | Backoff | Cooldown | Failed | Exited,
                Event::OutOfMemory(exit, _),
            ) => self.step(cfg, Event::Exited(exit), now),
            (Stopping, Event::Exited(exit)) => {
                self.exited(exit);
                match std::mem::replace(&mut self.after_stop, AfterStop::Down) {
                    AfterStop::Down | AfterStop::Up => {
                        self.enter(Stopped, None);
                        vec![]
                    }
                    AfterStop::Failure(why) => self.settle(cfg, true, why, now),
                }
            }
            (Starting | Running, Event::Exited(exit)) => {
                self.exited(exit);
                let failed = match exit {
                    Exit::Code(c) => !cfg.policy.success_codes.contains(&c),
                    Exit::Signal(_) => true,
                };
                self.settle(cfg, failed, exit.to_string(), now)
            }
            (Starting | Running, Event::Daemonized(exit, left)) => {
                let success =
                    matches!(exit, Exit::Code(c) if cfg.policy.success_codes.contains(&c));
                if !success {
                    return self.step(cfg, Event::Exited(exit), now);
                }
                self.exited(exit);
                if cfg.ready == Ready::Exited {
                    // A one-shot's exit is its contract: what it started on the way (gpg
                    // starting gpg-agent) is ended with its run, and it did its work.
                    let why = crate::daemonize::ended(exit, left);
                    return self.settle(cfg, false, why, now);
                }
                let why = crate::daemonize::reason(exit, left, &cfg.command);
                self.settle(cfg, true, why, now)
            }
            (
                Stopped | Stopping | Backoff | Cooldown | Failed | Exited,
                Event::Daemonized(exit, _),
            ) => self.step(cfg, Event::Exited(exit), now),
            (Stopped | Backoff | Cooldown | Failed | Exited, Event::Exited(exit)) => {
                // A process the machine did not know it had: record, change nothing.
                self.exited(exit);
                vec![]
            }
            (Starting, Event::Timer) => {
                let why = format!("not ready within {}", Human(cfg.ready_timeout));
                let mut actions = self.begin_stop(cfg, AfterStop::Failure(why.clone()), now);
                actions.push(Action::NotReady(why));
                actions
            }
            (Starting | Running, Event::Unhealthy(why)) => {
                let mut actions = self.begin_stop(cfg, AfterStop::Failure(why.clone()), now);
                self.reason = Some(format!("{why}; stopping it"));
                actions.push(Action::Unhealthy(why));
                actions
            }
            (Stopped | Stopping | Backoff | Cooldown | Failed | Exited, Event::Unhealthy(_)) => {
                vec![]
            }
            (Stopping, Event::Timer) => {
                // The first SIGKILL, or the next one to a run that outlived the last:
                // never a deadline that ends the stop, never a loop.
                if !self.killed {
                    (self.killed, self.killed_at, self.kills) = (true, Some(now), 0);
                }
                self.kills = self.kills.saturating_add(1);
                let wait = crate::unkillable::kill_again_in(self.kills, 1);
                self.deadline = Some(now.plus(wait));
                vec![Action::Signal(Signal::SIGKILL)]
            }
            (Backoff, Event::Timer) => {
                self.enter(Stopped, None);
                self.reason = None;
                vec![]
            }
            (Cooldown, Event::Timer) => {
                self.history.reset();
                self.enter(Stopped, None);
                vec![]
            }
            (Stopped | Running | Failed | Exited, Event::Timer) => {
                self.deadline = None;
                vec![]
            }
            (Backoff | Cooldown | Failed, Event::Changed) if self.want == Want::Up => {
                self.history.reset();
                self.enter(Stopped, None);
                self.reason = None;
                vec![]
            }
            (
                Stopped | Starting | Running | Stopping | Backoff | Cooldown | Failed | Exited,
                Event::Changed,
            ) => vec![],
        }
    }

    fn enter(&mut self, state: State, deadline: Option<Mono>) {
        self.state = state;
        self.deadline = deadline;
    }

    fn exited(&mut self, exit: Exit) {
        self.pid = None;
        self.last_exit = Some(exit);
        (self.killed_at, self.kills) = (None, 0);
    }

    fn begin_stop(&mut self, cfg: &ServiceConfig, then: AfterStop, now: Mono) -> Vec<Action> {
        self.after_stop = then;
        self.enter(State::Stopping, Some(now.plus(cfg.stop_timeout)));
        vec![Action::Signal(cfg.stop_signal)]
    }

    /// An exit (or failed start) while wanted up: the restart policy decides.
    fn settle(&mut self, cfg: &ServiceConfig, failed: bool, why: String, now: Mono) -> Vec<Action> {
        if self.want == Want::Down {
            self.enter(State::Stopped, None);
            self.reason = Some(why);
            return vec![];
        }
        let uptime = self.started_at.map(|t| now.since(t)).unwrap_or_default();
        let p = &cfg.policy;
        match self.history.on_exit(p, failed, uptime, now) {
            Verdict::Restart { delay } => {
                self.restarts = self.restarts.saturating_add(1);
                self.restarts_total = self.restarts_total.saturating_add(1);
                if delay.is_zero() {
                    self.enter(State::Stopped, None);
                    self.reason = Some(format!("{why}; restarting"));
                } else {
                    self.enter(State::Backoff, Some(now.plus(delay)));
                    self.reason = Some(format!("{why}; restarting in {}", Human(delay)));
                }
                vec![]
            }
            Verdict::Finished => {
                self.enter(State::Exited, None);
                self.reason = Some(why);
                vec![]
            }
            Verdict::GiveUp => {
                self.enter(State::Failed, None);
                let mode = if p.restart == RestartMode::Never {
                    "never"
                } else {
                    "on-failure"
                };
                self.reason = Some(format!("{why}; not restarted (restart = \"{mode}\")"));
                vec![]
            }
            Verdict::CrashLoop { restarts, within } => {
                let lp = format!(
                    "crash loop: {restarts} restarts within {} (last: {why})",
                    Human(within)
                );
                let mut actions = vec![Action::CrashLoop(lp.clone())];
                match p.on_crash_loop {
                    OnCrashLoop::Cooldown => {
                        self.enter(State::Cooldown, Some(now.plus(p.cooldown)));
                        self.reason = Some(format!("{lp}; trying again in {}", Human(p.cooldown)));
                    }
                    OnCrashLoop::Stop => {
                        self.enter(State::Failed, None);
                        self.reason = Some(format!("{lp}; gave up"));
                    }
                    OnCrashLoop::Shutdown => {
                        self.enter(State::Failed, None);
                        self.reason = Some(format!("{lp}; shutting down supd"));
                        actions.push(Action::Shutdown(1));
                    }
                }
                actions
            }
        }
    }
}

#[cfg(test)]
mod tests;
