//! The supervisor's side of versioned tools: records loaded and put right at start,
//! upgrades with probation, commit, automatic and operator rollback, versions a tool
//! switched to by itself, and installs and prunes done by helper processes so that a
//! large copy or delete never blocks the loop.
//!
//! Every change of a tool is an [`upgrade::Change`] carried out by one executor,
//! [`Supervisor::carry_out`], in the one order that is safe: the record written durably,
//! then `current` switched, then the services restarted; it stops at the first failure.
//! So `current` never names a version that the durable record does not explain, and a
//! crash between two steps leaves a record that `upgrade::reconcile` puts right at the
//! next start. An operator's change that cannot be written is refused ("nothing
//! changed"); supd's own (a rollback, a commit, a self-switch, the fix at start) waits
//! in a visible state and is retried with a growing delay, with nothing switched.
//!
//! What each tool holds (records, deadlines, changes waiting, helpers) is the tools
//! part's (`tool_state.rs`); this is the coordinator's side, which carries its answers
//! out on the slots and the files. Its files: `load.rs` a tool's record at start,
//! `start.rs` the check before a tool's service starts (a self-switch, a bad version
//! switched back), `probation.rs` the watch over a new version, `tasks.rs` the helpers
//! that install and prune and check a `reexec`'s program (what they run is
//! `tools.rs`'s).

mod load;
mod probation;
mod start;
mod tasks;

use super::{unix_ms, Supervisor};
use crate::failpoint;
use crate::protocol::{Error, ErrorKind};
use crate::time::{Clocks, Human, Mono};
use crate::tool_state::{errno_text, Failure, Op};
use crate::upgrade::{self, Change, Phase, Request};
use crate::versions;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

fn failed(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Failed, msg)
}

fn bad_request(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::BadRequest, msg)
}

impl Supervisor {
    /// The executor: carries out `change` in order (record, link, restart), stopping at
    /// the first failure. The record is held once it is durable; the probation's timer
    /// follows the record.
    fn carry_out(
        &mut self,
        tool: &str,
        change: &Change,
        op: &Op,
        now: Mono,
    ) -> Result<(), Failure> {
        let name = op.name();
        // A probation is recorded paused from its first write unless the version runs
        // now (it does not yet at an upgrade: its services restart after): a supd
        // killed before its next turn must not find a probation that counted while
        // nothing of it ran.
        // (Not at load: the services have not started yet, or a reexec's image has not
        // taken them over yet; the loop's next turn looks.)
        let waits = match matches!(op, Op::Load) || self.probation_counts(tool) {
            true => None,
            false => upgrade::pause(&change.record, &Clocks::now()),
        };
        let paused;
        let change = match waits {
            Some(record) => {
                paused = Change {
                    record,
                    ..change.clone()
                };
                &paused
            }
            None => change,
        };
        let held = self.tools.record(tool);
        let written;
        let change = if held != Some(&change.record) {
            written = Change {
                record: upgrade::noted(&change.record, &Clocks::now()),
                ..change.clone()
            };
            &written
        } else {
            change
        };
        if held != Some(&change.record) {
            failpoint::hit(&format!("{name}-before-record"));
            let dir = &self.cfg.supd.state_dir;
            versions::save_record(dir, tool, &change.record).map_err(|e| {
                Failure::Record(format!(
                    "cannot write record {}: {}",
                    versions::record_path(dir, tool).display(),
                    errno_text(&e)
                ))
            })?;
            failpoint::hit(&format!("{name}-after-record"));
        }
        self.tools.hold_record(tool, change.record.clone());
        self.metrics.changed();
        if let Some(v) = &change.switch {
            let switched = versions::switch(&self.cfg.supd.tools_dir, tool, v).map_err(|e| {
                Failure::Switch(format!(
                    "cannot switch {tool}'s current to {v}: {}",
                    errno_text(&e)
                ))
            })?;
            if let versions::Switched::NotSynced(e) = switched {
                // The rename is made: the switch is. Only its durability is in doubt,
                // and the record written before explains either link after a power cut.
                log::warn!(
                    "{tool}: current switched to {v}, but the fsync of its directory failed ({}): a power cut may bring back the link before; the record explains both",
                    errno_text(&e)
                );
            }
            failpoint::hit(&format!("{name}-after-switch"));
        }
        // Nothing waits; the probation's deadline and the window follow the record.
        let held = self.tools.carried_out(tool);
        // Told before its consequences: the restarts.
        self.changed(tool, op);
        if change.restart {
            self.restart_tool(tool, change.except.as_deref(), now);
            failpoint::hit(&format!("{name}-after-restart"));
        }
        // Starts that waited for this change go on (on what `current` names now).
        for name in held {
            if self.slots.get(&name).is_some_and(|s| {
                s.svc.want == crate::service::Want::Up
                    && s.svc.pid.is_none()
                    && s.svc.state == crate::service::State::Failed
            }) {
                self.apply(&name, crate::service::Event::Start, now);
            }
        }
        Ok(())
    }

    /// supd's own change: carried out, or, when its record (or the switch) fails, held
    /// pending with nothing more done and retried after a growing delay. Returns whether
    /// it was carried out.
    fn change_or_retry(&mut self, tool: &str, change: Change, op: Op, now: Mono) -> bool {
        match self.carry_out(tool, &change, &op, now) {
            Ok(()) => true,
            Err(f) => {
                let what = op.describe(&change.record);
                let delay = self.tools.wait(tool, change, op, f.to_string(), now);
                log::error!(
                    "{tool}: {what} waits: {f}; nothing switched; retrying in {}",
                    Human(delay)
                );
                self.emit_upgrade(tool);
                false
            }
        }
    }

    /// Logs and tells a change that was carried out.
    fn changed(&mut self, tool: &str, op: &Op) {
        let r = self.tools.record(tool).cloned().unwrap_or_default();
        match op {
            Op::Load => {
                if r.phase == Phase::Probation {
                    log::info!(
                        "{tool}: the probation of {} goes on",
                        r.proposed.as_deref().unwrap_or("?")
                    );
                }
                return;
            }
            Op::Upgrade => {}
            Op::Commit => log::info!("{tool}: {} committed", r.current.as_deref().unwrap_or("?")),
            Op::Rollback {
                version,
                to: Some(to),
                why,
                marked,
            } => {
                let mark = if *marked {
                    "marked bad"
                } else {
                    "not marked bad"
                };
                log::warn!("{tool}: {version} failed its probation ({why}); rolled back to {to}, {version} {mark}");
                self.emit_rollback(tool, version, to, why);
            }
            Op::Rollback {
                version,
                to: None,
                why,
                ..
            } => {
                log::error!("{tool}: {version} failed its probation ({why}) and is not rolled back (irreversible, or nothing to go back to)");
            }
            Op::OpRollback { from, to } => {
                log::warn!("{tool}: rolled back from {from} to {to} by an operator");
                self.emit_rollback(tool, from, to, "an operator's rollback");
            }
            Op::SelfUpgrade { version } => {
                log::warn!("{tool}: current was switched to {version} outside supd; an upgrade from {}, on probation", r.from.as_deref().unwrap_or("?"));
            }
            Op::SwitchBack { version, to } => {
                log::warn!("{tool}: current was switched to {version}, which is marked bad; switched back to {to}");
                return;
            }
            Op::Note => return,
        }
        self.emit_upgrade(tool);
    }

    /// Retries the changes whose delay is over.
    fn retry_pending(&mut self, now: Mono) {
        let due: Vec<String> = self.tools.retries_due(now);
        for tool in due {
            let Some(p) = self.tools.pending(&tool).cloned() else {
                continue;
            };
            if self.change_or_retry(&tool, p.change, p.op, now) {
                log::info!("{tool}: its record is written; the change that waited is done");
            }
        }
    }

    /// The services that run `tool`.
    pub fn tool_services(&self, tool: &str) -> Vec<String> {
        self.slots
            .iter()
            .filter(|(_, s)| s.cfg.tool.as_deref() == Some(tool))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// A tool the config names, or one that is installed.
    pub fn known_tool(&self, tool: &str) -> Result<(), Error> {
        versions::check_tool(tool).map_err(bad_request)?;
        let named = self
            .slots
            .values()
            .any(|s| s.cfg.tool.as_deref() == Some(tool))
            || self
                .cfg
                .leases
                .values()
                .any(|l| l.tool.as_deref() == Some(tool));
        if named || versions::tool_dir(&self.cfg.supd.tools_dir, tool).is_dir() {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::UnknownTool,
                format!("no tool named '{tool}' (no service runs it, nothing is installed)"),
            ))
        }
    }

    /// The longest `probation` of the tool's services.
    fn probation_of(&mut self, tool: &str) -> Duration {
        self.longest_of(tool, |c| c.probation)
            .unwrap_or(Duration::from_secs(300))
    }

    /// The longest of a duration of the tool's services (through the tool's index: a
    /// start of each versioned service asks it).
    pub(super) fn longest_of(
        &mut self,
        tool: &str,
        of: impl Fn(&crate::config::ServiceConfig) -> Duration,
    ) -> Option<Duration> {
        (self.members(tool).iter())
            .filter_map(|n| self.slots.get(n).map(|s| of(&s.cfg)))
            .max()
    }

    /// Why a service of the tool could not run `version`, if it could not: its program
    /// must be there and executable, and a service run as a `user` must be able to
    /// reach and run it, and enter the version directory when that is its cwd, as that
    /// user: the uid and groups its child took at its last start (or another service's
    /// of the same user and group), as the child reported them, for supd never reads
    /// the user database itself (a slow one must not stall it). A service whose user
    /// never started is not checked here: its start is then refused for permission,
    /// which rolls the upgrade back and marks no version bad.
    fn not_executable(&self, tool: &str, version: &str) -> Option<String> {
        use crate::access::{check, numeric_owner, Want};
        use crate::sys::acl::stat_chain;
        let dir = versions::tool_dir(&self.cfg.supd.tools_dir, tool).join(version);
        for s in self
            .slots
            .values()
            .filter(|s| s.cfg.tool.as_deref() == Some(tool))
        {
            let program = s
                .cfg
                .command
                .first()
                .filter(|a| !a.starts_with('/'))
                .map(|argv0| dir.join(argv0));
            if let Some(path) = &program {
                let why = match std::fs::metadata(path) {
                    Err(e) => Some(e.to_string()),
                    Ok(m) if !m.is_file() => Some("not a file".to_string()),
                    Ok(_) => nix::unistd::access(path, nix::unistd::AccessFlags::X_OK)
                        .err()
                        .map(|e| e.desc().to_string()),
                };
                if let Some(why) = why {
                    return Some(format!("service {}: {}: {why}", s.cfg.name, path.display()));
                }
            }
            let Some(user) = s.cfg.user.as_deref() else {
                continue;
            };
            let took = self.slots.values().find_map(|o| {
                o.ran_as
                    .as_deref()
                    .filter(|(group, who)| who.name == user && *group == s.cfg.group)
                    .map(|(_, who)| who)
            });
            let Some(who) = took else {
                log::info!(
                    "{}: user '{user}' is not checked against {tool} {version}: it has not started as that user yet",
                    s.cfg.name
                );
                continue;
            };
            let cwd = s.cfg.cwd.is_none().then_some(dir.as_path());
            let checked = program
                .as_deref()
                .map_or(Ok(()), |p| {
                    check(&stat_chain(p, numeric_owner)?, who, Want::Exec)
                })
                .and_then(|()| {
                    cwd.map_or(Ok(()), |d| {
                        check(&stat_chain(d, numeric_owner)?, who, Want::Enter)
                    })
                });
            if let Err(why) = checked {
                return Some(format!(
                    "service {}: {why}; nothing was switched",
                    s.cfg.name
                ));
            }
        }
        None
    }

    /// Restarts every service of the tool with a fresh history (a new version owes
    /// nothing to the old one's crashes); `except` is being started by the caller.
    fn restart_tool(&mut self, tool: &str, except: Option<&str>, now: Mono) {
        // Called from a start pass too (a start that found a self-switch): that pass
        // chose what to look at before these became pending.
        self.look_again_at_every_pending();
        for name in self.tool_services(tool) {
            if Some(name.as_str()) == except {
                continue;
            }
            let Some(slot) = self.slots.get_mut(&name) else {
                continue;
            };
            slot.svc.history.reset();
            let ev = if slot.svc.pid.is_some() {
                crate::service::Event::Restart
            } else {
                crate::service::Event::Start
            };
            if slot.svc.want == crate::service::Want::Up {
                self.apply(&name, ev, now);
            }
        }
    }

    /// `upgrade TOOL VERSION`: the six steps of the spec (the last, waiting, is the
    /// caller's).
    pub fn upgrade(&mut self, tool: &str, req: Request, now: Mono) -> Result<Value, Error> {
        self.known_tool(tool)?;
        versions::check_version(&req.version).map_err(bad_request)?;
        self.ensure_tool(tool, now);
        self.tools.refuse_while_pending(tool)?;
        let tools_dir = self.cfg.supd.tools_dir.clone();
        let installed = versions::is_installed(&tools_dir, tool, &req.version);
        let vdir = versions::tool_dir(&tools_dir, tool).join(&req.version);
        let manifest_irreversible = if installed {
            versions::irreversible(&vdir).map_err(failed)?
        } else {
            false
        };
        let facts = upgrade::Facts {
            installed,
            not_executable: if installed {
                self.not_executable(tool, &req.version)
            } else {
                None
            },
            manifest_irreversible,
            probation: self.probation_of(tool),
            clocks: Clocks::now(),
        };
        let old = self.tools[tool].record.clone();
        if let Some(cleared) = upgrade::clear_current_mark(tool, &old, &req) {
            let new = cleared.map_err(failed)?;
            self.operator_change(tool, Change::record(new), Op::Upgrade, now)?;
            log::info!("{tool}: the bad mark of {} is cleared", req.version);
            let mut data = self.versions_data(tool, now);
            data["cleared"] = Value::from(req.version);
            return Ok(data);
        }
        let new = upgrade::begin_upgrade(tool, &old, &req, &facts).map_err(failed)?;
        self.operator_change(tool, Change::switch(new, &req.version), Op::Upgrade, now)?;
        log::info!(
            "{tool}: upgraded from {} to {} (probation {})",
            old.current.as_deref().unwrap_or("nothing"),
            req.version,
            Human(facts.probation)
        );
        Ok(self.versions_data(tool, now))
    }

    /// An operator's change: carried out, or refused with nothing changed. When the
    /// record was written but `current` could not be switched, the old record is put
    /// back (or, failing that, put back by supd's retries).
    fn operator_change(
        &mut self,
        tool: &str,
        change: Change,
        op: Op,
        now: Mono,
    ) -> Result<(), Error> {
        let old = self.tools[tool].record.clone();
        match self.carry_out(tool, &change, &op, now) {
            Ok(()) => Ok(()),
            Err(Failure::Record(e)) => Err(failed(format!("{e}; nothing changed"))),
            Err(Failure::Switch(e)) => {
                self.change_or_retry(tool, Change::record(old), Op::Load, now);
                Err(failed(format!("{e}; nothing changed")))
            }
        }
    }

    /// `rollback TOOL [VERSION] [--force]`.
    pub fn rollback(
        &mut self,
        tool: &str,
        target: Option<&str>,
        force: bool,
        now: Mono,
    ) -> Result<Value, Error> {
        self.known_tool(tool)?;
        if let Some(t) = target {
            versions::check_version(t).map_err(bad_request)?;
        }
        self.ensure_tool(tool, now);
        self.tools.refuse_while_pending(tool)?;
        let tools_dir = self.cfg.supd.tools_dir.clone();
        let old = self.tools[tool].record.clone();
        let (new, to) = upgrade::begin_rollback(tool, &old, target, force, |v| {
            versions::is_installed(&tools_dir, tool, v)
        })
        .map_err(failed)?;
        let op = Op::OpRollback {
            from: old.current.clone().unwrap_or_default(),
            to: to.clone(),
        };
        self.operator_change(tool, Change::switch(new, &to), op, now)?;
        Ok(self.versions_data(tool, now))
    }

    /// `prune TOOL [--keep N]`: deletes versions older than current and versions marked
    /// bad, keeping the `keep` newest of them; never current, previous, or a version in
    /// probation or the one it would roll back to.
    pub fn prune(&mut self, tool: &str, keep: usize, now: Mono) -> Result<Value, Error> {
        self.known_tool(tool)?;
        self.ensure_tool(tool, now);
        let tools_dir = self.cfg.supd.tools_dir.clone();
        let r = &self.tools[tool].record;
        let link = versions::current(&tools_dir, tool);
        let protected: BTreeSet<String> = [
            r.current.clone(),
            r.previous.clone(),
            r.from.clone(),
            r.proposed.clone().filter(|_| r.phase == Phase::Probation),
            link.clone(),
        ]
        .into_iter()
        .flatten()
        .collect();
        let cur = link.as_deref().and_then(|v| semver::Version::parse(v).ok());
        let mut candidates: Vec<String> = versions::installed(&tools_dir, tool)
            .into_iter()
            .filter(|v| !protected.contains(v))
            .filter(|v| {
                r.bad.contains_key(v)
                    || cur
                        .as_ref()
                        .is_some_and(|c| semver::Version::parse(v).is_ok_and(|x| &x < c))
            })
            .collect();
        let kept: Vec<String> = candidates.split_off(candidates.len().saturating_sub(keep));
        if candidates.is_empty() {
            return Ok(json!({"tool": tool, "pruned": [], "kept": kept}));
        }
        let hidden = versions::hide_for_pruning(&tools_dir, tool, &candidates)
            .map_err(|e| failed(format!("cannot prune: {e}")))?;
        self.delete_in_background(tool, hidden);
        log::info!("{tool}: pruned {}", candidates.join(", "));
        Ok(json!({"tool": tool, "pruned": candidates, "kept": kept}))
    }

    /// The answer to `upgrade --wait`, once the probation is over.
    pub fn upgrade_settled(&self, tool: &str) -> Option<Result<Value, Error>> {
        self.tools.upgrade_settled(tool)
    }

    /// `versions TOOL` data.
    pub fn versions_data(&self, tool: &str, now: Mono) -> Value {
        let tools_dir = &self.cfg.supd.tools_dir;
        let state = self.tools.get(tool).cloned().unwrap_or_default();
        let r = &state.record;
        let list: Vec<Value> = versions::installed(tools_dir, tool)
            .into_iter()
            .map(|v| {
                let dir = versions::tool_dir(tools_dir, tool).join(&v);
                let irreversible = r.irreversible.contains(&v) || versions::irreversible(&dir).unwrap_or(false);
                let bad = r.bad.get(&v);
                json!({
                    "version": v,
                    "current": r.current.as_deref() == Some(v.as_str()),
                    "previous": r.previous.as_deref() == Some(v.as_str()),
                    "probation": r.phase == Phase::Probation && r.proposed.as_deref() == Some(v.as_str()),
                    "bad": bad.is_some(),
                    "bad_reason": bad.map(|b| b.reason.clone()),
                    "bad_time_ms": bad.map(|b| b.time_ms),
                    "irreversible": irreversible,
                    "attempts": r.attempts.get(&v).copied().unwrap_or(0),
                })
            })
            .collect();
        json!({
            "tool": tool,
            "current": r.current,
            "previous": r.previous,
            "phase": r.phase.as_str(),
            "proposed": r.proposed,
            "from": r.from,
            "deadline_ms": r.deadline_ms.filter(|_| r.phase == Phase::Probation),
            "deadline_in_ms": state.deadline.map(|d| d.since(now).as_millis() as u64),
            "probation_waits": upgrade::paused(r).then_some(
                "a service of the tool does not run, ready, on this version here (a leader-only one runs only while this node leads): its probation counts only while all do"
            ),
            "probation_left_ms": (r.phase == Phase::Probation)
                .then(|| upgrade::probation_left(r, &Clocks::now()).as_millis() as u64),
            "window_in_ms": state.window.map(|d| d.since(now).as_millis() as u64),
            "attempts": r.attempts,
            "reason": r.reason,
            "record_error": state.record_error,
            "pending": state.pending.as_ref().map(|p| p.op.describe(&p.change.record)),
            "write_error": state.pending.as_ref().map(|p| p.error.clone()),
            "retry_in_ms": state.pending.as_ref().map(|p| p.retry_at.since(now).as_millis() as u64),
            // The health of each run on the version in probation ("unknown" until then).
            "health": self.tool_services(tool).iter().filter_map(|n| {
                let h = self.health_of(n)?;
                let slot = &self.slots[n];
                let this_run = slot.health.run().is_some() && slot.version == r.proposed;
                let health = if this_run { h.health } else { crate::health::Health::Unknown };
                Some(json!({"service": n, "health": health.as_str()}))
            }).collect::<Vec<Value>>(),
            "versions": list,
        })
    }

    fn emit_upgrade(&mut self, tool: &str) {
        let Some(t) = self.tools.get(tool) else {
            return;
        };
        let r = &t.record;
        let e = json!({"event": "upgrade", "tool": tool, "phase": r.phase.as_str(), "version": r.proposed, "current": r.current,
                       "from": r.from, "reason": r.reason, "time": unix_ms(),
                       "pending": t.pending.as_ref().map(|p| p.op.describe(&p.change.record)),
                       "write_error": t.pending.as_ref().map(|p| p.error.clone())});
        self.control.broadcast(&crate::protocol::line(e));
    }

    fn emit_rollback(&mut self, tool: &str, from: &str, to: &str, why: &str) {
        let e = json!({"event": "rollback", "tool": tool, "from": from, "to": to, "reason": why, "time": unix_ms()});
        self.control.broadcast(&crate::protocol::line(e));
    }
}
