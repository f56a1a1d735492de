//! The start pass: which pending services may start (their `after` ready, their
//! previous run over, no hold), at most `SPAWNS_PER_PASS` or `PASS_TIME` a pass, looking
//! only at the touched services and those after them. What it remembers between passes
//! is the starts part's (`starts.rs`).

use super::*;
use crate::starts::{pass_is_over, SPAWNS_PER_PASS};

impl Supervisor {
    /// The next pass, at once, looks at every pending service: services became pending
    /// during a pass (a start that restarted others), after it chose what to look at.
    pub(crate) fn look_again_at_every_pending(&mut self) {
        self.starts.look_again_at_every_pending();
    }

    /// Starts what may start, each service at most once, for at most `PASS_TIME` of the
    /// monotonic clock (at least one) and `SPAWNS_PER_PASS` in all: a start that fails
    /// at once, or a burst of thousands, never keeps the loop from going round (signals,
    /// clients, exits); what is left starts on the next pass, which then comes at once
    /// (`more_to_start`).
    pub(super) fn start_some(&mut self, now: Mono) {
        let mut spawned: BTreeSet<String> = BTreeSet::new();
        let began = Mono::now();
        self.note_pending();
        // Only a change to a slot makes it, or those after it, startable (or a change
        // outside the slots, which asks for a look at all of them).
        let (mut look, all) = self.starts.begin_pass();
        if !all {
            let touched: Vec<String> = self.slots.touched().iter().cloned().collect();
            for name in touched {
                look.extend(self.dependents_of(&name));
                look.insert(name);
            }
        }
        // Rounds: a service started now may make others (`after` it) startable.
        loop {
            look.retain(|n| self.starts.is_pending(n));
            let want = SPAWNS_PER_PASS + 1 - spawned.len();
            let batch: Vec<String> = self.startable(&look, &spawned, want);
            if batch.is_empty() {
                return;
            }
            let mut next = BTreeSet::new();
            for name in batch {
                let over = pass_is_over(spawned.len(), || Mono::now().since(began));
                if over || !crate::spawner::room() {
                    // The next pass goes on with what this one looked at: at once, or
                    // when the spawner's queue has room again (its answers wake the
                    // loop).
                    look.extend(next);
                    self.starts.cut_pass(over, look);
                    return;
                }
                self.spawn(&name, now);
                next.extend(self.dependents_of(&name));
                spawned.insert(name);
            }
            look = next;
        }
    }

    /// Configs changed: the services `after` each are worked out again when needed.
    pub(crate) fn forget_dependents(&mut self) {
        self.dependents = None;
        self.tool_index = None;
    }

    /// The services that come `after` `name`.
    pub(super) fn dependents_of(&mut self, name: &str) -> Vec<String> {
        let slots = &self.slots;
        let map = self.dependents.get_or_insert_with(|| {
            let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (n, s) in slots.iter() {
                for d in &s.cfg.after {
                    map.entry(d.clone()).or_default().push(n.clone());
                }
            }
            map
        });
        map.get(name).cloned().unwrap_or_default()
    }

    /// Brings `pending` up to date with the slots touched so far this turn.
    pub(super) fn note_pending(&mut self) {
        for name in self.slots.touched() {
            let pending = self.slots.get(name).is_some_and(|s| s.svc.pending());
            self.starts.note(name, pending);
        }
    }

    /// Up to `max` of `among` that are pending and whose `after` services are all ready,
    /// but for `except`, in name order.
    pub(super) fn startable(
        &self,
        among: &BTreeSet<String>,
        except: &BTreeSet<String>,
        max: usize,
    ) -> Vec<String> {
        (among.iter())
            .filter(|n| !except.contains(*n) && self.may_start(n))
            .take(max)
            .cloned()
            .collect()
    }

    /// Whether `name` may be started now: pending, not asked for yet, and what it waits
    /// for is there.
    pub(crate) fn may_start(&self, name: &str) -> bool {
        let Some(s) = self.slots.get(name) else {
            return false;
        };
        // Down for a held stop or restart of a service it comes after (`queued`): it
        // starts again once that one has restarted, not before, or the held one, which
        // waits for all its dependents named with it to be down at once, might never.
        let held = || self.control.holds_down(name);
        let lease_held = || {
            s.cfg
                .leader_only
                .as_ref()
                .is_none_or(|l| self.leases.holds(l))
        };
        s.svc.pending()
            && !s.removed
            && s.instance.is_none()
            && s.forking.is_none()
            && self.shutdown.is_none()
            && !self.cleanup.as_ref().is_some_and(|c| c.holds(name))
            && !self.kept.iter().any(|k| k.service == *name)
            && !held()
            && self.deps_ready(&s.cfg)
            && lease_held()
    }

    pub(super) fn deps_ready(&self, cfg: &ServiceConfig) -> bool {
        cfg.after
            .iter()
            .all(|d| self.slots.get(d).is_some_and(|s| s.svc.is_ready(&s.cfg)))
    }
}
