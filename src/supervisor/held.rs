//! What holds a service back: a process of a run that is killed and not gone (it cannot
//! die now: an uninterruptible sleep, a frozen cgroup), left by a previous supd or of
//! the service's own stopped run. No new run starts while it lives; `status` and `stop`
//! say which pid, in which state.

use super::*;
use crate::unkillable::{first_alive, Holder, Run};

impl Supervisor {
    /// What holds `slot`'s service back, if anything: what a previous supd left of it,
    /// or its last run outliving SIGKILL (stopped, or its leader gone and the rest of
    /// the run killed with it).
    pub(crate) fn holder(&self, slot: &Slot, now: Mono) -> Option<Holder> {
        let name = &slot.cfg.name;
        if let Some(c) = self.cleanup.as_ref().filter(|c| c.holds(name)) {
            return c.holder(name, now);
        }
        let instance = slot.instance.as_ref()?;
        // Stopped and outliving SIGKILL, or draining: its leader reaped, the rest of the
        // run killed with it (and again on the drain's backoff) and there past KILL_WAIT.
        let draining = instance
            .reaped_at
            .filter(|at| now.since(*at) >= crate::unkillable::KILL_WAIT);
        let since = slot.svc.unkillable().or(draining)?;
        let (seen, more) = first_alive(instance.pids(&self.pids).into_iter().map(|p| (p, None)))?;
        Some(Holder {
            seen,
            run: Run::Last,
            more,
            since,
        })
    }

    /// Whether `slot`'s run has lost its leader and waits for the rest of it to go: the
    /// service is not up, whatever its state says until the run is over (a probation
    /// does not count it).
    pub(crate) fn leader_gone(slot: &Slot) -> bool {
        slot.instance.as_ref().is_some_and(|i| i.leader_gone())
    }

    /// The reason `status` gives: what holds a stopped run back, after how its main
    /// process ended when it was reaped.
    pub(crate) fn status_reason(
        &self,
        slot: &Slot,
        holder: Option<&Holder>,
        now: Mono,
    ) -> Option<String> {
        let held = holder
            .filter(|h| h.run == Run::Last)
            .map(|h| h.waiting(now));
        match (slot.instance.as_ref().and_then(|i| i.exit), held) {
            (Some(exit), held) => Some(format!(
                "its main process {exit}; waiting for the rest of its run to exit{}",
                held.map(|h| format!(": {h}")).unwrap_or_default()
            )),
            (None, Some(held)) => Some(held),
            (None, None) => self.reason_of(slot, now),
        }
    }

    /// What a previous supd left: an exit, or a deadline. A service released (nothing
    /// of it is left) is looked at by the next start pass, whatever is left of others.
    pub fn cleanup_step(&mut self, now: Mono) {
        let Some(c) = self.cleanup.as_mut() else {
            return;
        };
        let was_past = c.past_rounds();
        let released = c.step(now);
        // Every service may start at the end, the others than those held at once past
        // the KILL rounds: a start pass looks at them.
        let over = c.is_over();
        if over || c.past_rounds() != was_past || !released.is_empty() {
            self.starts.recheck();
        }
        if over {
            self.cleanup = None;
            // What the runs left had in the v1 hierarchies, for services no longer
            // defined (a defined one's are its own again).
            if let Some(c) = self.cgroups.as_ref() {
                c.remove_v1_unused(|name| self.slots.get(name).is_some());
            }
            self.end_kept(now);
        }
    }

    /// Ends the kept runs (`kept`) whose service is defined again, or all of them once
    /// no file is broken: through a cleanup of their own, which holds back only them
    /// (after the one under way, if any). Its service then starts anew, as after a kill
    /// of supd: never beside its old run.
    pub fn end_kept(&mut self, now: Mono) {
        if self.cleanup.is_some() || self.kept.is_empty() {
            return;
        }
        let all = self.broken_files.is_empty();
        let (ending, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.kept)
            .into_iter()
            .partition(|k| all || self.slots.get(&k.service).is_some_and(|s| !s.removed));
        self.kept = kept;
        if ending.is_empty() {
            return;
        }
        let names: Vec<String> = ending.into_iter().map(|k| k.service).collect();
        log::warn!(
            "ending what a previous supd left of {}: {}",
            names.join(", "),
            if all {
                "no config file is broken any more"
            } else {
                "its config file loads now"
            }
        );
        let grace = (names.iter())
            .filter_map(|n| self.slots.get(n).map(|s| s.cfg.stop_timeout))
            .max()
            .unwrap_or(Duration::from_secs(10));
        let state_dir = self.cfg.supd.state_dir.clone();
        // Each run ended as its service's kill_mode says (a kept sshd's sessions live on;
        // a run's recorded mode wins over the config's).
        let narrow = self.cfg.narrow_kill_modes();
        self.cleanup =
            crate::leftovers::Cleanup::begin_only(&state_dir, &names, grace, narrow, now);
        self.starts.recheck();
    }

    /// `stop` of `names` once no stop among them is under way any more, though not all
    /// are down: what is left of each cannot end now (it outlived SIGKILL), or waits for
    /// such a one (a stop held until services after it are down). `None` while a stop
    /// may still end.
    pub(crate) fn stuck_stops(&self, names: &[String], now: Mono) -> Option<String> {
        let queued = |n: &String| self.control.held(n);
        let unkillable = |n: &String| {
            self.slots
                .get(n)
                .is_some_and(|s| !s.is_down() && s.svc.unkillable().is_some())
        };
        // The held stops that wait, however indirectly, for a run that cannot end.
        let mut stuck: Vec<(&String, &String)> = Vec::new();
        loop {
            let more: Vec<(&String, &String)> = (self.control.all_held().iter())
                .filter(|q| !stuck.iter().any(|(n, _)| *n == &q.name))
                .filter_map(|q| {
                    let d = q
                        .until_down
                        .iter()
                        .find(|d| unkillable(d) || stuck.iter().any(|(n, _)| n == d))?;
                    Some((&q.name, d))
                })
                .collect();
            if more.is_empty() {
                break;
            }
            stuck.extend(more);
        }
        let mut said = Vec::new();
        for n in names {
            let down = self.slots.get(n).is_none_or(|s| s.is_down());
            if let Some((_, d)) = stuck.iter().find(|(s, _)| *s == n) {
                said.push(format!(
                    "{n}: not stopped: it is stopped once {d} is down, which cannot end now"
                ));
            } else if queued(n).is_some() {
                return None;
            } else if unkillable(n) {
                let slot = &self.slots[n];
                let what = self.holder(slot, now).map_or_else(
                    || "a process of its last run did not end after SIGKILL".to_string(),
                    |h| {
                        format!(
                            "pid {} did not end after SIGKILL: {}",
                            h.seen.pid,
                            h.seen.describe()
                        )
                    },
                );
                said.push(format!(
                    "{n}: {what}; it is not started again until it is gone"
                ));
            } else if !down {
                return None;
            }
        }
        (!said.is_empty()).then(|| said.join("\n"))
    }
}
