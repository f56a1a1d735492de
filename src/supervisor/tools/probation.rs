//! The watch over a tool's version: its probation (committed once its services have
//! run its length, rolled back on a crash loop, a ready timeout or a health failure),
//! the leader-only probation that counts only while it runs here, the crash histories
//! a verdict rests on, kept in the record, and the regression window after a commit.

use crate::supervisor::{unix_ms, Supervisor};
use crate::time::{Clocks, Human, Mono};
use crate::tool_state::Op;
use crate::upgrade::{self, Change};

impl Supervisor {
    /// A service of a tool crash-looped or was not ready in time. In probation, that is
    /// the end of it: roll back, or stay when it may not be rolled back. Returns whether
    /// it was a probation's end (the service's own crash-loop outcome is then moot). When
    /// the record cannot be written, nothing is switched: the end waits, retried.
    pub fn probation_failed(&mut self, tool: &str, why: &str, now: Mono) -> bool {
        self.end_probation(tool, why, true, now)
    }

    /// A service of a tool in probation could not start for want of permission: the
    /// probation ends as for a failure (rolled back, or staying with nothing to go back
    /// to), but the version is not marked bad.
    pub fn probation_refused(&mut self, tool: &str, why: &str, now: Mono) -> bool {
        self.end_probation(tool, why, false, now)
    }

    fn end_probation(&mut self, tool: &str, why: &str, mark: bool, now: Mono) -> bool {
        let Some((change, op)) = self.tools.probation_end(tool, why, mark, unix_ms()) else {
            return false;
        };
        self.change_or_retry(tool, change, op, now);
        true
    }

    /// A service of a watched version (in probation, or in its regression window) went
    /// through its restart rule: its history is written into the tool's record, so a
    /// supd restarted meanwhile counts the same crashes. Written before the restart it
    /// may lead to (that comes from the loop's next pass).
    pub fn note_history(&mut self, name: &str, now: Mono) {
        let Some(slot) = self.slots.get(name) else {
            return;
        };
        let Some(tool) = slot.cfg.tool.clone() else {
            return;
        };
        let Some(new) = self.tools.history_to_note(&tool, name, &slot.svc.history) else {
            return;
        };
        self.change_or_retry(&tool, Change::record(new), Op::Note, now);
    }

    /// A probation counts only while the version runs (`probation_counts`): it is
    /// paused, what is left kept in the record, whenever it does not, and counts again
    /// once it does. Only tools in probation are looked at, through the index of their
    /// services.
    fn pause_probations(&mut self, now: Mono) {
        let in_probation: Vec<String> = self.tools.in_probation();
        for tool in in_probation {
            let counting = self.probation_counts(&tool);
            let clocks = Clocks::now();
            if let Some(new) = self.tools.probation_counting(&tool, counting, &clocks) {
                let left = Human(upgrade::probation_left(&new, &clocks));
                let v = new.proposed.clone().unwrap_or_default();
                if counting {
                    log::info!("{tool}: {v} runs: its probation counts ({left} left)");
                } else {
                    log::info!("{tool}: {v} does not run (every service of it, ready): its probation waits ({left} left)");
                }
                self.change_or_retry(&tool, Change::record(new), Op::Note, now);
            }
        }
    }

    /// Before supd stops or re-executes: every probation that counts is written with
    /// the time it has counted up to now, so the next supd (or image) goes on from here
    /// rather than from its last note. A write that fails leaves the change pending
    /// (a reexec is then refused; a stop goes on, the time since the last note lost).
    pub fn note_probations(&mut self, now: Mono) {
        let clocks = Clocks::now();
        let due: Vec<(String, crate::upgrade::Record)> = self.tools.notes_due(&clocks);
        for (tool, record) in due {
            self.change_or_retry(&tool, Change::record(record), Op::Note, now);
        }
    }

    /// The tool's services, through an index built once per change of the configs: this
    /// is asked at every turn of a probation, which must not cost a walk over every
    /// service. Those gone or moved to another tool since are left out.
    pub(super) fn members(&mut self, tool: &str) -> Vec<String> {
        let slots = &self.slots;
        let index = self.tool_index.get_or_insert_with(|| {
            let mut index: std::collections::BTreeMap<String, Vec<String>> = Default::default();
            for s in slots.values() {
                if let Some(t) = &s.cfg.tool {
                    index.entry(t.clone()).or_default().push(s.cfg.name.clone());
                }
            }
            index
        });
        let names = index.get(tool).cloned().unwrap_or_default();
        names
            .into_iter()
            .filter(|n| {
                self.slots
                    .get(n)
                    .is_some_and(|s| s.cfg.tool.as_deref() == Some(tool) && !s.removed)
            })
            .collect()
    }

    /// Whether the tool's probation counts now: its version proves itself only while it
    /// runs. Every service of the tool that is wanted up, and every leader-only one
    /// (held down while the node does not lead), runs ready on the version in
    /// probation, and at least one does; never while supd shuts down. So neither a slow
    /// stop of the old version, nor a restart delay, nor the time a leader-only service
    /// waits for the lease counts.
    pub(super) fn probation_counts(&mut self, tool: &str) -> bool {
        if self.shutting_down() {
            return false;
        }
        let Some(proposed) = self.tools.record(tool).and_then(|r| r.proposed.clone()) else {
            return false;
        };
        let mut any = false;
        for name in self.members(tool) {
            let s = &self.slots[&name];
            if s.cfg.leader_only.is_none() && s.svc.want != crate::service::Want::Up {
                continue;
            }
            if !(s.svc.is_ready(&s.cfg)
                && !Supervisor::leader_gone(s)
                && s.version.as_deref() == Some(proposed.as_str()))
            {
                return false;
            }
            any = true;
        }
        any
    }

    /// Retries what waits for its record, then commits the probations whose deadline
    /// came, once every service is ready.
    pub fn check_probations(&mut self, now: Mono) {
        self.retry_pending(now);
        self.pause_probations(now);
        let windows_over: Vec<String> = self.tools.windows_over(now);
        for tool in windows_over {
            let Some(new) = self.tools.end_window(&tool) else {
                continue;
            };
            log::info!(
                "{tool}: the regression window of {} is over",
                new.current.as_deref().unwrap_or("?")
            );
            // Told, as any change of the watch over a version (`versions` says it too).
            if self.change_or_retry(&tool, Change::record(new), Op::Note, now) {
                self.emit_upgrade(&tool);
            }
        }
        let due: Vec<String> = self.tools.commits_due(now);
        for tool in due {
            // Ready, and healthy where it has a check: a check that has not passed yet
            // holds the commit until it passes, or fails `failures` times (which ends the
            // probation). An unhealthy verdict during probation has ended it already. A
            // watchdog likewise holds it until the run's first WATCHDOG=1, or until its
            // deadline fails the probation.
            let ready = self.probation_counts(&tool)
                && self.members(&tool).iter().all(|n| {
                    let s = &self.slots[n];
                    s.svc.want == crate::service::Want::Down
                        || ((s.cfg.health.is_none()
                            || s.health.health() == crate::health::Health::Healthy)
                            && (s.cfg.watchdog.is_none() || s.health.pinged()))
                });
            if !ready {
                continue;
            }
            let window = (self.longest_of(&tool, |c| c.regression_window)).unwrap_or_default();
            let new = upgrade::probation_passed(&self.tools[&tool].record, window, &Clocks::now());
            self.change_or_retry(&tool, Change::record(new), Op::Commit, now);
        }
    }

    /// The earliest probation deadline or retry of a change waiting for its record.
    pub fn next_probation_deadline(&self) -> Option<Mono> {
        (self.tools.next_deadline().into_iter())
            .chain(self.down_retry.as_ref().map(|r| r.0))
            .min()
    }
}
