//! What `status` says of a service: its line, and why it is as it is.

use super::{Slot, Supervisor};
use crate::protocol::{LastExit, ServiceStatus};
use crate::service::{signal_label, Exit, Want};
use crate::time::Mono;

impl Supervisor {
    /// Why a service is as it is: what it waits for, or what its machine said.
    pub fn reason_of(&self, slot: &Slot, now: Mono) -> Option<String> {
        self.waiting_for(slot, now)
            .or_else(|| slot.svc.reason.clone())
    }

    /// What a pending service waits for, if anything: said in its `reason` (worked out
    /// when asked, so that the loop does not word it for every waiting service on every
    /// turn).
    pub fn waiting_for(&self, slot: &Slot, now: Mono) -> Option<String> {
        if !slot.svc.pending() {
            return None;
        }
        let mut missing: Vec<String> = (slot.cfg.after.iter())
            .filter(|d| !self.slots.get(*d).is_some_and(|x| x.svc.is_ready(&x.cfg)))
            .cloned()
            .collect();
        if let Some(l) = slot
            .cfg
            .leader_only
            .as_ref()
            .filter(|l| !self.leases.holds(l))
        {
            missing.push(format!("lease '{l}'"));
        }
        if let Some(c) = self.cleanup.as_ref().filter(|c| c.holds(&slot.cfg.name)) {
            missing.push(c.holder(&slot.cfg.name, now).map_or_else(
                || "what a previous supd left to end".into(),
                |h| h.what(now),
            ));
        }
        if let Some(k) = self.kept.iter().find(|k| k.service == slot.cfg.name) {
            missing.push(format!(
                "the run a previous supd left (pid {}) to end",
                k.pid
            ));
        }
        if slot.forking.is_some() {
            missing.push("its fork by the spawner".into());
        }
        (!missing.is_empty()).then(|| format!("waiting for {}", missing.join(", ")))
    }

    /// A service's line of `status`.
    pub fn status_of(&self, slot: &Slot, now: Mono) -> ServiceStatus {
        let svc = &slot.svc;
        let holder = self.holder(slot, now);
        let (listening, stored) = slot.kept.shown();
        ServiceStatus {
            name: slot.cfg.name.clone(),
            state: svc.state.as_str().to_string(),
            pid: svc.pid,
            version: slot.version.clone(),
            restarts: svc.restarts,
            restarts_total: svc.restarts_total,
            uptime_ms: svc
                .pid
                .and(svc.started_at)
                .map(|t| now.since(t).as_millis() as u64),
            last_exit: svc.last_exit.map(|e| match e {
                Exit::Code(c) => LastExit::Code(c),
                Exit::Signal(s) => LastExit::Signal(signal_label(s)),
            }),
            reason: self.status_reason(slot, holder.as_ref(), now),
            held_by: holder.map(|h| h.status(now)),
            // What the operator wants: a leader-only service held down by its lease alone
            // is still wanted up.
            want: if svc.want == Want::Up
                || (slot.cfg.leader_only.is_some() && !self.down.contains(&slot.cfg.name))
            {
                "up"
            } else {
                "down"
            }
            .to_string(),
            status: slot.notify.status_text().map(str::to_string),
            log_dropped: slot.output.as_ref().map(|o| o.dropped).unwrap_or(0),
            next_ms: svc.deadline.map(|d| d.since(now).as_millis() as u64),
            up: svc.is_ready(&slot.cfg),
            // Of a run that is up: a service without one (stopped, exited, failed,
            // waiting to restart) is healthy no more, nor unhealthy: null.
            health: self
                .health_of(&slot.cfg.name)
                .filter(|_| svc.pid.is_some())
                .map(|h| h.health.as_str().to_string()),
            health_failures: slot.cfg.health.as_ref().map(|_| slot.health.failures()),
            health_last_failure: slot.health.last_failure().map(|f| {
                crate::protocol::HealthFailure {
                    reason: f.reason.clone(),
                    time_ms: f.time_ms,
                }
            }),
            unhealthy_since_ms: slot.health.unhealthy_since_ms(),
            // Those of ended runs, and those of the run that goes on (a worker killed).
            oom_kills: svc.oom_kills.saturating_add(
                match (self.cgroups.as_ref(), slot.instance.as_ref()) {
                    (Some(c), Some(i)) if i.exit.is_none() => {
                        let n = super::reap::oom_rise(c, &slot.cfg.name, i.oom_at_start);
                        u32::try_from(n).unwrap_or(u32::MAX)
                    }
                    _ => 0,
                },
            ),
            // Read from its cgroups while a run is there: a stopped service costs none.
            resources: (self.cgroups.as_ref())
                .filter(|_| slot.instance.is_some())
                .map(|c| c.usage(&slot.cfg.name)),
            listening,
            stored_fds: stored
                .into_iter()
                .map(|(name, what)| crate::protocol::StoredFd { name, what })
                .collect(),
        }
    }
}
