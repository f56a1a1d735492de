//! The coordinator side of health checks and watchdogs (the health part: each slot's
//! `health::Watch`, and `health::CheckPids`): what happens to a service's run and its
//! checks routed to its watch, and its answers carried out: check commands spawned
//! and their cgroups killed, changes of health told, verdicts acted on.

use super::{unix_ms, Supervisor};
use crate::config::Ready;
use crate::health::run::{HealthView, Probe};
use crate::health::{Change, Fired, Health};
use crate::service::{Event, Exit, State};
use crate::sys::{Io, SpawnSpec};
use crate::time::Mono;
use serde_json::json;

impl Supervisor {
    /// The health of a service with a `health` check or a `watchdog`, and when it last
    /// became unhealthy; `None` for an unknown service or one with neither. For the
    /// lease rule: a leader-only service that is unhealthy makes its node ineligible.
    pub fn health_of(&self, name: &str) -> Option<HealthView> {
        let s = self.slots.get(name)?;
        (s.cfg.health.is_some() || s.cfg.watchdog.is_some()).then(|| s.health.view())
    }

    /// Starts the checks and watchdog of services that have just started, ends those of
    /// services that are no longer up. Runs at each settle, over the slots touched this
    /// turn: a service's run begins and ends only through a change to its slot.
    pub fn sync_health(&mut self, now: Mono) {
        let mut ended = Vec::new();
        let touched: Vec<String> = self.slots.touched().iter().cloned().collect();
        for name in touched {
            let Some(slot) = self.slots.get_mut(&name) else {
                continue;
            };
            let up = matches!(slot.svc.state, State::Starting | State::Running);
            let run = slot.svc.pid.filter(|_| up);
            let Some(followed) = slot.health.follow(run, &slot.cfg, now) else {
                continue;
            };
            if let Some(p) = followed.cancel {
                // The run ends with the service's: what it started too (a supd that
                // exits next would not see it reaped).
                if let (Probe::Command { .. }, Some(c)) = (&p, self.cgroups.as_ref()) {
                    crate::cgroup::kill(&c.check_dir(&slot.cfg.name));
                }
                p.cancel();
            }
            if followed.ended {
                ended.push(slot.cfg.name.clone());
            }
        }
        for name in ended {
            log::debug!("{name}: its health checks end with its run");
        }
    }

    /// Fires what is due: watchdogs missed, runs timed out, runs to start.
    pub fn fire_health(&mut self, now: Mono) {
        self.sync_health(now);
        let due: Vec<String> = (self.timers.due(now).into_iter())
            .filter(|n| self.slots.get(n).is_some_and(|s| s.health.is_due(now)))
            .collect();
        for name in due {
            let Some(slot) = self.slots.get_mut(&name) else {
                continue;
            };
            match slot.health.fire(&slot.cfg, now) {
                Fired::Nothing => {}
                Fired::Missed(why) => self.watchdog_failed(&name, why, now),
                Fired::Failed(why) => self.check_done(&name, Err(why), now),
                Fired::Spawn(argv) => match self.spawn_check(&name, &argv) {
                    Ok(p) => {
                        if let Some(slot) = self.slots.get_mut(&name) {
                            slot.health.begun(p);
                        }
                    }
                    Err(why) => self.check_done(&name, Err(why), now),
                },
            }
        }
    }

    /// Forks a check command like the service: its user, cwd, env and tool version, a
    /// process group of its own; its output goes nowhere.
    fn spawn_check(&mut self, name: &str, argv: &[String]) -> Result<Probe, String> {
        let slot = self.slots.get(name).ok_or("gone")?;
        let mut cfg = slot.cfg.clone();
        cfg.command = argv.to_vec();
        cfg.ready = Ready::Started;
        let plan = crate::launch::resolve(&cfg, &self.cfg.supd, None).map_err(|e| match e {
            crate::launch::NotLaunched::NoVersion(w) | crate::launch::NotLaunched::Failed(w) => {
                format!("check command: cannot start: {w}")
            }
        })?;
        let mut program = plan.program;
        // The version the service runs, should `current` have moved since its start.
        if let (Some(tool), Some(v), Some(a0)) = (&cfg.tool, &slot.version, argv.first()) {
            if !a0.starts_with('/') && plan.version.as_ref() != Some(v) {
                program = self
                    .cfg
                    .supd
                    .tools_dir
                    .join(tool)
                    .join(v)
                    .join(a0)
                    .to_string_lossy()
                    .into_owned();
            }
        }
        let spec = SpawnSpec {
            program,
            args: plan.args,
            env: plan.env,
            cwd: plan.cwd,
            stdout: Io::Null,
            stderr: Io::Null,
            creds: plan.creds,
            ready_fd: None,
            give: Vec::new(),
            tuning: plan.tuning,
            own_pid_env: Vec::new(),
            pass: Vec::new(),
            dies_with_supd: true,
            join: None,
            born_in: false,
            also_join: Vec::new(),
        };
        // Recorded before its program runs, as a service is: the command dies with a
        // killed supd, but what it started would stay; the record lets the next supd
        // end its process group. A record that cannot be written is said, and the check
        // runs all the same: it is no service (nothing runs twice), and failing it
        // would restart a healthy service over a state_dir problem.
        let state_dir = self.cfg.supd.state_dir.clone();
        let slot = self.slots.get_mut(name).ok_or("gone")?;
        let record = match slot.health.record(&state_dir, name) {
            Ok(f) => Some(f),
            Err(e) => {
                log::warn!(
                    "{name}: cannot open the pid record of its check in {}: {e}; it runs unrecorded",
                    state_dir.display()
                );
                None
            }
        };
        // Where supd has cgroups, a cgroup holds what the check starts, even a daemon.
        // The command is forked into it, or moves itself in (`SpawnSpec::join`); a refused
        // move is said when its report is read.
        let mut born_in = false;
        let join = self.cgroups.as_ref().and_then(|c| {
            let dir = c.check_dir(name);
            born_in = crate::cgroup::fit_to_be_born_in(&dir, false);
            match crate::cgroup::prepare(&dir).and_then(|()| crate::cgroup::dir_fd(&dir)) {
                Ok(f) => {
                    self.syslog.started_in(&dir, || crate::cgroup::id_of(&f));
                    Some(f)
                }
                Err(e) => {
                    log::warn!(
                        "{name}: cannot use the cgroup of its check {}: {e}; it runs in no cgroup",
                        dir.display()
                    );
                    None
                }
            }
        });
        let spec = SpawnSpec {
            born_in: born_in && join.is_some(),
            join,
            ..spec
        };
        let (pid, exec) = crate::spawner::spawn_service(spec, |pid| {
            let start_time = crate::proc::stat(pid).map(|s| s.start_time).unwrap_or(0);
            if let Some(Err(e)) = record.map(|r| r.set(Some((pid, start_time)))) {
                log::warn!(
                    "{name}: cannot record the pid of its check in {}: {e}; it runs unrecorded",
                    state_dir.display()
                );
            }
            Ok(())
        })
        .map_err(|e| format!("check command: cannot start: {e}"))?;
        self.check_pids.began(pid, name);
        Ok(Probe::Command { pid, exec })
    }

    /// A check command of `name` is reaped (its group killed): its record is cleared.
    fn check_unrecorded(&mut self, name: &str) {
        if let Some(Err(e)) = self.slots.get(name).map(|s| s.health.unrecord()) {
            log::warn!("{name}: cannot clear the pid record of its check: {e}");
        }
    }

    /// A check command was reaped: its run's outcome, if it is still the service's run.
    pub fn check_reaped(&mut self, pid: i32, exit: Exit, now: Mono) {
        let Some((name, last)) = self.check_pids.reaped(pid) else {
            return;
        };
        if last {
            self.check_unrecorded(&name);
        }
        let Some(slot) = self.slots.get_mut(&name) else {
            return;
        };
        let Some(mut exec) = slot.health.command_reaped(pid) else {
            return; // ended already (timed out, or its service stopped)
        };
        let outcome = exec.outcome();
        // Killed (perhaps at its birth, in a cgroup killed behind supd's back): the next
        // check is forked into its cgroup made anew (`cgroup::fit_to_be_born_in`).
        if exit == Exit::Signal(libc::SIGKILL) {
            if let Some(c) = self.cgroups.as_ref() {
                crate::cgroup::mark_killed(&c.check_dir(&name));
            }
        }
        if let Some(e) = exec.cgroup_refused() {
            log::warn!("{name}: its check ran in no cgroup: {e}");
        }
        let result = match (exit, outcome) {
            (_, Some(Err(f))) => Err(format!("check command: cannot start: {}", f.why)),
            (Exit::Code(0), _) => Ok(()),
            (e, _) => Err(format!("check command {e}")),
        };
        self.check_done(&name, result, now);
    }

    /// A socket check's fd is ready.
    pub fn on_health_fd(&mut self, name: &str, now: Mono) {
        let Some(outcome) = self.slots.get_mut(name).and_then(|s| s.health.progress()) else {
            return;
        };
        self.check_done(name, outcome, now);
    }

    /// A run ended: the rule decides; a verdict is told and acted on.
    fn check_done(&mut self, name: &str, result: Result<(), String>, now: Mono) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        let Some(h) = slot.cfg.health.as_ref() else {
            return;
        };
        if let Err(why) = &result {
            log::info!(
                "{name}: health check failed ({} of {}): {why}",
                slot.health.failures() + 1,
                h.failures
            );
        }
        let Some(change) = slot.health.finish(h, result, now, unix_ms()) else {
            return;
        };
        self.health_changed(name, &change);
        if let (Health::Unhealthy, Some(why)) = (change.to, change.reason) {
            self.apply(name, Event::Unhealthy(why), now);
        }
    }

    /// `WATCHDOG=1` from the service: its deadline moves on (a service with a watchdog
    /// and no check counts as healthy from its first ping).
    pub fn watchdog_ping(&mut self, name: &str, now: Mono) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        if let Some(change) = slot.health.ping(&slot.cfg, now) {
            self.health_changed(name, &change);
        }
    }

    /// A missed watchdog or `WATCHDOG=trigger`: a failure of the service.
    pub fn watchdog_failed(&mut self, name: &str, why: String, now: Mono) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        let Some(change) = slot.health.fail(&why, unix_ms()) else {
            return;
        };
        self.health_changed(name, &change);
        self.apply(name, Event::Unhealthy(why), now);
    }

    fn health_changed(&mut self, name: &str, change: &Change) {
        self.metrics.changed();
        match &change.reason {
            Some(r) => log::warn!(
                "{name}: {} -> {} ({r})",
                change.from.as_str(),
                change.to.as_str()
            ),
            None => log::info!(
                "{name}: health {} -> {}",
                change.from.as_str(),
                change.to.as_str()
            ),
        }
        let version = self.slots.get(name).and_then(|s| s.version.clone());
        let e = json!({
            "event": "health",
            "service": name,
            "from": change.from.as_str(),
            "to": change.to.as_str(),
            "reason": change.reason,
            "version": version,
            "time": unix_ms(),
        });
        self.control.broadcast(&crate::protocol::line(e));
    }
}
