//! What each control command does to the supervisor; a command answered later parks a
//! waiter, settled in `waiters.rs` (`stop` and `restart` answer once the service has
//! done it).

use super::{signal_group, Supervisor};
use crate::config;
use crate::control::Access;
use crate::control::WaitFor;
use crate::protocol::{self, Command, Error, ErrorKind, Request, SignalArg};
use crate::service::Event;
use crate::time::Mono;
use serde::Serialize;
use serde_json::{json, Value};
use std::path::PathBuf;

/// What a command produced.
enum Outcome {
    Answer(Value),
    /// An answer already encoded, newline included (`status`: written straight from
    /// typed values).
    Encoded(Vec<u8>),
    /// Answer later (a waiter was parked).
    Parked,
}

/// The answer of `status`, encoded straight from it: with 10,000 services a
/// `serde_json::Value` tree of it cost most of the answer's time. Its fields are in the
/// order of their names, as that tree's keys came out (sorted).
#[derive(Serialize)]
struct StatusAnswer<'a> {
    broken_files: &'a [crate::config::lastgood::BrokenFile],
    cleanup: Option<Value>,
    config_errors: &'a [String],
    down_error: Option<&'a str>,
    /// Runs of services of a broken file that a previous supd left, kept.
    left_running: Vec<Value>,
    services: Statuses<'a>,
    supd: Value,
    tools: serde_json::Map<String, Value>,
}

/// The statuses of `names`, each made as it is written.
struct Statuses<'a> {
    sup: &'a Supervisor,
    names: &'a [String],
    now: Mono,
}

impl Serialize for Statuses<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(
            self.names
                .iter()
                .filter_map(|n| self.sup.slots.get(n))
                .map(|slot| self.sup.status_of(slot, self.now)),
        )
    }
}

impl Supervisor {
    /// Handles one decoded request (or the error of one that could not be decoded).
    pub fn handle(&mut self, client: u64, req: Result<Request, (Value, Error)>, now: Mono) {
        let (id, command) = match req {
            Ok(r) => (r.id, r.command),
            Err((id, e)) => return self.control.send(client, &protocol::encode_err(&id, &e)),
        };
        if let Err(e) = self.authorize(client, &command) {
            return self.control.send(client, &protocol::encode_err(&id, &e));
        }
        match self.run(client, &id, command, now) {
            Ok(Outcome::Answer(data)) => self.control.send(client, &protocol::encode_ok(&id, data)),
            Ok(Outcome::Encoded(line)) => self.control.send(client, &line),
            Ok(Outcome::Parked) => {}
            Err(e) => self.control.send(client, &protocol::encode_err(&id, &e)),
        }
    }

    fn authorize(&mut self, client: u64, command: &Command) -> Result<(), Error> {
        let Some(c) = self.control.client(client) else {
            return Ok(());
        };
        // Which group grants what, said in every refusal when there is one.
        let operators = self.control.control_group().map(|g| {
            format!(
                "members of control group '{}' may start, stop, restart, reload and signal services",
                g.name
            )
        });
        let what = match command {
            Command::Reload { service: None } => "'reload' of supd's config".to_string(),
            _ => format!("'{}'", command.name()),
        };
        let refused = match c.access() {
            Access::Full => return Ok(()),
            Access::ReadOnly if command.read_only() => return Ok(()),
            Access::Operate if command.operates() => return Ok(()),
            Access::Operate => format!(
                "{what} needs root or supd's own user; {}",
                operators.unwrap_or_default()
            ),
            Access::ReadOnly => format!("uid {} may only read (hello, status, log, watch, metrics); '{}' needs root{}", c.uid(), command.name(), operators.map(|o| format!("; {o}")).unwrap_or_default()),
            Access::None => format!("uid {} is not allowed to use this socket (not root, not supd's user, not in socket_group{})", c.uid(), if operators.is_some() { " nor control_group" } else { "" }),
        };
        let (pid, uid) = (c.pid(), c.uid());
        if let Some(n) = self.control.note_refusal(Mono::now()) {
            log::warn!(
                "refused '{}' from pid {pid} uid {uid}: {refused}{}",
                command.name(),
                crate::control::more(n)
            );
        }
        Err(Error::new(ErrorKind::PermissionDenied, refused))
    }

    fn run(
        &mut self,
        client: u64,
        id: &Value,
        command: Command,
        now: Mono,
    ) -> Result<Outcome, Error> {
        match command {
            Command::Hello {} if crate::failpoint::panic_now(&self.cfg.supd.state_dir) => {
                unreachable!("failpoint panic")
            }
            Command::Hello {} => Ok(Outcome::Answer(json!({
                "protocol": protocol::PROTOCOL_VERSION,
                "version": crate::VERSION,
                "pid": std::process::id(),
                "image_uptime_ms": now.since(self.image_started).as_millis() as u64,
            }))),
            Command::Status { service, services } => {
                let names = if service.is_none() && services.is_empty() {
                    self.in_order(self.slots.keys().cloned().collect())
                } else {
                    self.named(service, services)?.0
                };
                let answer = StatusAnswer {
                    broken_files: &self.broken_files,
                    left_running: (self.kept.iter().filter(|k| k.alive()))
                        .map(|k| json!({"service": k.service, "pid": k.pid}))
                        .collect(),
                    cleanup: self.cleanup.as_ref().map(|c| {
                        json!({
                            "services": c.services,
                            "processes": c.left(),
                        })
                    }),
                    config_errors: &self.config_errors,
                    down_error: self.down_retry.as_ref().map(|r| r.2.as_str()),
                    services: Statuses {
                        sup: self,
                        names: &names,
                        now,
                    },
                    supd: json!({"version": crate::VERSION, "pid": std::process::id(), "uptime_ms": now.since(self.started).as_millis() as u64}),
                    tools: self.tools.iter().map(|(n, t)| (n.clone(), json!({
                        "current": t.record.current,
                        "phase": t.record.phase.as_str(),
                        "proposed": t.record.proposed,
                        "deadline_in_ms": t.deadline.map(|d| d.since(now).as_millis() as u64),
                        "pending": t.pending.as_ref().map(|p| p.op.describe(&p.change.record)),
                        "write_error": t.pending.as_ref().map(|p| p.error.clone()),
                    }))).collect(),
                };
                Ok(Outcome::Encoded(protocol::encode_ok_with(id, &answer)))
            }
            Command::Start { service, services } => {
                let (names, many) = self.named(service, services)?;
                self.refuse_during_shutdown()?;
                let _ = self.control.drop_held(&names);
                // Each starts once the services it comes `after` are ready (`settle`).
                for n in &names {
                    let _ = self.set_down(n, false, now);
                    // Started by an operator: its restarts are counted afresh.
                    if let Some(s) = self.slots.get_mut(n).filter(|s| s.svc.pid.is_none()) {
                        s.svc.count_afresh();
                    }
                    self.apply(n, Event::Start, now);
                }
                let by = self.start_bound(&names, now);
                self.park(client, id, WaitFor::Started { names, many, by })
            }
            Command::Stop { service, services } => {
                let (names, many) = self.named(service, services)?;
                let running: Vec<String> = names
                    .iter()
                    .filter(|n| self.slots.get(*n).is_some_and(|s| !s.is_down()))
                    .cloned()
                    .collect();
                let mut unwritten = Vec::new();
                for n in &names {
                    if let Err(e) = self.set_down(n, true, now) {
                        unwritten.push((n.clone(), e));
                    }
                }
                self.dependents_first(&names, Event::Stop, now);
                // Stopped all the same (the operator wants it down now), but told: the
                // mark that keeps it down across a restart of supd is not on disk yet.
                if let Some((_, e)) = unwritten.first() {
                    let who: Vec<&str> = unwritten.iter().map(|(n, _)| n.as_str()).collect();
                    let who = who.join(", ");
                    return Err(Error::new(
                        ErrorKind::Failed,
                        format!("{who}: stopping all the same, but the down mark is not written ({e}): it would start again if supd restarted; supd retries writing it"),
                    ));
                }
                self.park(
                    client,
                    id,
                    WaitFor::Down {
                        names,
                        many,
                        running,
                    },
                )
            }
            Command::Restart { service, services } => {
                let (names, many) = self.named(service, services)?;
                self.refuse_during_shutdown()?;
                for n in &names {
                    let _ = self.set_down(n, false, now);
                    if let Some(s) = self.slots.get_mut(n) {
                        s.svc.count_afresh();
                    }
                }
                self.dependents_first(&names, Event::Restart, now);
                let by = self.start_bound(&names, now);
                self.park(client, id, WaitFor::Started { names, many, by })
            }
            Command::Signal { service, signal } => {
                self.known(&service)?;
                let sig = match signal {
                    SignalArg::Name(n) => config::parse_signal(&n),
                    SignalArg::Number(n) => config::parse_signal(&n.to_string()),
                }
                .map_err(|e| Error::new(ErrorKind::BadRequest, e))?;
                self.signal_run(&service, sig, "signal")
                    .map(Outcome::Answer)
            }
            Command::Show { service } => {
                self.known(&service)?;
                let slot = &self.slots[&service];
                let origins = self.cfg.origins.get(&service).cloned().unwrap_or_default();
                Ok(Outcome::Answer(json!({
                    "service": service,
                    "settings": config::show::settings(&slot.cfg, &origins),
                    "files": origins.files,
                })))
            }
            Command::Log {
                service,
                services,
                lines,
                since_ms,
                grep,
                follow,
                stderr,
            } => {
                let old_form = service.is_some();
                let asked: Vec<String> = service
                    .into_iter()
                    .chain(services.into_iter().flatten())
                    .collect();
                let named = !asked.is_empty();
                let names = if named {
                    self.named(None, asked)?.0
                } else {
                    self.slots.keys().cloned().collect()
                };
                let q = super::log_lines::LogQuery {
                    names,
                    named,
                    old_form,
                    lines: lines.unwrap_or(10),
                    since_ms,
                    grep,
                    follow,
                    stderr,
                };
                self.log_answer(client, q).map(Outcome::Answer)
            }
            Command::Metrics {} => {
                let answer = std::collections::BTreeMap::from([("text", self.metrics_text(now))]);
                Ok(Outcome::Encoded(protocol::encode_ok_with(id, &answer)))
            }
            Command::Watch {} => {
                self.control.watch(client);
                Ok(Outcome::Answer(json!({"watching": true})))
            }
            Command::Reload {
                service: Some(service),
            } => {
                self.known(&service)?;
                let sig = self.slots[&service].cfg.reload_signal;
                self.signal_run(&service, sig, "reload")
                    .map(Outcome::Answer)
            }
            Command::Reload { service: None } => {
                self.refuse_during_shutdown()?;
                // Answered when the config is read (`reload.rs`), outside the loop.
                self.control.hold_client(client);
                self.request_reload(Some((client, id.clone())), now);
                Ok(Outcome::Parked)
            }
            Command::Shutdown {} => {
                self.begin_shutdown(0, now);
                Ok(Outcome::Answer(json!({"shutting_down": true})))
            }
            Command::Install {
                tool,
                version,
                dir,
                allow_special,
            } => {
                self.install(&tool, &version, &dir, allow_special, client, id)?;
                Ok(Outcome::Parked)
            }
            Command::Versions { tool } => {
                self.known_tool(&tool)?;
                self.ensure_tool(&tool, now);
                Ok(Outcome::Answer(self.versions_data(&tool, now)))
            }
            Command::Upgrade {
                tool,
                version,
                force,
                irreversible,
                wait,
            } => {
                self.refuse_during_shutdown()?;
                self.refuse_during_probation(&tool)?;
                let data = self.upgrade(
                    &tool,
                    crate::upgrade::Request {
                        version,
                        force,
                        irreversible,
                    },
                    now,
                )?;
                if wait {
                    self.park(client, id, WaitFor::Upgrade(tool))
                } else {
                    Ok(Outcome::Answer(data))
                }
            }
            Command::Rollback {
                tool,
                version,
                force,
            } => {
                self.refuse_during_shutdown()?;
                self.rollback(&tool, version.as_deref(), force, now)
                    .map(Outcome::Answer)
            }
            Command::Prune { tool, keep } => self
                .prune(&tool, keep.unwrap_or(0), now)
                .map(Outcome::Answer),
            Command::LeaseCandidacy { lease } => self.candidacy(&lease, now).map(Outcome::Answer),
            Command::LeaseGrant {
                lease,
                holder,
                term,
                valid_for,
                until_boot_ms,
                kill_grace,
                stopping,
            } => {
                let ends = crate::leases::GrantEnds {
                    valid_for: &valid_for,
                    until_boot_ms,
                    kill_grace: kill_grace.as_deref(),
                };
                if stopping {
                    self.grant_stopping(&lease, term, ends)
                } else {
                    self.grant(&lease, &holder, term, ends, now)
                }
                .map(Outcome::Answer)
            }
            Command::Poweroff {} => self.end_system(crate::pid1::Final::Poweroff, now),
            Command::Reboot {} => self.end_system(crate::pid1::Final::Reboot, now),
            Command::Halt {} => self.end_system(crate::pid1::Final::Halt, now),
            Command::Reexec { binary } => {
                self.refuse_during_shutdown()?;
                if let Some(busy) = self.reexec_refusal() {
                    return Err(busy);
                }
                self.begin_reexec(binary.map(PathBuf::from), client, id, now)?;
                Ok(Outcome::Parked)
            }
            Command::LeaseRelease { lease } => {
                let by = self.release(&lease, now)?;
                self.park(client, id, WaitFor::LeaseDown { lease, by })
            }
        }
    }

    /// `poweroff`, `reboot`, `halt`: system mode only.
    fn end_system(&mut self, action: crate::pid1::Final, now: Mono) -> Result<Outcome, Error> {
        if !self.system {
            return Err(Error::new(
                ErrorKind::Failed,
                format!(
                    "{} is for supd in system mode (supd --system); use shutdown",
                    action.as_str()
                ),
            ));
        }
        self.begin_final(action, now);
        Ok(Outcome::Answer(json!({"action": action.as_str()})))
    }

    /// `signal` and `reload NAME`: `sig` to the process group of the service's run (its
    /// main process alone with `kill_mode = "main"`), while
    /// its leader is there (not reaped: its zombie still holds the group's id). Once it
    /// was reaped and the rest of the run drains, to the members of the run's cgroup
    /// alone (`Instance::signal_left`), the answer naming them (`"leader_gone": true`,
    /// `"sent_to"`); without a cgroup nothing is sent and the answer says why: the
    /// group's id may name another group by now.
    fn signal_run(
        &self,
        service: &str,
        sig: nix::sys::signal::Signal,
        what: &str,
    ) -> Result<Value, Error> {
        let slot = &self.slots[service];
        let name = config::signal_name(sig);
        let pid = slot.svc.pid.ok_or_else(|| {
            Error::new(
                ErrorKind::Failed,
                format!("service '{service}' has no process to {what}"),
            )
        })?;
        match slot.instance.as_ref().filter(|i| i.leader_gone()) {
            None => {
                // Its process group, or with `kill_mode = "main"` its main process alone.
                match slot.instance.as_ref() {
                    Some(run) => run.signal_leader_or_group(sig),
                    None => signal_group(pid, sig),
                }
                Ok(json!({"service": service, "pid": pid, "signal": name}))
            }
            Some(run) => match run.signal_left(sig) {
                Some(sent) => Ok(json!({"service": service, "pid": pid, "signal": name,
                                        "leader_gone": true, "sent_to": sent})),
                None => Err(Error::new(
                    ErrorKind::Failed,
                    format!(
                        "service '{service}': its main process {pid} has exited and the rest of its run has no cgroup to reach it by (the group id {pid} may be another's by now): {name} not sent"
                    ),
                )),
            },
        }
    }

    /// `name` is one service (`signal`, `log`, `reload NAME`).
    fn known(&self, name: &str) -> Result<(), Error> {
        if self.slots.contains_key(name) {
            return Ok(());
        }
        match self.instances_of(name).as_slice() {
            [] => Err(Error::new(
                ErrorKind::UnknownService,
                format!("no service named '{name}'"),
            )),
            [first, ..] => Err(Error::new(
                ErrorKind::BadRequest,
                format!("'{name}' runs as instances: name one of them, such as {first}"),
            )),
        }
    }

    /// The live instances of table `table` (`instances = N`), in index order; none when
    /// it is no such table.
    fn instances_of(&self, table: &str) -> Vec<String> {
        let mut found: Vec<(u32, &String)> = self
            .slots
            .iter()
            .filter(|(_, s)| !s.removed)
            .filter_map(|(n, s)| match &s.cfg.instance {
                Some(i) if i.table == table => Some((i.index, n)),
                _ => None,
            })
            .collect();
        found.sort();
        found.into_iter().map(|(_, n)| n.clone()).collect()
    }

    /// The services a request names (`service`, or `services`, where `all` names every
    /// service unless one is called so, and an instanced table's name all its
    /// instances), each known, each once; and whether the answer is a list (`services`
    /// was used).
    fn named(
        &self,
        service: Option<String>,
        services: Vec<String>,
    ) -> Result<(Vec<String>, bool), Error> {
        let many = service.is_none();
        let asked: Vec<String> = service.into_iter().chain(services).collect();
        if asked.is_empty() {
            return Err(Error::new(
                ErrorKind::BadRequest,
                "name a service: \"service\": NAME or \"services\": [NAME, ...] (\"all\" for every service)",
            ));
        }
        let mut names: Vec<String> = Vec::new();
        for n in asked {
            let these = if n == "all" && !self.slots.contains_key("all") {
                self.slots.keys().cloned().collect()
            } else if self.slots.contains_key(&n) {
                vec![n]
            } else {
                let instances = self.instances_of(&n);
                if instances.is_empty() {
                    self.known(&n)?;
                }
                instances
            };
            for n in these {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
        Ok((names, many))
    }

    /// Service names as people count: an instanced table's instances by index
    /// (`web@2` before `web@10`), beside the other names in their order.
    fn in_order(&self, mut names: Vec<String>) -> Vec<String> {
        names.sort_by_cached_key(|n| {
            match self.slots.get(n).and_then(|s| s.cfg.instance.as_ref()) {
                Some(i) => (i.table.clone(), Some(i.index)),
                None => (n.clone(), None),
            }
        });
        names
    }

    /// The answer of `start`, `stop` and `restart`: the one service's status, or a list.
    pub(super) fn statuses(&self, names: &[String], many: bool, now: Mono) -> Value {
        match names {
            [one] if !many => self.one_status(one, now),
            _ => {
                json!({"services": names.iter().map(|n| self.one_status(n, now)).collect::<Vec<_>>()})
            }
        }
    }

    /// Applies `ev` (a stop or a restart) to each of `names` in reverse `after` order: a
    /// service waits (held by the control part) until those of `names` that come after it
    /// are down. `after` orders; it links nothing: a service not named is left alone.
    fn dependents_first(&mut self, names: &[String], ev: Event, now: Mono) {
        let released = self.control.drop_held(names);
        // What the dropped ones held down (`Supervisor::startable`) is looked at again.
        for d in &released {
            let _ = self.slots.get_mut(d);
        }
        for n in names {
            let until_down: Vec<String> = names
                .iter()
                .filter(|d| self.slots.get(*d).is_some_and(|s| s.cfg.after.contains(n)))
                .cloned()
                .collect();
            if until_down.is_empty() {
                self.apply(n, ev.clone(), now);
            } else {
                self.control.hold(n, ev.clone(), until_down);
            }
        }
    }

    /// An upgrade while another is in probation is refused for now (kind `busy`): it
    /// may be asked again once that one committed or rolled back.
    fn refuse_during_probation(&self, tool: &str) -> Result<(), Error> {
        let record = self.tools.get(tool).map(|t| &t.record);
        match record.filter(|r| r.phase == crate::upgrade::Phase::Probation) {
            Some(r) => Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "the upgrade of {tool} to {} is in probation; wait for it to commit or roll back, then try again",
                    r.proposed.as_deref().unwrap_or("?")
                ),
            )),
            None => Ok(()),
        }
    }

    fn refuse_during_shutdown(&self) -> Result<(), Error> {
        if self.shutting_down() {
            Err(Error::new(ErrorKind::Failed, "supd is shutting down"))
        } else {
            Ok(())
        }
    }

    pub fn one_status(&self, name: &str, now: Mono) -> Value {
        self.slots
            .get(name)
            .map(|s| json!(self.status_of(s, now)))
            .unwrap_or(Value::Null)
    }

    fn park(&mut self, client: u64, id: &Value, what: WaitFor) -> Result<Outcome, Error> {
        self.control.park(client, id, what);
        Ok(Outcome::Parked)
    }

    /// Handles a client's buffered requests, one at a time, until it is parked.
    pub fn serve(&mut self, client: u64, now: Mono) {
        while let Some(req) = self.control.next_request(client) {
            self.handle(client, req, now);
        }
    }
}
