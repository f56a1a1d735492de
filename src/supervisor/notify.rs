//! The coordinator side of notify sockets (the notify part: each slot's `notify::Inbox`,
//! and `notify::Legacy`): each service's socket made at its first start, and what its
//! messages (READY, STATUS, WATCHDOG) do to its slot.

use super::Supervisor;
use crate::notify::{dir_for, place, socket_path, Sender};
use crate::service::Event;
use crate::time::Mono;
use std::path::PathBuf;

impl Supervisor {
    /// The socket path a `ready = "notify"` service (or one with a watchdog or an fd
    /// store) gets, `None` for other services.
    pub fn notify_path(&self, name: &str) -> Result<Option<PathBuf>, String> {
        match self.slots.get(name) {
            Some(s)
                if s.cfg.ready == crate::config::Ready::Notify
                    || s.cfg.watchdog.is_some()
                    || s.cfg.fd_store > 0 =>
            {
                socket_path(&dir_for(&self.cfg.supd.socket), name).map(Some)
            }
            _ => Ok(None),
        }
    }

    /// Before a start: a notify service has its socket, owned by `uid` (the user it runs
    /// as; supd's when `None`) and empty of what was sent before this start; another
    /// service has none.
    pub fn ensure_notify(&mut self, name: &str, uid: Option<u32>) -> Result<(), String> {
        let path = self.notify_path(name)?;
        let dir = dir_for(&self.cfg.supd.socket);
        // A service that holds its socket at its path already is alone there (another
        // was refused it): only a first bind looks at every other service.
        let held = |p: &PathBuf| self.slots.get(name).is_some_and(|s| s.notify.holds(p));
        let taken = path.as_ref().filter(|p| !held(p)).and_then(|p| {
            self.slots
                .iter()
                .find(|(n, s)| *n != name && s.notify.holds(p))
                .map(|(n, _)| n.clone())
        });
        let Some(slot) = self.slots.get_mut(name) else {
            return Ok(());
        };
        let Some(path) = path else {
            slot.notify.close();
            return Ok(());
        };
        if let Some(other) = taken {
            return Err(format!(
                "its notify socket {} is {other}'s (their names hash alike); rename one",
                path.display()
            ));
        }
        let owner = uid.unwrap_or_else(|| nix::unistd::geteuid().as_raw());
        match slot.notify.reuse(&path) {
            Some(stale) => {
                if stale > 0 {
                    log::debug!("{name}: {stale} notify messages from before this start dropped");
                }
                nix::unistd::chown(&path, Some(owner.into()), None)
                    .map_err(|e| format!("cannot give {} to uid {owner}: {e}", path.display()))?;
            }
            None => slot.notify.bind(&dir, &path, owner)?,
        }
        Ok(())
    }

    /// Reads the datagrams of one service's socket.
    pub fn on_notify(&mut self, name: &str, now: Mono) {
        let Some(msgs) = self.slots.get(name).and_then(|s| s.notify.drain()) else {
            return;
        };
        let mut refused: Option<(usize, i32, i32)> = None;
        for mut msg in msgs {
            let Some(leader) = self.slots.get(name).and_then(|s| s.svc.pid) else {
                let fds = if msg.fds.is_empty() {
                    String::new()
                } else {
                    format!(" (its {} fds closed)", msg.fds.len())
                };
                log::debug!(
                    "{name}: notify message from pid {} while it has no process: ignored{fds}",
                    msg.pid
                );
                continue;
            };
            match place(msg.pid, leader, crate::proc::stat) {
                Sender::Inside | Sender::Gone => {
                    self.fd_store_message(name, &mut msg, now);
                    self.notified(name, msg.fields, now)
                }
                Sender::Outside => {
                    if !msg.fds.is_empty() {
                        log::warn!(
                            "{name}: {} fds sent by pid {}, not a process of the service: refused, closed",
                            msg.fds.len(),
                            msg.pid
                        );
                    }
                    let n = refused.map_or(0, |(n, _, _)| n);
                    refused = Some((n + 1, msg.pid, leader));
                }
            }
        }
        if let Some((n, pid, leader)) = refused {
            self.tell_refused(name, n, pid, leader, now);
        }
    }

    /// Tells refused notify messages at most once a second per service, with how many
    /// there were since: a flood from outside the service (a process of its user) must
    /// not flood supd's log in turn.
    fn tell_refused(&mut self, name: &str, n: usize, pid: i32, leader: i32, now: Mono) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        let Some(count) = slot.notify.refused(n, now) else {
            return;
        };
        let who = if count > 1 {
            format!(
                "{count} notify messages refused: their senders (the last, pid {pid}) are not \
                 processes"
            )
        } else {
            format!("notify message refused: its sender, pid {pid}, is not a process")
        };
        log::warn!(
            "{name}: {who} of the service (main pid {leader}; not in its process group or \
             session)"
        );
    }

    /// Reads the single socket of a supd from before per-service sockets, handed over by
    /// its `reexec`: the services it started still send there, matched by process group.
    pub fn on_legacy_notify(&mut self, now: Mono) {
        let Some(msgs) = self.legacy_notify.drain() else {
            return;
        };
        for msg in msgs {
            let name = self.pids.get(&msg.pid).cloned().or_else(|| {
                let pgrp = crate::proc::stat(msg.pid)?.pgrp;
                self.pids.get(&pgrp).cloned()
            });
            match name {
                Some(name) => self.notified(&name, msg.fields, now),
                None => log::debug!("notify message from pid {} of no service: ignored", msg.pid),
            }
        }
    }

    fn is_notify(&self, name: &str) -> bool {
        self.slots
            .get(name)
            .is_some_and(|s| s.cfg.ready == crate::config::Ready::Notify)
    }

    /// Acts on the fields of an accepted datagram.
    fn notified(&mut self, name: &str, fields: Vec<(String, String)>, now: Mono) {
        for (k, v) in fields {
            match k.as_str() {
                "READY" if v == "1" && self.is_notify(name) => self.apply(name, Event::Ready, now),
                "WATCHDOG" if v == "1" => self.watchdog_ping(name, now),
                "WATCHDOG"
                    if v == "trigger"
                        && self
                            .slots
                            .get(name)
                            .is_some_and(|s| s.cfg.watchdog.is_some()) =>
                {
                    self.watchdog_failed(name, "watchdog: WATCHDOG=trigger".into(), now);
                }
                "STATUS" => {
                    if let Some(s) = self.slots.get_mut(name) {
                        s.notify.set_status(v);
                    }
                }
                _ => {}
            }
        }
    }
}
