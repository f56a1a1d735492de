//! The supervisor's side of versioned tools: records loaded and put right at start,
//! upgrades with probation, commit, automatic and operator rollback, versions a tool
//! switched to by itself, and installs and prunes done by helper processes so that a
//! large copy or delete never blocks the loop.
//!
//! Order of every change: the decision (`upgrade`), the record written durably, the
//! `current` link switched, the services restarted. A crash between any two leaves a
//! record that `upgrade::reconcile` can put right at the next start.

use crate::failpoint;
use crate::protocol::{Error, ErrorKind};
use crate::supervisor::{unix_ms, Supervisor};
use crate::sys::{self, SpawnSpec};
use crate::time::Mono;
use crate::upgrade::{self, Fix, Outcome, Phase, Record, Request, StartCheck};
use crate::versions;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

/// What supd holds about one tool.
#[derive(Clone, Debug, Default)]
pub struct ToolState {
    pub record: Record,
    /// The probation's deadline, while it has not come.
    pub deadline: Option<Mono>,
    /// The deadline came: commit as soon as every service of the tool is ready.
    pub overdue: bool,
    /// The record could not be read at start (it was set aside).
    pub record_error: Option<String>,
}

/// A helper process supd waits for.
#[derive(Clone, Debug)]
pub enum Task {
    /// Copying a version in; the client is answered when it ends.
    Install {
        tool: String,
        version: String,
        client: u64,
        id: Value,
    },
    /// Deleting pruned versions.
    Prune { dirs: Vec<PathBuf> },
    /// `BINARY --check`, before re-executing into it.
    ReexecCheck {
        binary: PathBuf,
        client: u64,
        id: Value,
    },
}

fn failed(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Failed, msg)
}

fn bad_request(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::BadRequest, msg)
}

/// The monotonic instant of a wall-clock deadline (now, if it has passed).
fn mono_at(deadline_ms: u64, now: Mono) -> Mono {
    now.plus(Duration::from_millis(deadline_ms.saturating_sub(unix_ms())))
}

impl Supervisor {
    /// Loads and puts right the record of every tool a service names.
    pub fn load_tools(&mut self, now: Mono) {
        let tools: BTreeSet<String> = self
            .slots
            .values()
            .filter_map(|s| s.cfg.tool.clone())
            .collect();
        for t in tools {
            self.ensure_tool(&t, now);
        }
    }

    /// The tool's state, loaded on first use.
    pub fn ensure_tool(&mut self, tool: &str, now: Mono) {
        if !self.tools.contains_key(tool) {
            let state = self.load_tool(tool, now);
            self.tools.insert(tool.to_string(), state);
        }
    }

    fn load_tool(&self, tool: &str, now: Mono) -> ToolState {
        let (tools_dir, state_dir) = (&self.cfg.supd.tools_dir, &self.cfg.supd.state_dir);
        for p in versions::leftovers(tools_dir, tool) {
            log::info!(
                "{tool}: removing {} left by an interrupted operation",
                p.display()
            );
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
        let (record, record_error) = match versions::load_record(state_dir, tool) {
            Ok(r) => (r.unwrap_or_default(), None),
            Err(e) => {
                log::error!(
                    "{tool}: {e}; it is kept aside, and supd goes on from what `current` names"
                );
                versions::set_aside(state_dir, tool);
                (Record::default(), Some(e))
            }
        };
        let link = versions::current(tools_dir, tool);
        let (fixed, fix) = upgrade::reconcile(&record, link.as_deref(), unix_ms());
        if let Fix::SwitchTo(v) = &fix {
            log::warn!("{tool}: finishing an interrupted switch of current to {v}");
            if let Err(e) = versions::switch(tools_dir, tool, v) {
                log::error!("{tool}: cannot switch current to {v}: {e}");
            }
        }
        if fixed != record {
            if let Err(e) = versions::save_record(state_dir, tool, &fixed) {
                log::error!("{tool}: cannot write its record: {e}");
            }
        }
        let deadline =
            (fixed.phase == Phase::Probation).then(|| mono_at(fixed.deadline_ms.unwrap_or(0), now));
        if deadline.is_some() {
            log::info!(
                "{tool}: the probation of {} goes on",
                fixed.proposed.as_deref().unwrap_or("?")
            );
        }
        ToolState {
            record: fixed,
            deadline,
            overdue: false,
            record_error,
        }
    }

    /// Writes a tool's new record durably, then holds it.
    fn save_tool(&mut self, tool: &str, r: Record) -> std::io::Result<()> {
        let result = versions::save_record(&self.cfg.supd.state_dir, tool, &r);
        if result.is_ok() {
            if let Some(t) = self.tools.get_mut(tool) {
                t.record = r;
            }
        }
        result
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
    fn probation_of(&self, tool: &str) -> Duration {
        let services = self
            .slots
            .values()
            .filter(|s| s.cfg.tool.as_deref() == Some(tool));
        services
            .map(|s| s.cfg.probation)
            .max()
            .unwrap_or(Duration::from_secs(300))
    }

    /// Why a service of the tool could not run `version`, if it could not.
    fn not_executable(&self, tool: &str, version: &str) -> Option<String> {
        let dir = versions::tool_dir(&self.cfg.supd.tools_dir, tool).join(version);
        for s in self
            .slots
            .values()
            .filter(|s| s.cfg.tool.as_deref() == Some(tool))
        {
            let Some(argv0) = s.cfg.command.first().filter(|a| !a.starts_with('/')) else {
                continue;
            };
            let path = dir.join(argv0);
            let why = match std::fs::metadata(&path) {
                Err(e) => Some(e.to_string()),
                Ok(m) if !m.is_file() => Some("not a file".to_string()),
                Ok(_) => nix::unistd::access(&path, nix::unistd::AccessFlags::X_OK)
                    .err()
                    .map(|e| e.desc().to_string()),
            };
            if let Some(why) = why {
                return Some(format!("service {}: {}: {why}", s.cfg.name, path.display()));
            }
        }
        None
    }

    /// Restarts every service of the tool with a fresh history (a new version owes
    /// nothing to the old one's crashes); `except` is being started by the caller.
    fn restart_tool(&mut self, tool: &str, except: Option<&str>, now: Mono) {
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
            now_ms: unix_ms(),
        };
        let old = self.tools[tool].record.clone();
        let new = upgrade::begin_upgrade(tool, &old, &req, &facts).map_err(failed)?;
        failpoint::hit("upgrade-before-intent");
        self.save_tool(tool, new.clone())
            .map_err(|e| failed(format!("cannot record the upgrade: {e}; nothing changed")))?;
        failpoint::hit("upgrade-after-intent");
        if let Err(e) = versions::switch(&tools_dir, tool, &req.version) {
            let _ = self.save_tool(tool, old);
            return Err(failed(format!(
                "cannot switch {tool}'s current to {}: {e}; nothing changed",
                req.version
            )));
        }
        failpoint::hit("upgrade-after-switch");
        if let Some(t) = self.tools.get_mut(tool) {
            t.deadline = Some(mono_at(new.deadline_ms.unwrap_or(0), now));
            t.overdue = false;
        }
        log::info!(
            "{tool}: upgrading from {} to {} (probation {})",
            old.current.as_deref().unwrap_or("nothing"),
            req.version,
            crate::time::Human(facts.probation)
        );
        self.emit_upgrade(tool);
        self.restart_tool(tool, None, now);
        failpoint::hit("upgrade-after-restart");
        Ok(self.versions_data(tool, now))
    }

    /// A service of a tool crash-looped or was not ready in time. In probation, that is
    /// the end of it: roll back, or stay when it may not be rolled back. Returns whether
    /// it was a probation's end (the service's own crash-loop outcome is then moot).
    pub fn probation_failed(&mut self, tool: &str, why: &str, now: Mono) -> bool {
        let Some(state) = self.tools.get(tool) else {
            return false;
        };
        if state.record.phase != Phase::Probation {
            return false;
        }
        let (new, outcome) = upgrade::probation_failed(&state.record, why, unix_ms());
        failpoint::hit("rollback-before-record");
        if let Err(e) = self.save_tool(tool, new.clone()) {
            log::error!(
                "{tool}: cannot record the end of its probation: {e}; going on all the same"
            );
            if let Some(t) = self.tools.get_mut(tool) {
                t.record = new.clone();
            }
        }
        failpoint::hit("rollback-after-record");
        if let Some(t) = self.tools.get_mut(tool) {
            t.deadline = None;
            t.overdue = false;
        }
        let version = new.proposed.clone().unwrap_or_default();
        match outcome {
            Outcome::RollBack(to) => {
                log::warn!("{tool}: {version} failed its probation ({why}); rolling back to {to} and marking {version} bad");
                if let Err(e) = versions::switch(&self.cfg.supd.tools_dir, tool, &to) {
                    log::error!("{tool}: cannot switch current back to {to}: {e}");
                }
                failpoint::hit("rollback-after-switch");
                self.emit_rollback(tool, &version, &to, why);
                self.emit_upgrade(tool);
                self.restart_tool(tool, None, now);
                failpoint::hit("rollback-after-restart");
            }
            Outcome::Stay => {
                log::error!("{tool}: {version} failed its probation ({why}) and is not rolled back (irreversible, or nothing to go back to)");
                self.emit_upgrade(tool);
            }
        }
        true
    }

    /// Commits the probations whose deadline came, once every service is ready.
    pub fn check_probations(&mut self, now: Mono) {
        let due: Vec<String> = self
            .tools
            .iter_mut()
            .filter_map(|(n, t)| {
                if t.deadline.is_some_and(|d| d <= now) {
                    t.deadline = None;
                    t.overdue = true;
                }
                t.overdue.then(|| n.clone())
            })
            .collect();
        for tool in due {
            let ready = self.tool_services(&tool).iter().all(|n| {
                let s = &self.slots[n];
                s.svc.want == crate::service::Want::Down || s.svc.is_ready(&s.cfg)
            });
            if !ready {
                continue;
            }
            let new = upgrade::probation_passed(&self.tools[&tool].record);
            failpoint::hit("commit-before-record");
            if let Err(e) = self.save_tool(&tool, new) {
                log::error!("{tool}: cannot record the commit: {e}; the probation goes on");
                continue;
            }
            failpoint::hit("commit-after-record");
            if let Some(t) = self.tools.get_mut(&tool) {
                t.overdue = false;
            }
            log::info!(
                "{tool}: {} committed",
                self.tools[&tool].record.current.as_deref().unwrap_or("?")
            );
            self.emit_upgrade(&tool);
        }
    }

    /// The earliest probation deadline.
    pub fn next_probation_deadline(&self) -> Option<Mono> {
        self.tools.values().filter_map(|t| t.deadline).min()
    }

    /// A service of `tool` is about to start on `version`: a tool that switched its own
    /// `current` gets an upgrade with probation; one that switched to a bad version is
    /// switched back. Returns whether the start may go on as planned.
    pub fn check_start(&mut self, tool: &str, name: &str, version: &str, now: Mono) -> bool {
        self.ensure_tool(tool, now);
        let probation = self.probation_of(tool);
        let (new, check) =
            upgrade::on_start(&self.tools[tool].record, version, probation, unix_ms());
        if new != self.tools[tool].record {
            if let Err(e) = self.save_tool(tool, new.clone()) {
                log::error!("{tool}: cannot write its record: {e}");
                if let Some(t) = self.tools.get_mut(tool) {
                    t.record = new.clone();
                }
            }
        }
        match check {
            StartCheck::Expected => true,
            StartCheck::SelfUpgrade => {
                log::warn!("{tool}: current was switched to {version} outside supd; an upgrade from {}, on probation", new.from.as_deref().unwrap_or("?"));
                if let Some(t) = self.tools.get_mut(tool) {
                    t.deadline = Some(mono_at(new.deadline_ms.unwrap_or(0), now));
                    t.overdue = false;
                }
                self.emit_upgrade(tool);
                self.restart_tool(tool, Some(name), now);
                true
            }
            StartCheck::SwitchBack(to) => {
                log::warn!("{tool}: current was switched to {version}, which is marked bad; switching back to {to}");
                if let Err(e) = versions::switch(&self.cfg.supd.tools_dir, tool, &to) {
                    log::error!("{tool}: cannot switch current back to {to}: {e}");
                    return true;
                }
                false
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
        let tools_dir = self.cfg.supd.tools_dir.clone();
        let old = self.tools[tool].record.clone();
        let (new, to) = upgrade::begin_rollback(tool, &old, target, force, |v| {
            versions::is_installed(&tools_dir, tool, v)
        })
        .map_err(failed)?;
        failpoint::hit("oprollback-before-record");
        self.save_tool(tool, new)
            .map_err(|e| failed(format!("cannot record the rollback: {e}; nothing changed")))?;
        failpoint::hit("oprollback-after-record");
        if let Err(e) = versions::switch(&tools_dir, tool, &to) {
            let _ = self.save_tool(tool, old);
            return Err(failed(format!(
                "cannot switch {tool}'s current to {to}: {e}; nothing changed"
            )));
        }
        failpoint::hit("oprollback-after-switch");
        if let Some(t) = self.tools.get_mut(tool) {
            t.deadline = None;
            t.overdue = false;
        }
        let from = old.current.unwrap_or_default();
        log::warn!("{tool}: rolled back from {from} to {to} by an operator");
        self.emit_rollback(tool, &from, &to, "an operator's rollback");
        self.emit_upgrade(tool);
        self.restart_tool(tool, None, now);
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
        let mut args = vec!["-rf".to_string(), "--".to_string()];
        args.extend(hidden.iter().map(|p| p.to_string_lossy().into_owned()));
        match self.spawn_helper("/bin/rm", args) {
            Ok(pid) => {
                self.tasks.insert(pid, Task::Prune { dirs: hidden });
            }
            Err(e) => log::warn!("{tool}: cannot start rm for the pruned versions: {e}; they stay hidden until the next start"),
        }
        log::info!("{tool}: pruned {}", candidates.join(", "));
        Ok(json!({"tool": tool, "pruned": candidates, "kept": kept}))
    }

    /// `install TOOL VERSION DIR`: checks, then a helper copies; the client is answered
    /// when it ends. Returns the helper's pid.
    pub fn install(
        &mut self,
        tool: &str,
        version: &str,
        dir: &str,
        client: u64,
        id: &Value,
    ) -> Result<(), Error> {
        let src = PathBuf::from(dir);
        if !src.is_absolute() {
            return Err(bad_request(format!("'{dir}' is not an absolute path")));
        }
        let tmp = versions::prepare_install(&self.cfg.supd.tools_dir, tool, version, &src)
            .map_err(failed)?;
        let argv = versions::install_command(&src, &tmp);
        let pid = self
            .spawn_helper(&argv[0], argv[1..].to_vec())
            .map_err(|e| failed(format!("cannot start the copy: {e}")))?;
        self.tasks.insert(
            pid,
            Task::Install {
                tool: tool.into(),
                version: version.into(),
                client,
                id: id.clone(),
            },
        );
        if let Some(c) = self.server.clients.get_mut(&client) {
            c.parked = true;
        }
        Ok(())
    }

    /// `reexec [--binary PATH]`: checks the new program on the current config first.
    pub fn begin_reexec(
        &mut self,
        binary: Option<PathBuf>,
        client: u64,
        id: &Value,
    ) -> Result<(), Error> {
        let binary = binary.unwrap_or_else(|| self.program.clone());
        let args = vec![
            "--check".to_string(),
            "-c".into(),
            self.config_path.to_string_lossy().into_owned(),
            "--handoff-format".into(),
            crate::handoff::FORMAT.to_string(),
        ];
        let pid = self
            .spawn_helper(&binary.to_string_lossy(), args)
            .map_err(|e| {
                failed(format!(
                    "cannot run {}: {e}; supd keeps running",
                    binary.display()
                ))
            })?;
        self.tasks.insert(
            pid,
            Task::ReexecCheck {
                binary,
                client,
                id: id.clone(),
            },
        );
        if let Some(c) = self.server.clients.get_mut(&client) {
            c.parked = true;
        }
        Ok(())
    }

    fn spawn_helper(&self, program: &str, args: Vec<String>) -> Result<i32, String> {
        sys::spawn(SpawnSpec {
            program: program.into(),
            args,
            env: vec![("PATH".into(), crate::launch::DEFAULT_PATH.into())],
            cwd: "/".into(),
            stdout: sys::Io::Null,
            stderr: sys::Io::Inherit,
            creds: None,
            ready_fd: None,
        })
    }

    /// A helper process ended.
    pub fn task_done(&mut self, task: Task, exit: crate::service::Exit, now: Mono) {
        let ok = exit == crate::service::Exit::Code(0);
        match task {
            Task::Install {
                tool,
                version,
                client,
                id,
            } => {
                let tools_dir = self.cfg.supd.tools_dir.clone();
                let answer = if ok {
                    versions::finish_install(&tools_dir, &tool, &version)
                        .map(|()| json!({"tool": tool, "version": version, "path": versions::tool_dir(&tools_dir, &tool).join(&version)}))
                        .map_err(|e| failed(format!("cannot move the copy into place: {e}")))
                } else {
                    Err(failed(format!(
                        "copying into {tool} {version} failed ({exit}); nothing was installed"
                    )))
                };
                if answer.is_err() {
                    let _ =
                        std::fs::remove_dir_all(versions::install_tmp(&tools_dir, &tool, &version));
                } else {
                    log::info!("{tool}: installed {version}");
                }
                self.unpark(client, &id, answer, now);
            }
            Task::Prune { dirs } => {
                if !ok {
                    log::warn!("deleting pruned versions failed ({exit}): {dirs:?}; they stay hidden until the next start");
                }
            }
            Task::ReexecCheck { binary, client, id } => {
                let why = if !ok {
                    format!(
                        "{} --check failed ({exit}) on the current config; supd keeps running",
                        binary.display()
                    )
                } else if self.shutting_down() {
                    "supd is shutting down".into()
                } else {
                    // Tell the client first: its connection closes with the exec.
                    self.unpark(
                        client,
                        &id,
                        Ok(json!({"reexec": binary, "pid": std::process::id()})),
                        now,
                    );
                    let why = self.exec_handoff(&binary);
                    log::error!("reexec: {why}; supd keeps running");
                    return;
                };
                log::error!("reexec: {why}");
                self.unpark(client, &id, Err(failed(why)), now);
            }
        }
    }

    /// The answer to `upgrade --wait`, once the probation is over.
    pub fn upgrade_settled(&self, tool: &str) -> Option<Result<Value, Error>> {
        let r = &self.tools.get(tool)?.record;
        let v = r.proposed.as_deref().unwrap_or("?");
        let why = r.reason.as_deref().unwrap_or("no reason recorded");
        match r.phase {
            Phase::Probation => None,
            Phase::Committed | Phase::Idle => Some(Ok(
                json!({"tool": tool, "phase": r.phase.as_str(), "current": r.current}),
            )),
            Phase::RolledBack => Some(Err(failed(format!(
                "{tool} {v} was rolled back to {}: {why}",
                r.current.as_deref().unwrap_or("?")
            )))),
            Phase::Failed => Some(Err(failed(format!(
                "{tool} {v} failed its probation and stays (not revertible): {why}"
            )))),
        }
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
            "attempts": r.attempts,
            "reason": r.reason,
            "record_error": state.record_error,
            "versions": list,
        })
    }

    fn emit_upgrade(&mut self, tool: &str) {
        let Some(t) = self.tools.get(tool) else {
            return;
        };
        let r = &t.record;
        let e = json!({"event": "upgrade", "tool": tool, "phase": r.phase.as_str(), "version": r.proposed, "current": r.current,
                       "from": r.from, "reason": r.reason, "time": unix_ms()});
        self.server.broadcast(&crate::protocol::line(e));
    }

    fn emit_rollback(&mut self, tool: &str, from: &str, to: &str, why: &str) {
        let e = json!({"event": "rollback", "tool": tool, "from": from, "to": to, "reason": why, "time": unix_ms()});
        self.server.broadcast(&crate::protocol::line(e));
    }
}
