//! What each control command does to the supervisor, and the answers owed to parked
//! clients (`stop` and `restart` answer once the service has done it).

use crate::config;
use crate::control::Access;
use crate::protocol::{self, Command, Error, ErrorKind, Request, SignalArg};
use crate::service::{Event, State};
use crate::supervisor::{signal_group, Supervisor, WaitFor, Waiter};
use crate::time::Mono;
use serde_json::{json, Value};
use std::path::PathBuf;

/// What a command produced.
enum Outcome {
    Answer(Value),
    /// Answer later (a waiter was parked).
    Parked,
}

impl Supervisor {
    /// Handles one decoded request (or the error of one that could not be decoded).
    pub fn handle(&mut self, client: u64, req: Result<Request, (Value, Error)>, now: Mono) {
        let (id, command) = match req {
            Ok(r) => (r.id, r.command),
            Err((id, e)) => return self.server.send(client, &protocol::encode_err(&id, &e)),
        };
        if let Err(e) = self.authorize(client, &command) {
            return self.server.send(client, &protocol::encode_err(&id, &e));
        }
        match self.run(client, &id, command, now) {
            Ok(Outcome::Answer(data)) => self.server.send(client, &protocol::encode_ok(&id, data)),
            Ok(Outcome::Parked) => {}
            Err(e) => self.server.send(client, &protocol::encode_err(&id, &e)),
        }
    }

    fn authorize(&self, client: u64, command: &Command) -> Result<(), Error> {
        let Some(c) = self.server.clients.get(&client) else {
            return Ok(());
        };
        let refused = match c.access {
            Access::Full => return Ok(()),
            Access::ReadOnly if command.read_only() => return Ok(()),
            Access::ReadOnly => format!("uid {} may only read (hello, status, log, watch); '{}' needs root", c.uid, command.name()),
            Access::None => format!("uid {} is not allowed to use this socket (not root, not supd's user, not in socket_group)", c.uid),
        };
        log::warn!(
            "refused '{}' from pid {} uid {}: {refused}",
            command.name(),
            c.pid,
            c.uid
        );
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
                    self.slots.keys().cloned().collect()
                } else {
                    self.named(service, services)?.0
                };
                let list: Vec<_> = names
                    .iter()
                    .map(|n| self.status_of(&self.slots[n], now))
                    .collect();
                Ok(Outcome::Answer(json!({
                    "services": list,
                    "config_errors": self.config_errors,
                    "tools": self.tools.iter().map(|(n, t)| (n.clone(), json!({
                        "current": t.record.current,
                        "phase": t.record.phase.as_str(),
                        "proposed": t.record.proposed,
                        "deadline_in_ms": t.deadline.map(|d| d.since(now).as_millis() as u64),
                        "pending": t.pending.as_ref().map(|p| p.op.describe(&p.change.record)),
                        "write_error": t.pending.as_ref().map(|p| p.error.clone()),
                    }))).collect::<serde_json::Map<String, Value>>(),
                    "down_error": self.down_retry.as_ref().map(|r| r.2.clone()),
                    "cleanup": self.cleanup.as_ref().map(|c| json!({
                        "services": c.services,
                        "processes": c.left(),
                    })),
                    "supd": {"version": crate::VERSION, "pid": std::process::id(), "uptime_ms": now.since(self.started).as_millis() as u64},
                })))
            }
            Command::Start { service, services } => {
                let (names, many) = self.named(service, services)?;
                self.refuse_during_shutdown()?;
                for n in &names {
                    let _ = self.set_down(n, false, now);
                    self.apply(n, Event::Start, now);
                }
                Ok(Outcome::Answer(self.statuses(&names, many, now)))
            }
            Command::Stop { service, services } => {
                let (names, many) = self.named(service, services)?;
                let mut unwritten = Vec::new();
                for n in &names {
                    let written = self.set_down(n, true, now);
                    self.apply(n, Event::Stop, now);
                    if let Err(e) = written {
                        unwritten.push((n.clone(), e));
                    }
                }
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
                self.park(client, id, WaitFor::Down { names, many })
            }
            Command::Restart { service, services } => {
                let (names, many) = self.named(service, services)?;
                self.refuse_during_shutdown()?;
                for n in &names {
                    let _ = self.set_down(n, false, now);
                    self.apply(n, Event::Restart, now);
                }
                self.park(client, id, WaitFor::Started { names, many })
            }
            Command::Signal { service, signal } => {
                self.known(&service)?;
                let sig = match signal {
                    SignalArg::Name(n) => config::parse_signal(&n),
                    SignalArg::Number(n) => config::parse_signal(&n.to_string()),
                }
                .map_err(|e| Error::new(ErrorKind::BadRequest, e))?;
                let pid = self.slots[&service].svc.pid.ok_or_else(|| {
                    Error::new(
                        ErrorKind::Failed,
                        format!("service '{service}' has no process to signal"),
                    )
                })?;
                signal_group(pid, sig);
                Ok(Outcome::Answer(
                    json!({"service": service, "pid": pid, "signal": config::signal_name(sig)}),
                ))
            }
            Command::Log {
                service,
                lines,
                follow,
            } => {
                self.known(&service)?;
                let slot = &self.slots[&service];
                if slot.cfg.log != config::LogMode::File {
                    return Err(Error::new(
                        ErrorKind::Failed,
                        format!(
                            "the output of '{service}' is not captured (its log is not \"file\")"
                        ),
                    ));
                }
                let tail = slot
                    .output
                    .as_ref()
                    .map(|o| o.tail(lines.unwrap_or(10)))
                    .unwrap_or_default();
                if follow {
                    if let Some(c) = self.server.clients.get_mut(&client) {
                        c.following = Some(service.clone());
                    }
                }
                Ok(Outcome::Answer(json!({"service": service, "lines": tail})))
            }
            Command::Watch {} => {
                if let Some(c) = self.server.clients.get_mut(&client) {
                    c.watching = true;
                }
                Ok(Outcome::Answer(json!({"watching": true})))
            }
            Command::Reload {
                service: Some(service),
            } => {
                self.known(&service)?;
                let slot = &self.slots[&service];
                let sig = slot.cfg.reload_signal;
                let pid = slot.svc.pid.ok_or_else(|| {
                    Error::new(
                        ErrorKind::Failed,
                        format!("service '{service}' has no process to reload"),
                    )
                })?;
                signal_group(pid, sig);
                Ok(Outcome::Answer(
                    json!({"service": service, "pid": pid, "signal": config::signal_name(sig)}),
                ))
            }
            Command::Reload { service: None } => {
                self.refuse_during_shutdown()?;
                // Answered when the config is read (`reload.rs`), outside the loop.
                if let Some(c) = self.server.clients.get_mut(&client) {
                    c.parked = true;
                }
                self.request_reload(Some((client, id.clone())), now);
                Ok(Outcome::Parked)
            }
            Command::Shutdown {} => {
                self.begin_shutdown(0, now);
                Ok(Outcome::Answer(json!({"shutting_down": true})))
            }
            Command::Install { tool, version, dir } => {
                self.install(&tool, &version, &dir, client, id)?;
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
            } => self
                .grant(
                    &lease,
                    &holder,
                    term,
                    &valid_for,
                    until_boot_ms,
                    kill_grace.as_deref(),
                    now,
                )
                .map(Outcome::Answer),
            Command::Poweroff {} => self.end_system(crate::pid1::Final::Poweroff, now),
            Command::Reboot {} => self.end_system(crate::pid1::Final::Reboot, now),
            Command::Halt {} => self.end_system(crate::pid1::Final::Halt, now),
            Command::Reexec { binary } => {
                self.refuse_during_shutdown()?;
                self.begin_reexec(binary.map(PathBuf::from), client, id)?;
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

    fn known(&self, name: &str) -> Result<(), Error> {
        if self.slots.contains_key(name) {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::UnknownService,
                format!("no service named '{name}'"),
            ))
        }
    }

    /// The services a request names (`service`, or `services`, where `all` names every
    /// service unless one is called so), each known, each once; and whether the answer
    /// is a list (`services` was used).
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
            } else {
                self.known(&n)?;
                vec![n]
            };
            for n in these {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
        Ok((names, many))
    }

    /// The answer of `start`, `stop` and `restart`: the one service's status, or a list.
    fn statuses(&self, names: &[String], many: bool, now: Mono) -> Value {
        match names {
            [one] if !many => self.one_status(one, now),
            _ => {
                json!({"services": names.iter().map(|n| self.one_status(n, now)).collect::<Vec<_>>()})
            }
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
        if let Some(c) = self.server.clients.get_mut(&client) {
            c.parked = true;
        }
        self.waiters.push(Waiter {
            client,
            id: id.clone(),
            what,
        });
        Ok(Outcome::Parked)
    }

    /// Handles a client's buffered requests, one at a time, until it is parked.
    pub fn serve(&mut self, client: u64, now: Mono) {
        while let Some(req) = self.server.next_request(client) {
            self.handle(client, req, now);
        }
    }

    /// Answers `data` (or `error`) to a parked client and serves what it sent meanwhile.
    pub fn unpark(&mut self, client: u64, id: &Value, answer: Result<Value, Error>, now: Mono) {
        let bytes = match answer {
            Ok(data) => protocol::encode_ok(id, data),
            Err(e) => protocol::encode_err(id, &e),
        };
        self.server.send(client, &bytes);
        if let Some(c) = self.server.clients.get_mut(&client) {
            c.parked = false;
        }
        self.serve(client, now);
    }

    /// Answers the waiters whose service or tool got where they wait for.
    pub fn answer_waiters(&mut self, now: Mono) {
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.waiters.len() {
            match self.settled(&self.waiters[i].what, now) {
                Some(answer) => {
                    let w = self.waiters.remove(i);
                    done.push((w.client, w.id, answer));
                }
                None => i += 1,
            }
        }
        for (client, id, answer) in done {
            self.unpark(client, &id, answer, now);
        }
    }

    /// The answer for a waiter, once what it waits for has happened.
    fn settled(&self, what: &WaitFor, now: Mono) -> Option<Result<Value, Error>> {
        match what {
            WaitFor::Down { names, many } | WaitFor::Started { names, many } => {
                let started = matches!(what, WaitFor::Started { .. });
                let done = names.iter().all(|n| match self.slots.get(n) {
                    None => true,
                    Some(s) if started => s.svc.state != State::Stopping && !s.svc.pending(),
                    Some(s) => s.is_down(),
                });
                done.then(|| Ok(self.statuses(names, *many, now)))
            }
            WaitFor::Upgrade(tool) => self.upgrade_settled(tool),
            WaitFor::LeaseDown { lease, by } => self.release_settled(lease, *by, now),
        }
    }
}
