//! The coordinator's side of leases: what the leases part (`leases.rs`) answers, carried
//! out on the slots: leader-only services started, restarted or stopped, their guards
//! armed and replaced, the candidacy read from their states, the lease events told.

use super::{unix_ms, Slot, Supervisor};
use crate::deadman::disarm;
use crate::leases::{
    failing, health_hold, Expired, GrantEnds, Granted, ServiceHealth, ServiceRun, RELEASE_GRACE,
};
use crate::protocol::{Error, ErrorKind};
use crate::service::{Event, State, Want};
use crate::time::Mono;
use crate::upgrade::Phase;
use serde_json::{json, Value};
use std::time::Duration;

impl Supervisor {
    fn known_lease(&self, lease: &str) -> Result<(), Error> {
        if self.cfg.leases.contains_key(lease) {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::UnknownLease,
                format!("no [lease.{lease}] in the config"),
            ))
        }
    }

    /// The services that run only while this node holds `lease`.
    pub fn leader_only(&self, lease: &str) -> Vec<String> {
        self.slots
            .iter()
            .filter(|(_, s)| s.cfg.leader_only.as_deref() == Some(lease))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Whether a leader-only service of `lease` runs `tool`: its probation proves itself
    /// only while this node leads, so the candidacy offers the lease on trial.
    fn runs_leader_only(&self, lease: &str, tool: &str) -> bool {
        self.leader_only(lease)
            .iter()
            .any(|n| self.slots[n].cfg.tool.as_deref() == Some(tool))
    }

    /// The health of the leader-only services of `lease`, for a candidacy.
    fn leader_only_health(&self, lease: &str) -> Vec<ServiceHealth> {
        self.leader_only(lease)
            .into_iter()
            .map(|name| {
                let hold = self.slots[&name].cfg.policy.cooldown;
                let last = self.leases.unhealthy_since(&name);
                // A verdict about the run under way: a stopped service keeps its last
                // one, which the hold below speaks for.
                let up = matches!(
                    self.slots[&name].svc.state,
                    State::Starting | State::Running
                );
                let unhealthy = up
                    && self
                        .health_of(&name)
                        .is_some_and(|h| h.health == crate::health::Health::Unhealthy);
                ServiceHealth {
                    unhealthy,
                    since: last.map(|(at, _)| *at),
                    failure: last.map(|(_, why)| why.clone()),
                    name,
                    hold,
                }
            })
            .collect()
    }
    /// `lease-candidacy`: this node's version of the lease's tool, and whether it may lead.
    /// `healthy` is false (with the `reason`) while a leader-only service of the lease is
    /// unhealthy, or was so less than its `cooldown` ago ([`health_hold`]); `failing`
    /// says why one cannot run now (failed, in its crash-loop cooldown, unhealthy:
    /// [`failing`]), null when none.
    pub fn candidacy(&mut self, lease: &str, now: Mono) -> Result<Value, Error> {
        self.known_lease(lease)?;
        let health = self.leader_only_health(lease);
        let hold = health_hold(&health, now);
        let runs: Vec<ServiceRun> = health
            .iter()
            .map(|h| ServiceRun {
                name: h.name.clone(),
                state: self.slots[&h.name].svc.state,
                unhealthy: h.unhealthy,
                reason: self.slots[&h.name].svc.reason.clone(),
            })
            .collect();
        let mut c = self.candidacy_of_tool(lease, now)?;
        c["healthy"] = json!(hold.is_none());
        c["reason"] = json!(hold);
        c["failing"] = json!(failing(&runs));
        Ok(c)
    }

    /// The candidacy's version, and whether it is committed, running and irreversible;
    /// `trial` when the tool waits in a probation that a leader-only service of the lease
    /// must pass, which only leading lets it run (sup-lease(8), THE RULE).
    fn candidacy_of_tool(&mut self, lease: &str, now: Mono) -> Result<Value, Error> {
        let tool = self.cfg.leases[lease].tool.clone();
        let Some(tool) = tool else {
            return Ok(
                json!({"lease": lease, "tool": null, "version": null, "committed": true, "running": true, "irreversible": false}),
            );
        };
        self.ensure_tool(&tool, now);
        let r = &self.tools[&tool].record;
        let version = r
            .current
            .clone()
            .or_else(|| crate::versions::current(&self.cfg.supd.tools_dir, &tool));
        let irreversible = version.as_ref().is_some_and(|v| {
            r.irreversible.contains(v)
                || crate::versions::irreversible(
                    &crate::versions::tool_dir(&self.cfg.supd.tools_dir, &tool).join(v),
                )
                .unwrap_or(false)
        });
        let services = self.tool_services(&tool);
        let running = !services.is_empty()
            && services
                .iter()
                .all(|n| self.slots[n].svc.state == State::Running);
        let in_probation = r.phase == Phase::Probation;
        Ok(json!({
            "lease": lease,
            "tool": tool,
            "version": version,
            "committed": !in_probation && version.is_some(),
            "running": running,
            "irreversible": irreversible,
            "trial": in_probation && version.is_some() && self.runs_leader_only(lease, &tool),
        }))
    }

    /// `lease-grant`: this node leads until the grant's end, unless granted again. A
    /// grant that is already over when it arrives is answered and changes nothing.
    pub fn grant(
        &mut self,
        lease: &str,
        holder: &str,
        term: u64,
        ends: GrantEnds,
        now: Mono,
    ) -> Result<Value, Error> {
        self.known_lease(lease)?;
        let (old, d, earlier) = match self.leases.grant(lease, holder, term, ends)? {
            Granted::Late => {
                return Ok(json!({"lease": lease, "term": term, "valid_for_ms": 0}));
            }
            Granted::Held {
                before,
                valid_for,
                earlier,
            } => (before, valid_for, earlier),
        };
        // Newly held: its leader-only services may start (a renewal changes nothing).
        if old.is_none() {
            self.starts.recheck();
        }
        if earlier {
            self.replace_guards(lease);
        }
        let what = if old == Some(term) {
            "renewed"
        } else {
            "granted"
        };
        if what == "granted" {
            log::info!("lease {lease}: this node leads (term {term}, holder {holder})");
        }
        self.emit_lease(lease, what, Some(term), Some(d));
        for name in self.leader_only(lease) {
            let slot = &self.slots[&name];
            if self.down.contains(&name) {
                continue;
            }
            // A new term while running: the services restart with the new fencing token.
            let stale = old.is_some_and(|t| t != term) && slot.svc.pid.is_some();
            let ev = if stale { Event::Restart } else { Event::Start };
            if stale || slot.svc.want == Want::Down || slot.svc.pending() {
                self.apply(&name, ev, now);
            }
        }
        Ok(json!({"lease": lease, "term": term, "valid_for_ms": d.as_millis() as u64}))
    }

    /// `lease-grant` with `stopping`: time to stop, not to lead. The holder stepped down
    /// (`lease-release`) and keeps renewing its store lease and its key while the
    /// leader-only services stop; each renewal moves their guards' end as a grant would,
    /// so a slow stop is not cut at the last grant's end, and a frozen supd still cannot
    /// keep them past the last renewal. While a grant is held (no release under way), it
    /// is refused: it would shorten nothing and start nothing.
    pub fn grant_stopping(
        &mut self,
        lease: &str,
        term: u64,
        ends: GrantEnds,
    ) -> Result<Value, Error> {
        self.known_lease(lease)?;
        let down = self.leader_only_down(lease);
        let (valid_for, earlier) = self.leases.grant_stopping(lease, ends, down)?;
        if earlier {
            self.replace_guards(lease);
        }
        Ok(json!({"lease": lease, "term": term, "stopping": true,
                  "valid_for_ms": valid_for.as_millis() as u64}))
    }

    /// Posts the end of `lease`'s grant on its board (`Leases::post_grant_end`), and
    /// replaces the guards of its runs if it moved earlier.
    pub(crate) fn post_grant_end(&mut self, lease: &str) {
        if self.leases.post_grant_end(lease) {
            self.replace_guards(lease);
        }
    }

    /// `lease-release`: stop the leader-only services now; the caller waits for them, until
    /// the time returned at the most: `RELEASE_GRACE` after the last SIGKILL is due.
    pub fn release(&mut self, lease: &str, now: Mono) -> Result<Mono, Error> {
        self.known_lease(lease)?;
        if let Some(term) = self.leases.release(lease) {
            log::info!("lease {lease}: released (term {term})");
            self.emit_lease(lease, "released", Some(term), None);
        }
        // A release keeps the key until the services exited: they may stop gracefully.
        self.stop_leader_only(lease, "lease released", None, now);
        let kill_at = self
            .leader_only(lease)
            .iter()
            .filter(|n| self.slots[*n].svc.state == State::Stopping)
            .filter_map(|n| self.slots[n].svc.deadline)
            .fold(now, Mono::max);
        Ok(kill_at.plus(RELEASE_GRACE))
    }

    /// The answer to a `lease-release` once the leader-only services have exited, or at
    /// `by` with the pids of what is left: a process SIGKILLed in uninterruptible sleep
    /// (a hung disk, a frozen cgroup) dies when it wakes, and runs no code of its own
    /// before; waiting for it would hold the lease on this node forever.
    pub(crate) fn release_settled(
        &self,
        lease: &str,
        by: Mono,
        now: Mono,
    ) -> Option<Result<Value, Error>> {
        if self.leader_only_down(lease) {
            return Some(Ok(json!({"lease": lease, "released": true})));
        }
        if now < by {
            return None;
        }
        let mut wedged: Vec<i32> = self
            .leader_only(lease)
            .iter()
            .filter_map(|n| self.slots[n].instance.as_ref())
            .flat_map(|i| i.pids(&self.pids))
            .collect();
        wedged.sort_unstable();
        wedged.dedup();
        log::warn!("lease {lease}: released with processes killed but not yet gone (uninterruptible sleep): {wedged:?}");
        Some(Ok(
            json!({"lease": lease, "released": true, "wedged": wedged}),
        ))
    }

    /// Whether every leader-only service of `lease` has exited.
    pub fn leader_only_down(&self, lease: &str) -> bool {
        self.leader_only(lease)
            .iter()
            .all(|n| self.slots[n].is_down())
    }

    /// Stops the leader-only services of `lease`; with `hurry`, SIGKILL comes after that
    /// long at the most, whatever their `stop_timeout`.
    fn stop_leader_only(&mut self, lease: &str, why: &str, hurry: Option<Duration>, now: Mono) {
        for name in self.leader_only(lease) {
            self.apply(&name, Event::Stop, now);
            if let Some(s) = self.slots.get_mut(&name) {
                s.svc.reason = Some(format!("{why}; waiting for lease '{lease}'"));
                if let (Some(h), Some(d)) = (hurry, s.svc.deadline) {
                    s.svc.deadline = Some(d.min(now.plus(h)));
                }
            }
        }
    }

    /// Ends the grants whose validity ran out: their services stop.
    pub fn expire_grants(&mut self, now: Mono) {
        for Expired {
            lease,
            term,
            kill_grace,
        } in self.leases.expire()
        {
            log::warn!("lease {lease}: the grant of term {term} ran out without renewal; stopping its leader-only services");
            self.emit_lease(&lease, "expired", Some(term), None);
            // Another node may lead soon: no graceful stop past the kill grace.
            self.stop_leader_only(&lease, "lease expired", Some(kill_grace), now);
        }
    }

    fn emit_lease(
        &mut self,
        lease: &str,
        what: &str,
        term: Option<u64>,
        valid_for: Option<Duration>,
    ) {
        let e = json!({"event": "lease", "lease": lease, "what": what, "term": term,
                       "valid_for_ms": valid_for.map(|d| d.as_millis() as u64), "time": unix_ms()});
        self.control.broadcast(&crate::protocol::line(e));
    }

    /// Whether `pid`, just reaped, was a run's guard. A guard that died while its run
    /// goes on (someone killed it) is replaced; one that cannot be is not left
    /// unguarded: the run is killed, and starts again with a guard if it still may.
    pub(crate) fn guard_died(&mut self, pid: i32) -> bool {
        let Some(name) = (self.slots.iter())
            .find(|(_, s)| s.instance.as_ref().is_some_and(|i| i.guard == Some(pid)))
            .map(|(n, _)| n.clone())
        else {
            return false;
        };
        let Some(slot) = self.slots.get_mut(&name) else {
            return false;
        };
        let lease = run_lease(slot).unwrap_or_default();
        let Some(run) = slot.instance.as_mut() else {
            return false;
        };
        run.guard = None;
        if run.leader_gone() {
            return true; // the rest of the run was killed with its leader already
        }
        let armed = (self.leases.guard(&lease, run.pid, run.guard_cgroup()))
            .unwrap_or_else(|| Err("no dead-man pipe".into()));
        match armed {
            Ok(g) => {
                log::warn!("{name}: its dead-man guard {pid} died; a new one ({g}) guards the run");
                run.guard = Some(g);
            }
            Err(e) => {
                log::error!("{name}: its dead-man guard {pid} died and {e}; killing the run");
                run.kill_all(&self.pids);
            }
        }
        true
    }

    /// Replaces the guard of each run of `lease` by a new one, which reads the board
    /// afresh: the end was moved earlier than the guards' (they sleep until the end they
    /// read). The new guard is armed before the old one is ended, so the run is never
    /// unguarded; one that cannot be armed leaves the old guard, whose end is later,
    /// and supd stops the run at the new end itself.
    pub(crate) fn replace_guards(&mut self, lease: &str) {
        let runs: Vec<String> = (self.slots.iter())
            .filter(|(_, s)| run_lease(s).as_deref() == Some(lease))
            .map(|(n, _)| n.clone())
            .collect();
        for name in runs {
            let Some(run) = self.slots.get_mut(&name).and_then(|s| s.instance.as_mut()) else {
                continue;
            };
            let Some(old) = run.guard.filter(|_| !run.leader_gone()) else {
                continue;
            };
            let Some(armed) = self.leases.guard(lease, run.pid, run.guard_cgroup()) else {
                continue;
            };
            match armed {
                Ok(g) => {
                    log::info!("{name}: the grant's end moved earlier; a new dead-man guard ({g}) holds it");
                    run.guard = Some(g);
                    disarm(old);
                }
                Err(e) => log::error!("{name}: the grant's end moved earlier and {e}; its guard {old} holds the later end"),
            }
        }
    }

    /// Replaces the guard of every leader-only run (guards of an older image that read
    /// no board): the old guard is ended, and reaped as any guard is.
    pub(crate) fn rearm_guards(&mut self) {
        for slot in self.slots.values_mut() {
            if run_lease(slot).is_none() {
                continue;
            }
            if let Some(g) = slot.instance.as_mut().and_then(|i| i.guard.take()) {
                disarm(g);
            }
        }
        self.arm_unguarded();
    }

    /// Arms a guard for every leader-only run that has none (taken over from a supd
    /// without dead-man switches): its leader is still this process's child.
    pub(crate) fn arm_unguarded(&mut self) {
        let unguarded: Vec<String> = self
            .slots
            .iter()
            .filter(|(_, s)| run_lease(s).is_some())
            .filter(|(_, s)| {
                s.instance
                    .as_ref()
                    .is_some_and(|i| i.guard.is_none() && !i.leader_gone())
            })
            .map(|(n, _)| n.clone())
            .collect();
        if unguarded.is_empty() {
            return;
        }
        if let Err(e) = self.leases.ensure_deadman() {
            log::error!("cannot make the dead-man pipe: {e}; leader-only runs are unguarded");
            return;
        }
        for name in unguarded {
            let Some(slot) = self.slots.get_mut(&name) else {
                continue;
            };
            let lease = run_lease(slot).unwrap_or_default();
            let Some(run) = slot.instance.as_mut() else {
                continue;
            };
            let Some(armed) = self.leases.guard(&lease, run.pid, run.guard_cgroup()) else {
                continue;
            };
            match armed {
                Ok(g) => run.guard = Some(g),
                Err(e) => {
                    log::error!("{name}: {e}; killing the run, which may not go unguarded");
                    run.kill_all(&self.pids);
                }
            }
        }
    }
}

/// The lease whose board guards the run of `slot`: the one it was started under, else
/// (a run of an older image, which did not say) the one the config names.
fn run_lease(slot: &Slot) -> Option<String> {
    (slot.instance.as_ref())
        .and_then(|i| i.lease.clone())
        .or_else(|| slot.cfg.leader_only.clone())
}
