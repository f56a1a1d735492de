//! Every service's slot by name, and which slots changed since the loop last looked.
//!
//! A slot can only be changed through [`Slots::get_mut`] (or the few calls that change
//! many), and each of those notes the name as touched. At the end of each turn the loop
//! brings its indices (the timers, the services waiting to start, the polled fds) up to
//! date for the touched slots alone: an event costs the same whatever the number of
//! services. Reads go through `Deref` to the map.

use crate::config::ServiceConfig;
use crate::instance::Instance;
use crate::logs::Output;
use crate::records::PidFile;
use crate::service::{Service, State};
use crate::sys;
use crate::time::Mono;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Deref;
use std::os::fd::OwnedFd;

/// One configured service and what belongs to it.
pub struct Slot {
    /// Its id for as long as it is in [`Slots`], which gives it.
    pub id: u32,
    pub cfg: ServiceConfig,
    pub svc: Service,
    /// Its output pipes and ring, boxed: a service with `log = "null"` has none.
    pub output: Option<Box<Output>>,
    /// Read end of the `fd:N` readiness pipe of the current process.
    pub ready_pipe: Option<OwnedFd>,
    /// The tool version the current (or last) process runs.
    pub version: Option<String>,
    /// Its notify part: the `NOTIFY_SOCKET` of a notify service (made at its first
    /// start), its last `STATUS=`, its refused messages not told yet.
    pub notify: crate::notify::Inbox,
    /// Where the current process is recorded, made at the first start (a path: the
    /// file is opened for each write, never held open).
    pub(crate) pid_file: Option<PidFile>,
    /// The current (or finishing) run: from its spawn until its last process is gone.
    pub instance: Option<Instance>,
    /// A pidfd of the run's leader (and its pid), until it is reaped: readable when it
    /// exits, so the exit is found without looking at every child. `None` on kernels
    /// without pidfds.
    pub leader: Option<(i32, OwnedFd)>,
    /// Its child between release and exec: the report says how the exec went.
    pub exec: Option<sys::Exec>,
    /// Why its last child could not run its program (given when that child is reaped).
    pub exec_error: Option<sys::ExecFailure>,
    /// The uid and groups its last child took as its `user` (with the `group` it was
    /// configured with), as the child reported them: supd never reads the user
    /// database itself. `upgrade` checks a new version against them.
    pub ran_as: Option<Box<(Option<String>, crate::access::Who)>>,
    /// Removed by a reload: dropped once it is down.
    pub removed: bool,
    /// Its health part: its check (`health`) and watchdog (`watchdog`) for the run they
    /// follow, the check's run under way and its pid record; kept across its runs for
    /// `status`.
    pub health: crate::health::Watch,
    /// Its child asked of the spawner and not answered yet (`supervisor/forks.rs`).
    pub forking: Option<crate::spawner::Ticket>,
    /// The cgroup limits this supd last wrote into its cgroups (`cgroup/limits.rs`):
    /// what a start or a reload sets back where the config no longer sets it.
    pub limits_written: crate::config::resources::ResourceLimits,
    /// What supd keeps for it between runs: its `listen` sockets and its fd store
    /// (`kept.rs`).
    pub kept: crate::kept::Kept,
}

impl Slot {
    /// No process of the service is left, and none is being stopped.
    pub fn is_down(&self) -> bool {
        self.svc.pid.is_none() && self.instance.is_none() && self.svc.state != State::Stopping
    }
}

/// The slots by name, with the names touched since [`Slots::take_touched`].
#[derive(Default)]
pub struct Slots {
    /// Each slot boxed: a slot is over a kilobyte, and the map's nodes, about half
    /// full after inserts in order, would hold room for twice as many.
    map: BTreeMap<String, Box<Slot>>,
    touched: BTreeSet<String>,
    /// Each slot's id, stable for its life (the fds' tokens carry it), to its name.
    names: BTreeMap<u32, String>,
    next_id: u32,
}

impl Deref for Slots {
    type Target = BTreeMap<String, Box<Slot>>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl Slots {
    /// The slot of `name`, to change: noted as touched.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Slot> {
        let slot = self.map.get_mut(name)?;
        if !self.touched.contains(name) {
            self.touched.insert(name.to_string());
        }
        Some(&mut **slot)
    }

    /// Every slot, to change: all are noted as touched (for the rare passes over all).
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Slot> {
        self.touched.extend(self.map.keys().cloned());
        self.map.values_mut().map(|s| &mut **s)
    }

    /// Adds a slot under a new id (or replaces one, under its id: what the set holds of
    /// the old one's fds is then let go at the next turn's sync of that id).
    pub fn insert(&mut self, mut slot: Slot) {
        let name = slot.cfg.name.clone();
        slot.id = match self.map.get(&name) {
            Some(old) => old.id,
            None => {
                self.next_id = self.next_id.wrapping_add(1);
                self.next_id
            }
        };
        self.names.insert(slot.id, name.clone());
        self.touched.insert(name.clone());
        self.map.insert(name, Box::new(slot));
    }

    /// Removes a slot.
    pub fn remove(&mut self, name: &str) -> Option<Slot> {
        let slot = self.map.remove(name)?;
        self.names.remove(&slot.id);
        self.touched.insert(name.to_string());
        Some(*slot)
    }

    /// The name of the slot with `id`, if it is still there.
    pub fn name_of(&self, id: u32) -> Option<&str> {
        self.names.get(&id).map(String::as_str)
    }

    /// The names touched so far this turn.
    pub fn touched(&self) -> &BTreeSet<String> {
        &self.touched
    }

    /// The names touched since the last call, which forgets them.
    pub fn take_touched(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.touched)
    }
}

/// Deadlines by time, at most one per name (its earliest): what is due is found without
/// looking at the others.
#[derive(Default, Debug, PartialEq, Eq)]
pub struct Timers {
    by_time: BTreeSet<(Mono, String)>,
    at: BTreeMap<String, Mono>,
}

impl Timers {
    /// Sets (or with `None` clears) the deadline of `name`.
    pub fn set(&mut self, name: &str, at: Option<Mono>) {
        if self.at.get(name).copied() == at {
            return;
        }
        if let Some(old) = self.at.remove(name) {
            self.by_time.remove(&(old, name.to_string()));
        }
        if let Some(at) = at {
            self.at.insert(name.to_string(), at);
            self.by_time.insert((at, name.to_string()));
        }
    }

    /// The earliest deadline.
    pub fn first(&self) -> Option<Mono> {
        self.by_time.first().map(|(at, _)| *at)
    }

    /// The names whose deadline has come, earliest first.
    pub fn due(&self, now: Mono) -> Vec<String> {
        self.by_time
            .iter()
            .take_while(|(at, _)| *at <= now)
            .map(|(_, n)| n.clone())
            .collect()
    }

    /// The deadline of `name`.
    pub fn get(&self, name: &str) -> Option<Mono> {
        self.at.get(name).copied()
    }

    /// How many deadlines are set.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// No deadline is set.
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_keep_one_deadline_per_name_and_give_the_due_ones_in_order() {
        let mut t = Timers::default();
        t.set("a", Some(Mono(30)));
        t.set("b", Some(Mono(10)));
        t.set("c", Some(Mono(20)));
        t.set("a", Some(Mono(5)));
        assert_eq!(t.first(), Some(Mono(5)));
        assert_eq!(t.due(Mono(20)), vec!["a", "b", "c"]);
        assert_eq!(t.due(Mono(9)), vec!["a"]);
        t.set("a", None);
        assert_eq!(t.due(Mono(15)), vec!["b"]);
        assert_eq!((t.len(), t.get("a"), t.get("c")), (2, None, Some(Mono(20))));
        t.set("b", None);
        t.set("c", None);
        assert!(t.is_empty() && t.first().is_none());
    }
}
