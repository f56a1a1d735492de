//! The answers owed to parked clients, settled on the slots: `stop` answered once its
//! services are down (saying which needed SIGKILL), `start`/`restart` once they are up
//! or it is clear they did not come up (a deadline from their `ready_timeout`s bounds
//! it). The waiters are the control part's (`control/parked.rs`); the commands that park
//! them are in `supervisor/commands.rs`.

use super::Supervisor;
use crate::config;
use crate::control::WaitFor;
use crate::protocol::{self, Error, ErrorKind};
use crate::service::State;
use crate::time::Mono;
use serde_json::{json, Value};

impl Supervisor {
    /// When a `start` of `names` answers at the latest: each of them and of the services
    /// they come after, one after the other, given its `ready_timeout`, and the longest
    /// `stop_timeout` of a restart (a not-ready start is stopped before it is retried).
    pub(super) fn start_bound(&self, names: &[String], now: Mono) -> Mono {
        let mut all: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut i = 0;
        while i < all.len() {
            if let Some(s) = self.slots.get(all[i]) {
                for d in &s.cfg.after {
                    if !all.contains(&d.as_str()) {
                        all.push(d);
                    }
                }
            }
            i += 1;
        }
        let slots = all.iter().filter_map(|n| self.slots.get(*n));
        let ready = slots.clone().fold(std::time::Duration::ZERO, |t, s| {
            t.saturating_add(s.cfg.ready_timeout)
        });
        let stop = slots.map(|s| s.cfg.stop_timeout).max().unwrap_or_default();
        now.plus(ready.saturating_add(stop.saturating_mul(2)))
            .plus(std::time::Duration::from_secs(1))
    }

    /// Whether a service asked to start did: `Ok` once it is up (running, or exited: a
    /// one-shot that ran), `Err` with the reason once it is clear it did not (a failed
    /// start, a crash, not ready in time: backoff, cooldown, failed; stopped meanwhile; a
    /// service it comes after that is not coming up), `None` while it may still. A
    /// leader-only service waiting for its lease counts as started: it is wanted up and
    /// runs once this node is granted the lease.
    fn start_outcome(&self, name: &str, now: Mono) -> Option<Result<(), String>> {
        let Some(s) = self.slots.get(name) else {
            return Some(Err("it was removed by a reload".into()));
        };
        if self.control.held(name).is_some() {
            return None;
        }
        let why = || {
            self.reason_of(s, now)
                .unwrap_or_else(|| s.svc.state.as_str().into())
        };
        match s.svc.state {
            State::Running | State::Exited => Some(Ok(())),
            State::Starting | State::Stopping => None,
            State::Backoff | State::Cooldown | State::Failed => Some(Err(why())),
            State::Stopped if s.svc.want == crate::service::Want::Down => {
                Some(Err(format!("stopped meanwhile ({})", why())))
            }
            State::Stopped if self.waits_for_lease(name).is_some() => Some(Ok(())),
            State::Stopped => self.blocked(name, 0).map(Err),
        }
    }

    /// Why a pending service will not start as things are (a service it comes after is
    /// down, failed or waiting out a delay; its lease is not held), if it will not.
    fn blocked(&self, name: &str, depth: usize) -> Option<String> {
        let s = self.slots.get(name)?;
        if let Some(l) = self.waits_for_lease(name) {
            return Some(format!("it waits for lease '{l}'"));
        }
        if depth > 64 {
            return None;
        }
        for d in &s.cfg.after {
            let Some(dep) = self.slots.get(d) else {
                return Some(format!("it comes after {d}, which is not defined"));
            };
            if dep.svc.is_ready(&dep.cfg) {
                continue;
            }
            let state = dep.svc.state;
            let down = dep.svc.want == crate::service::Want::Down;
            match state {
                State::Starting | State::Stopping => {}
                State::Stopped if !down => {
                    if let Some(why) = self.blocked(d, depth + 1) {
                        return Some(format!("it comes after {d}, which cannot start: {why}"));
                    }
                }
                State::Stopped
                | State::Running
                | State::Exited
                | State::Backoff
                | State::Cooldown
                | State::Failed => {
                    let why = dep
                        .svc
                        .reason
                        .as_deref()
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default();
                    let hint = if down { " (start it too)" } else { "" };
                    return Some(format!(
                        "it comes after {d}, which is {}{why}{hint}",
                        state.as_str()
                    ));
                }
            }
        }
        None
    }

    /// The lease a leader-only service waits for, when this node does not hold it.
    fn waits_for_lease(&self, name: &str) -> Option<&str> {
        self.slots
            .get(name)?
            .cfg
            .leader_only
            .as_deref()
            .filter(|l| !self.leases.holds(l))
    }

    /// The answer of `stop`: the statuses, each of those that had to be killed saying so.
    fn stopped_answer(&self, names: &[String], many: bool, running: &[String], now: Mono) -> Value {
        let mut data = self.statuses(names, many, now);
        let mark = |st: &mut Value| {
            let Some(s) = st["name"].as_str().and_then(|n| self.slots.get(n)) else {
                return;
            };
            if s.svc.killed && running.iter().any(|r| r == &s.cfg.name) {
                st["killed"] = Value::Bool(true);
                st["stop_timeout_ms"] = json!(s.cfg.stop_timeout.as_millis() as u64);
                st["stop_signal"] = json!(config::signal_name(s.cfg.stop_signal));
            }
        };
        match data.get_mut("services").and_then(Value::as_array_mut) {
            Some(list) => list.iter_mut().for_each(mark),
            None => mark(&mut data),
        }
        data
    }

    /// Answers `data` (or `error`) to a parked client and serves what it sent meanwhile.
    pub fn unpark(&mut self, client: u64, id: &Value, answer: Result<Value, Error>, now: Mono) {
        let bytes = match answer {
            Ok(data) => protocol::encode_ok(id, data),
            Err(e) => protocol::encode_err(id, &e),
        };
        self.control.answer_parked(client, &bytes);
        self.serve(client, now);
    }

    /// Answers the waiters whose service or tool got where they wait for.
    pub fn answer_waiters(&mut self, now: Mono) {
        let mut done = Vec::new();
        let mut waiting = Vec::new();
        for w in self.control.take_waiters() {
            match self.settled(&w.what, now) {
                Some(answer) => done.push((w.client, w.id, answer)),
                None => waiting.push(w),
            }
        }
        self.control.give_back(waiting);
        for (client, id, answer) in done {
            self.unpark(client, &id, answer, now);
        }
    }

    /// The answer for a waiter, once what it waits for has happened.
    fn settled(&self, what: &WaitFor, now: Mono) -> Option<Result<Value, Error>> {
        match what {
            WaitFor::Down {
                names,
                many,
                running,
            } => {
                let queued = |n: &String| self.control.held(n).is_some();
                let done = names
                    .iter()
                    .all(|n| !queued(n) && self.slots.get(n).is_none_or(|s| s.is_down()));
                if done {
                    return Some(Ok(self.stopped_answer(names, *many, running, now)));
                }
                // Answered all the same once what is left cannot end now (it outlived
                // SIGKILL by KILL_WAIT): stop_timeout plus that bound, never a hang.
                let stuck = self.stuck_stops(names, now)?;
                log::warn!("stop: {}", stuck.replace('\n', "; "));
                Some(Err(Error::new(ErrorKind::Failed, stuck)))
            }
            WaitFor::Started { names, many, by } => {
                let mut failed = Vec::new();
                for n in names {
                    match self.start_outcome(n, now) {
                        Some(Ok(())) => {}
                        Some(Err(why)) => failed.push(format!("{n} did not start: {why}")),
                        None if *by <= now => {
                            let s = &self.slots[n];
                            let why = (self.reason_of(s, now))
                                .map(|r| format!(": {r}"))
                                .unwrap_or_default();
                            failed.push(format!(
                                "{n} is not up yet: {}{why}; it is still wanted up",
                                s.svc.state.as_str()
                            ));
                        }
                        None => return None,
                    }
                }
                if failed.is_empty() {
                    Some(Ok(self.statuses(names, *many, now)))
                } else {
                    Some(Err(Error::new(ErrorKind::Failed, failed.join("\n"))))
                }
            }
            WaitFor::Upgrade(tool) => self.upgrade_settled(tool),
            WaitFor::LeaseDown { lease, by } => self.release_settled(lease, *by, now),
        }
    }
}
