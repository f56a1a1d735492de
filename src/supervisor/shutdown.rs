//! The end of supd: every service stopped in reverse `after` order within
//! `shutdown_timeout`, then the exit (or, as a system's init, the final action). What
//! SIGKILL cannot end (an uninterruptible sleep, a frozen cgroup) is not waited for past
//! `shutdown_timeout` plus `unkillable::KILL_WAIT`: supd exits naming it, and leaves
//! its pid record and cgroup for the next supd, which waits for it before it starts its
//! service again.

use super::*;

impl Supervisor {
    /// System mode: stop everything, then end the system with `action`.
    pub fn begin_final(&mut self, action: crate::pid1::Final, now: Mono) {
        log::warn!("{}: stopping every service", action.as_str());
        self.final_action.get_or_insert(action);
        self.begin_shutdown(0, now);
    }

    /// Begins stopping everything; supd exits with `code` once all is down.
    pub fn begin_shutdown(&mut self, code: i32, now: Mono) {
        match &mut self.shutdown {
            Some(sd) => sd.code = sd.code.max(code),
            None => {
                log::info!("shutting down: stopping every service");
                // What a probation counted is written before its services stop.
                self.note_probations(now);
                self.drop_forks();
                self.shutdown = Some(Shutdown {
                    deadline: now.plus(self.cfg.supd.shutdown_timeout),
                    code,
                    killed: false,
                    looked: false,
                });
            }
        }
    }

    /// Stops each service whose dependents are down (reverse `after` order); sets `exit`
    /// when no service process is left.
    pub(super) fn shutdown_step(&mut self, now: Mono) {
        let all = self
            .shutdown
            .as_mut()
            .is_some_and(|s| !std::mem::replace(&mut s.looked, true));
        let names: BTreeSet<String> = if all {
            self.slots.keys().cloned().collect()
        } else {
            let touched = self.slots.touched();
            let after = touched
                .iter()
                .filter_map(|n| self.slots.get(n))
                .flat_map(|s| s.cfg.after.iter().cloned());
            touched.iter().cloned().chain(after).collect()
        };
        for name in &names {
            let Some(s) = self.slots.get(name) else {
                continue;
            };
            if s.svc.want == Want::Down
                && s.svc.state != State::Starting
                && s.svc.state != State::Running
            {
                continue;
            }
            let dependents_up = self
                .dependents_of(name)
                .iter()
                .any(|d| self.slots.get(d).is_some_and(|o| o.instance.is_some()));
            if !dependents_up {
                self.apply(name, Event::Stop, now);
            }
        }
        // A leader not reaped yet, or a run draining, has its slot up: the look at every
        // slot waits for the end.
        let maybe_down = self.pids.is_empty() && self.draining.is_empty();
        if maybe_down
            && self
                .slots
                .values()
                .all(|s| s.svc.pid.is_none() && s.instance.is_none())
        {
            let code = self.shutdown.as_ref().map(|s| s.code).unwrap_or(0);
            if let Some(c) = &self.cleanup {
                log::warn!(
                    "leaving what a previous supd left of {} (its records stay for the next supd)",
                    c.services.join(", ")
                );
            }
            if self.final_action.is_some() || self.system {
                log::info!("every service is down");
            } else {
                log::info!("every service is down; exiting with status {code}");
            }
            self.exit = Some(code);
        }
    }

    /// The shutdown's deadlines: at `shutdown_timeout`, SIGKILL to whatever is left; a
    /// `KILL_WAIT` later, the exit, naming what outlived it.
    pub(super) fn shutdown_timers(&mut self, now: Mono) {
        let Some(sd) = self.shutdown.as_mut().filter(|sd| sd.deadline <= now) else {
            return;
        };
        if !sd.killed {
            sd.killed = true;
            log::warn!("shutdown_timeout passed: killing what is left");
            for i in self.slots.values().filter_map(|s| s.instance.as_ref()) {
                i.kill_all(&self.pids);
            }
        } else if sd.deadline.plus(crate::unkillable::KILL_WAIT) <= now && self.exit.is_none() {
            let code = sd.code.max(1);
            let left: Vec<String> = (self.slots.values())
                .filter_map(|s| {
                    let i = s.instance.as_ref()?;
                    let pids = i.pids(&self.pids).into_iter().map(|p| (p, None));
                    let what = match crate::unkillable::first_alive(pids) {
                        Some((seen, 0)) => format!("pid {}: {}", seen.pid, seen.describe()),
                        Some((seen, n)) => {
                            format!("pid {}: {} (and {n} more)", seen.pid, seen.describe())
                        }
                        None => format!("pid {}", i.pid),
                    };
                    Some(format!("{} ({what})", s.cfg.name))
                })
                .collect();
            log::error!(
                "shutdown_timeout passed and these did not end after SIGKILL: {}; exiting with status {code}, leaving them: their pid records and cgroups stay, and the next supd waits for them before it starts their services",
                left.join(", ")
            );
            self.exit = Some(code);
        }
    }

    /// The shutdown's next deadline, if one is under way.
    pub(super) fn shutdown_deadline(&self) -> Option<Mono> {
        let sd = self.shutdown.as_ref()?;
        match sd.killed {
            false => Some(sd.deadline),
            true if self.exit.is_none() => Some(sd.deadline.plus(crate::unkillable::KILL_WAIT)),
            true => None,
        }
    }

    /// Whether a shutdown is under way.
    pub fn shutting_down(&self) -> bool {
        self.shutdown.is_some()
    }
}
