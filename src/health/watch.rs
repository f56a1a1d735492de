//! The health part: one service's check and watchdog for the run they follow (`Watch`,
//! held by its slot), and the check commands under way by pid (`CheckPids`).
//!
//! A watch keeps its state private: the rule's state (`CheckState`, `Watchdog`), the
//! run of the check under way (`Probe`), the run of the service it belongs to, and the
//! pid record of its check commands. Its methods take what happened (the service's run
//! began or ended, a deadline came, a probe's fd is ready, a check command was reaped,
//! a `WATCHDOG=1`, a trigger) and return what the coordinator must do
//! (`supervisor/health.rs`: spawn a check command, kill a check's cgroup, tell a
//! change of health, act on an unhealthy verdict). It logs nothing: the coordinator
//! says what it does. It imports no part and not the coordinator.

use super::run::{HealthView, Outcome, Probe};
use super::{Change, CheckState, Failure, Health, Watchdog};
use crate::config::{Check, HealthConfig, ServiceConfig};
use crate::records::PidFile;
use crate::time::Mono;
use nix::poll::PollFlags;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::fd::BorrowedFd;
use std::path::Path;

/// A service's check and watchdog, for the run (main pid) they follow.
#[derive(Default)]
pub struct Watch {
    /// The check's state, kept across runs for `status` (its health, its last failure).
    check: CheckState,
    /// The watchdog's deadline.
    watchdog: Watchdog,
    /// The check's run under way.
    probe: Option<Probe>,
    /// The run (main pid) the checks and watchdog belong to; `None` while it is not up.
    run: Option<i32>,
    /// Where its check command under way is recorded, made at its first run.
    record: Option<PidFile>,
}

/// The run a watch follows changed ([`Watch::follow`]).
pub struct Followed {
    /// The check's run under way, of the old run: to end (a command's cgroup first).
    pub cancel: Option<Probe>,
    /// No run is followed now: the checks ended with the service's run.
    pub ended: bool,
}

/// What a deadline of a watch comes to ([`Watch::fire`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Fired {
    /// Nothing for the coordinator (a socket check's run began, or nothing was due).
    Nothing,
    /// The watchdog's deadline passed (it is disarmed): a failure of the service, for
    /// this reason.
    Missed(String),
    /// The check's run failed now: it timed out (its probe is ended), or a socket check
    /// could not begin. The rule is to be told ([`Watch::finish`]).
    Failed(String),
    /// A run of the check command `argv` begins: the coordinator spawns it and hands
    /// its probe over ([`Watch::begun`]), or tells the rule why it could not.
    Spawn(Vec<String>),
}

impl Watch {
    /// The run (main pid) followed, while the service is up and checked.
    pub fn run(&self) -> Option<i32> {
        self.run
    }

    /// Its health as its check (or watchdog) last said.
    pub fn health(&self) -> Health {
        self.check.health
    }

    /// Health as `status` shows it and the lease rule reads it.
    pub fn view(&self) -> HealthView {
        HealthView {
            health: self.check.health,
            unhealthy_since_ms: self.check.unhealthy_since_ms,
        }
    }

    /// Consecutive failures of the check.
    pub fn failures(&self) -> u32 {
        self.check.failures
    }

    /// The last failure, kept across starts (why it was last restarted).
    pub fn last_failure(&self) -> Option<&Failure> {
        self.check.last_failure.as_ref()
    }

    /// When it last became unhealthy (Unix milliseconds), kept across starts.
    pub fn unhealthy_since_ms(&self) -> Option<u64> {
        self.check.unhealthy_since_ms
    }

    /// A `WATCHDOG=1` came in this run.
    pub fn pinged(&self) -> bool {
        self.watchdog.pinged
    }

    /// The next moment this watch needs the loop, while it follows a run: its check's
    /// (the end of the run under way, else the next run) or its watchdog's.
    pub fn deadline(&self) -> Option<Mono> {
        self.run?;
        [self.check.deadline(), self.watchdog.deadline]
            .into_iter()
            .flatten()
            .min()
    }

    /// The fd of its check's run under way to poll, and for what.
    pub fn poll_fd(&self) -> Option<(BorrowedFd<'_>, PollFlags)> {
        self.probe.as_ref().and_then(Probe::poll_fd)
    }

    /// The service's run, `run` while it is up (`None` otherwise): the checks and
    /// watchdog begin with a new run and end with it. `None` when nothing changed.
    pub fn follow(&mut self, run: Option<i32>, cfg: &ServiceConfig, now: Mono) -> Option<Followed> {
        // A reload may have taken the check away from a service being restarted.
        let checked = cfg.health.is_some() || cfg.watchdog.is_some();
        let run = run.filter(|_| checked);
        if run == self.run {
            return None;
        }
        let cancel = self.probe.take();
        self.run = run;
        match run {
            Some(_) => {
                match &cfg.health {
                    Some(h) => self.check.start(h, now),
                    // A watchdog alone: unknown until the first ping of this run.
                    None => self.check.health = Health::Unknown,
                }
                if let Some(d) = cfg.watchdog {
                    self.watchdog.start(d, now);
                }
            }
            None => {
                self.check.stop();
                self.watchdog.stop();
            }
        }
        Some(Followed {
            cancel,
            ended: run.is_none(),
        })
    }

    /// Whether one of its deadlines has come.
    pub fn is_due(&self, now: Mono) -> bool {
        self.deadline().is_some_and(|d| d <= now)
    }

    /// Its deadline came: the watchdog missed, the run under way timed out, or a run to
    /// begin (a socket check's begins here).
    pub fn fire(&mut self, cfg: &ServiceConfig, now: Mono) -> Fired {
        match cfg.watchdog {
            Some(d) => {
                if let Some(why) = self.watchdog.expired(d, now) {
                    return Fired::Missed(why);
                }
            }
            None => self.watchdog.stop(),
        }
        let Some(h) = cfg.health.as_deref() else {
            self.check.stop();
            return Fired::Nothing;
        };
        if self.check.timed_out(now) {
            if let Some(p) = self.probe.take() {
                p.cancel();
            }
            return Fired::Failed(CheckState::timeout_reason(h));
        }
        if !self.check.due(now) {
            return Fired::Nothing;
        }
        self.check.begin(h, now);
        match &h.check {
            Check::Command(argv) => Fired::Spawn(argv.clone()),
            other => match Probe::begin_socket(other) {
                Ok(p) => {
                    self.probe = Some(p);
                    Fired::Nothing
                }
                Err(why) => Fired::Failed(why),
            },
        }
    }

    /// The check command of the run that began ([`Fired::Spawn`]) is under way.
    pub fn begun(&mut self, probe: Probe) {
        self.probe = Some(probe);
    }

    /// The fd of its check's run is ready: what the run came to, once it came to
    /// something (the probe is ended then).
    pub fn progress(&mut self) -> Outcome {
        let outcome = self.probe.as_mut().and_then(Probe::progress)?;
        if let Some(p) = self.probe.take() {
            p.cancel();
        }
        Some(outcome)
    }

    /// A check command was reaped: its exec's report, if it is this watch's run under
    /// way (which it ends); `None` when that run ended already (timed out, or its
    /// service stopped).
    pub fn command_reaped(&mut self, pid: i32) -> Option<crate::sys::Exec> {
        let ours = matches!(&self.probe, Some(Probe::Command { pid: p, .. }) if *p == pid);
        if !ours {
            return None;
        }
        match self.probe.take() {
            Some(Probe::Command { exec, .. }) => Some(exec),
            _ => None,
        }
    }

    /// A run of the check ended (`Err` names why it failed): the rule decides. A change
    /// `to: Unhealthy` is the verdict to act on.
    pub fn finish(
        &mut self,
        h: &HealthConfig,
        result: Result<(), String>,
        now: Mono,
        wall_ms: u64,
    ) -> Option<Change> {
        self.check.finish(h, result, now, wall_ms)
    }

    /// `WATCHDOG=1`: its deadline moves on; a service with a watchdog and no check is
    /// healthy from its first ping of the run (the change to tell).
    pub fn ping(&mut self, cfg: &ServiceConfig, now: Mono) -> Option<Change> {
        let d = cfg.watchdog?;
        self.watchdog.ping(d, now);
        if cfg.health.is_some() || self.run.is_none() || self.check.health == Health::Healthy {
            return None;
        }
        let change = Change {
            from: self.check.health,
            to: Health::Healthy,
            reason: None,
        };
        self.check.health = Health::Healthy;
        Some(change)
    }

    /// A missed watchdog or `WATCHDOG=trigger` (`why`, at `wall_ms`): unhealthy, the
    /// watchdog disarmed; the change to tell and act on. `None` while no run is followed.
    pub fn fail(&mut self, why: &str, wall_ms: u64) -> Option<Change> {
        self.run?;
        self.watchdog.stop();
        self.check.last_failure = Some(Failure {
            reason: why.to_string(),
            time_ms: wall_ms,
        });
        self.check.unhealthy_since_ms = Some(wall_ms);
        let change = Change {
            from: self.check.health,
            to: Health::Unhealthy,
            reason: Some(why.to_string()),
        };
        self.check.health = Health::Unhealthy;
        Some(change)
    }

    /// The pid record of the check commands of service `name`, made (or made again, its
    /// file removed or replaced) as needed.
    pub fn record(&mut self, state_dir: &Path, name: &str) -> std::io::Result<&PidFile> {
        let file = match self.record.take().filter(PidFile::is_current) {
            Some(f) => f,
            None => PidFile::open_check(state_dir, name)?,
        };
        Ok(self.record.insert(file))
    }

    /// Its check commands are all reaped: their record is cleared.
    pub fn unrecord(&self) -> std::io::Result<()> {
        match &self.record {
            Some(f) => f.set(None),
            None => Ok(()),
        }
    }

    /// Before a `reexec`: the check's run under way ends (a command's group is killed,
    /// a socket closed), to be made again at once by the new image.
    pub fn before_exec(&mut self, now: Mono) {
        if let Some(p) = self.probe.take() {
            p.cancel();
        }
        if self.check.running() {
            self.check.running_until = None;
            self.check.next_due = Some(self.check.next_due.map_or(now, |d| d.min(now)));
        }
    }

    /// What a `reexec` carries: the state of the checks and watchdog, while they follow
    /// a run.
    pub fn carry(&self) -> Option<Carried> {
        self.run.map(|pid| Carried {
            pid,
            check: self.check.clone(),
            watchdog: self.watchdog.clone(),
        })
    }

    /// Takes over what a previous image carried, when it is of the run `run` (one the
    /// config no longer checks is ended by the next `follow`).
    pub fn adopt(&mut self, c: Carried, run: Option<i32>) {
        if run == Some(c.pid) {
            self.check = c.check;
            self.watchdog = c.watchdog;
            self.run = Some(c.pid);
        }
    }
}

/// A service's health checks and watchdog for its run under way, as the handoff carries
/// them (format 4, `ServiceState::health`): a run under way of the check itself was
/// ended by the old image and is made again at once.
#[derive(Debug, Serialize, Deserialize)]
pub struct Carried {
    /// The run (main pid) they belong to.
    pid: i32,
    check: CheckState,
    watchdog: Watchdog,
}

/// The check commands under way: pid to service.
#[derive(Default)]
pub struct CheckPids {
    pids: BTreeMap<i32, String>,
}

impl CheckPids {
    /// A check command of service `name` was spawned as `pid`.
    pub fn began(&mut self, pid: i32, name: &str) {
        self.pids.insert(pid, name.to_string());
    }

    pub fn contains(&self, pid: i32) -> bool {
        self.pids.contains_key(&pid)
    }

    /// The service of the check command `pid`.
    pub fn name_of(&self, pid: i32) -> Option<&str> {
        self.pids.get(&pid).map(String::as_str)
    }

    /// Every check command under way.
    pub fn pids(&self) -> impl Iterator<Item = i32> + '_ {
        self.pids.keys().copied()
    }

    /// No other check command of the service of `pid` is under way.
    pub fn alone(&self, pid: i32) -> bool {
        let Some(name) = self.pids.get(&pid) else {
            return true;
        };
        !self.pids.iter().any(|(p, n)| n == name && *p != pid)
    }

    /// The check command `pid` was reaped: its service, and whether it was the last of
    /// that service's under way. `None` for a pid of no check command.
    pub fn reaped(&mut self, pid: i32) -> Option<(String, bool)> {
        let name = self.pids.remove(&pid)?;
        let last = !self.pids.values().any(|n| *n == name);
        Some((name, last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(s: u64) -> Mono {
        Mono(s * 1_000_000_000)
    }

    /// A service with a check command (first run 5 s after its start, 2 s to answer)
    /// and, with `watchdog`, a watchdog of 30 s.
    fn service(check: bool, watchdog: bool) -> ServiceConfig {
        let mut cfg = ServiceConfig::new("web", vec!["/bin/web".into()], "/".into());
        if check {
            let mut h = HealthConfig::new(Check::Command(vec!["/bin/check".into()]));
            h.start_delay = Duration::from_secs(5);
            h.failures = 1;
            cfg.health = Some(Box::new(h));
        }
        cfg.watchdog = watchdog.then_some(Duration::from_secs(30));
        cfg
    }

    #[test]
    fn a_watch_follows_the_run_and_ends_with_it() {
        let cfg = service(true, true);
        let mut w = Watch::default();
        assert!(w.follow(None, &cfg, at(100)).is_none(), "nothing to end");
        let f = w.follow(Some(7), &cfg, at(100)).expect("a run began");
        assert!(!f.ended && f.cancel.is_none());
        assert_eq!(w.run(), Some(7));
        assert_eq!(
            w.deadline(),
            Some(at(105)),
            "the first run, before the watchdog"
        );
        assert!(w.follow(Some(7), &cfg, at(101)).is_none(), "the same run");
        let f = w.follow(None, &cfg, at(102)).expect("the run ended");
        assert!(f.ended);
        assert_eq!((w.run(), w.deadline()), (None, None));
        // A service checked by nothing is followed by no watch.
        let bare = service(false, false);
        assert!(w.follow(Some(8), &bare, at(103)).is_none());
    }

    #[test]
    fn a_due_check_command_is_spawned_by_the_coordinator_and_times_out_here() {
        let cfg = service(true, false);
        let mut w = Watch::default();
        w.follow(Some(7), &cfg, at(100));
        assert!(!w.is_due(at(104)));
        assert_eq!(
            w.fire(&cfg, at(105)),
            Fired::Spawn(vec!["/bin/check".into()])
        );
        assert_eq!(w.deadline(), Some(at(107)), "the run's timeout");
        assert!(w.command_reaped(99).is_none(), "no probe handed over");
        match w.fire(&cfg, at(107)) {
            Fired::Failed(why) => assert!(why.contains("timed out after 2s"), "{why}"),
            other => panic!("{other:?}"),
        }
        let change = w.finish(
            cfg.health.as_deref().expect("h"),
            Err("x".into()),
            at(107),
            9,
        );
        assert_eq!(change.map(|c| c.to), Some(Health::Unhealthy));
        assert_eq!(w.view().unhealthy_since_ms, Some(9));
        assert_eq!(w.failures(), 1);
    }

    #[test]
    fn the_watchdog_alone_is_healthy_from_its_first_ping_and_fails_once() {
        let cfg = service(false, true);
        let mut w = Watch::default();
        assert!(
            w.fail("watchdog: WATCHDOG=trigger", 1).is_none(),
            "no run followed"
        );
        w.follow(Some(7), &cfg, at(100));
        assert_eq!(w.health(), Health::Unknown);
        assert_eq!(w.deadline(), Some(at(130)));
        let change = w.ping(&cfg, at(110)).expect("healthy now");
        assert_eq!((change.from, change.to), (Health::Unknown, Health::Healthy));
        assert!(w.pinged() && w.ping(&cfg, at(111)).is_none(), "told once");
        assert_eq!(w.deadline(), Some(at(141)));
        match w.fire(&cfg, at(141)) {
            Fired::Missed(why) => {
                let change = w.fail(&why, 5).expect("unhealthy");
                assert_eq!(change.reason.as_deref(), Some(why.as_str()));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(w.health(), Health::Unhealthy);
        assert_eq!(w.last_failure().map(|f| f.time_ms), Some(5));
        assert_eq!(w.deadline(), None, "disarmed");
    }

    #[test]
    fn a_carried_watch_is_taken_over_for_its_own_run_only() {
        let cfg = service(true, true);
        let mut w = Watch::default();
        assert!(w.carry().is_none(), "nothing while no run is followed");
        w.follow(Some(7), &cfg, at(100));
        w.fire(&cfg, at(105));
        w.before_exec(at(106));
        assert_eq!(
            w.deadline(),
            Some(at(106)),
            "the run ended, made again at once"
        );
        let json = serde_json::to_value(w.carry().expect("carried")).expect("json");
        for key in ["pid", "check", "watchdog"] {
            assert!(json.get(key).is_some(), "{key}: {json}");
        }
        let mut other = Watch::default();
        other.adopt(
            serde_json::from_value(json.clone()).expect("reads"),
            Some(8),
        );
        assert_eq!(other.run(), None, "another run");
        other.adopt(serde_json::from_value(json).expect("reads"), Some(7));
        assert_eq!((other.run(), other.deadline()), (Some(7), Some(at(106))));
    }

    #[test]
    fn check_pids_say_when_the_last_run_of_a_service_is_reaped() {
        let mut c = CheckPids::default();
        c.began(10, "web");
        c.began(11, "web");
        c.began(12, "db");
        assert!(c.contains(10) && !c.alone(10) && c.alone(12));
        assert_eq!(c.name_of(12), Some("db"));
        assert_eq!(c.pids().collect::<Vec<_>>(), vec![10, 11, 12]);
        assert_eq!(c.reaped(10), Some(("web".into(), false)));
        assert_eq!(c.reaped(11), Some(("web".into(), true)));
        assert_eq!(c.reaped(11), None);
    }
}
