//! The coordinator side of what supd keeps for a service between its runs (`kept.rs`):
//! its `listen` sockets handed to each run, what its notify messages store in or remove
//! from its fd store, stored fds that hung up, and letting all go when it is stopped.

use super::Supervisor;
use crate::notify::Message;
use crate::service::{State, Want};
use crate::slots::Slot;
use crate::time::Mono;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

/// What a run is given of what is kept: its fds 3.. (dups, for the spawn request), the
/// environment that names them, and Unix socket files to give to its user.
pub(super) struct Passed {
    pub(super) fds: Vec<OwnedFd>,
    pub(super) env: Vec<(String, String)>,
    pub(super) give: Vec<PathBuf>,
}

/// Before a start of `slot`: its `listen` sockets bound (those held already are kept),
/// and what its run gets. An address that cannot be bound fails the start (and the
/// next start tries again); the sockets bound meanwhile stay held.
pub(super) fn for_run(slot: &mut Slot) -> Result<Passed, String> {
    slot.kept.reconcile(&slot.cfg.listen)?;
    let run = slot.kept.for_run(&slot.cfg.name);
    let mut fds = Vec::with_capacity(run.fds.len());
    for fd in &run.fds {
        fds.push(
            fd.try_clone_to_owned()
                .map_err(|e| format!("cannot pass its sockets: {e}"))?,
        );
    }
    let mut env = Vec::new();
    if !fds.is_empty() {
        env.push(("LISTEN_FDS".to_string(), fds.len().to_string()));
        env.push(("LISTEN_FDNAMES".to_string(), run.names.join(":")));
    }
    Ok(Passed {
        fds,
        env,
        give: run.give,
    })
}

impl Supervisor {
    /// What an accepted notify message of `name` does to its fd store: `FDSTORE=1`
    /// keeps the fds it carried (within `fd_store`), `FDSTOREREMOVE=1` drops those named
    /// by `FDNAME=`. Fds sent otherwise, or refused, are closed, and the refusal told.
    pub(super) fn fd_store_message(&mut self, name: &str, msg: &mut Message, now: Mono) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        let fds = std::mem::take(&mut msg.fds);
        if msg.fds_cut {
            tell(
                &mut slot.kept,
                name,
                now,
                "cut",
                "a notify message carried more fds than supd takes in one (253): the kernel closed the rest; send fewer at a time".into(),
            );
        }
        if msg.get("FDSTOREREMOVE") == Some("1") {
            match msg.get("FDNAME") {
                Some(n) => {
                    let dropped = slot.kept.remove(n);
                    // Out of the epoll set while they are open: the run may hold them.
                    for fd in &dropped {
                        self.fdset.forget(fd.as_fd());
                    }
                    log::debug!(
                        "{name}: FDSTOREREMOVE: {} stored fds named {n} dropped",
                        dropped.len()
                    );
                }
                None => tell(
                    &mut slot.kept,
                    name,
                    now,
                    "unnamed",
                    "FDSTOREREMOVE=1 without FDNAME=: nothing dropped (name the fds to drop)"
                        .into(),
                ),
            }
        }
        if msg.get("FDSTORE") == Some("1") {
            let n = fds.len();
            let poll = msg.get("FDPOLL") != Some("0");
            match slot
                .kept
                .store(fds, msg.get("FDNAME"), poll, slot.cfg.fd_store)
            {
                Ok(n) => log::debug!(
                    "{name}: FDSTORE: {n} fds stored ({} held)",
                    slot.kept.stored_count()
                ),
                Err(why) => tell(
                    &mut slot.kept,
                    name,
                    now,
                    why.kind(),
                    format!("FDSTORE of {n} fds refused, closed: {why}"),
                ),
            }
        } else if !fds.is_empty() {
            tell(
                &mut slot.kept,
                name,
                now,
                "unasked",
                format!(
                    "a notify message carried {} fds without FDSTORE=1: closed",
                    fds.len()
                ),
            );
        }
    }

    /// Why a start of `name` could not bind its sockets, saying so when another service
    /// holds one of them: a reload moved the address, and the other lets go of it at
    /// its next start (under way: this start is tried again), not "another program".
    pub(super) fn held_by_another(&self, name: &str, why: String) -> String {
        let Some(slot) = self.slots.get(name) else {
            return why;
        };
        let missing = (slot.cfg.listen.iter()).filter(|a| !slot.kept.holds(a));
        for addr in missing {
            let other = (self.slots.iter())
                .filter(|(n, _)| *n != name)
                .find_map(|(n, s)| s.kept.clashing(addr).map(|a| (n, a)));
            if let Some((other, held)) = other {
                return format!(
                    "cannot bind {addr}: {other} still holds {held} (a reload moved it: {other} lets go of it at its next start)"
                );
            }
        }
        why
    }

    /// A stored fd of `name` reported a hang-up or an error: those that did are dropped.
    pub(super) fn on_stored_hangup(&mut self, name: &str) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        for (n, fd) in slot.kept.drop_hung() {
            // Out of the epoll set before it closes: the run may hold it too.
            self.fdset.forget(fd.as_fd());
            log::info!("{name}: stored fd {n} hung up: dropped from its fd store");
        }
    }

    /// After an event of `name`: stopped for good (not a restart, which wants it up),
    /// its sockets close, so that clients are refused rather than left waiting in a
    /// backlog nobody reads. So does a service that failed or exited for good though
    /// wanted up (no restart comes but an operator's or a reload's, which bind again),
    /// unless it is a tool's in probation: the rollback that follows starts it again,
    /// and must find the sockets held. (Out of probation no rollback comes on its own:
    /// a tool's service lets go as any other.)
    pub(super) fn let_go_when_done(&mut self, name: &str) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        if slot.kept.is_empty() {
            return;
        }
        let state = slot.svc.state;
        let down = slot.svc.want == Want::Down
            && matches!(state, State::Stopped | State::Failed | State::Exited);
        let in_probation = (slot.cfg.tool.as_ref())
            .and_then(|t| self.tools.get(t))
            .is_some_and(|t| t.record.phase == crate::upgrade::Phase::Probation);
        let given_up = matches!(state, State::Failed | State::Exited) && !in_probation;
        if down || given_up {
            // Out of the epoll set before they close: a process of the run that is left
            // may hold them too.
            for fd in slot.kept.release() {
                self.fdset.forget(fd.as_fd());
            }
        }
    }

    /// Before a start of `name`: what it is given of what is kept (its fds 3.., dups),
    /// the variables that name them set into `plan`'s environment (any of its own
    /// `LISTEN_*` removed), and its Unix sockets' files added to `give` when it runs as
    /// a user. A socket that cannot be bound is the error.
    pub(super) fn pass_kept(
        &mut self,
        name: &str,
        plan: &mut crate::launch::Launch,
        give: &mut Vec<PathBuf>,
    ) -> Result<Vec<OwnedFd>, String> {
        let Some(slot) = self.slots.get_mut(name) else {
            return Ok(Vec::new());
        };
        // No more stored fds than `fd_store` says now (a reload may have lowered it).
        let past = slot.kept.trim(slot.cfg.fd_store);
        if !past.is_empty() {
            log::warn!(
                "{name}: {} stored fds past fd_store = {} dropped (the first ones stored are kept)",
                past.len(),
                slot.cfg.fd_store
            );
        }
        for (_, fd) in &past {
            self.fdset.forget(fd.as_fd());
        }
        drop(past);
        let Some(slot) = self.slots.get_mut(name) else {
            return Ok(Vec::new());
        };
        let passed = match for_run(slot) {
            Ok(p) => p,
            Err(why) => return Err(self.held_by_another(name, why)),
        };
        if plan.creds.as_ref().is_some_and(|c| c.user.is_some()) {
            give.extend(passed.give);
        }
        if !passed.fds.is_empty() {
            // supd passes the fds, so it says what they are: an `env` or `env_file`
            // of its own LISTEN_* would come first in the environment and be the one
            // read (sd_listen_fds(3) then finds no socket, or the wrong ones).
            let listen_vars = ["LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"];
            let before = plan.env.len();
            plan.env.retain(|(k, _)| !listen_vars.contains(&k.as_str()));
            if plan.env.len() < before {
                log::warn!(
                    "{name}: its env sets LISTEN_FDS, LISTEN_PID or LISTEN_FDNAMES: supd's are given (it passes the fds); remove them from env and env_file"
                );
            }
        }
        plan.env.extend(passed.env);
        Ok(passed.fds)
    }
}

/// Tells a refusal of `kind` of `name`'s notify messages: each kind at most once a
/// second, with how many there were since.
fn tell(kept: &mut crate::kept::Kept, name: &str, now: Mono, kind: &'static str, what: String) {
    if let Some(n) = kept.refused(kind, now) {
        let more = if n > 1 {
            format!(" ({} more like it since this was last said)", n - 1)
        } else {
            String::new()
        };
        log::warn!("{name}: {what}{more}");
    }
}
