//! The starts part: which services may be waiting to start, what a pass cut at its limit
//! left for the next, and the services' children asked of the spawner and not answered
//! yet. Its state is its own; the coordinator's start pass (`supervisor/starts.rs`) and
//! spawns (`supervisor/forks.rs`) ask and tell it, and decide on the slots.
//!
//! Nothing of it is carried across `reexec`: children asked for are called off before
//! the exec (they exit unrun), and the new image looks at every pending service at its
//! first pass.

use crate::spawner::Ticket;
use crate::sys;
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::time::Duration;

/// How many services one pass of the loop starts at most.
pub const SPAWNS_PER_PASS: usize = 64;

/// How long one pass of the loop goes on starting services: a spawn costs a fork of
/// supd (milliseconds when it is big), and a client or a signal waits behind the pass.
pub const PASS_TIME: Duration = Duration::from_millis(4);

/// Whether a pass that started `spawned` services in `elapsed` (read only when needed)
/// must leave the rest to the next: at least one starts in each.
pub fn pass_is_over(spawned: usize, elapsed: impl FnOnce() -> Duration) -> bool {
    spawned >= SPAWNS_PER_PASS || (spawned > 0 && elapsed() >= PASS_TIME)
}

/// What a service's spawn keeps for the child's release.
pub struct Forking {
    pub name: String,
    /// The tool version it runs.
    pub version: Option<String>,
    /// The cgroup it is forked into (or moves itself into).
    pub cgroup: Option<PathBuf>,
    /// It gets a dead-man guard (leader-only).
    pub leader_only: bool,
    /// Its readiness pipe: read end, and supd's copy of the write end (held until the
    /// child has its own, so that end-of-file means the child closed it).
    pub ready: Option<(OwnedFd, OwnedFd)>,
    pub pending: sys::Pending,
}

/// The starts part.
pub struct Starts {
    /// The services that may be waiting to start (a superset: each is looked at again).
    pending: BTreeSet<String>,
    /// Look at every pending service at the next pass, not only at those touched and
    /// their dependents: something else than a slot changed (a lease was granted, what a
    /// previous supd left is gone).
    recheck: bool,
    /// What the last pass, cut at its limit, had yet to look at.
    carry: BTreeSet<String>,
    /// The last pass left startable services for the next one, which must come at once.
    more: bool,
    /// Services' children asked of the spawner, by ticket.
    forks: BTreeMap<Ticket, Forking>,
}

impl Default for Starts {
    /// The first pass looks at every service.
    fn default() -> Starts {
        Starts {
            pending: BTreeSet::new(),
            recheck: true,
            carry: BTreeSet::new(),
            more: false,
            forks: BTreeMap::new(),
        }
    }
}

impl Starts {
    /// The next pass looks at every pending service: something else than a slot
    /// changed (a lease was granted, what a previous supd left is gone).
    pub fn recheck(&mut self) {
        self.recheck = true;
    }

    /// The next pass, at once, looks at every pending service: services became pending
    /// during a pass (a start that restarted others), after it chose what to look at.
    pub fn look_again_at_every_pending(&mut self) {
        self.recheck = true;
        self.more = true;
    }

    /// Whether the next pass must come at once (the last one was cut at its limit).
    pub fn more_to_start(&self) -> bool {
        self.more
    }

    /// Nothing starts any more (a shutdown): a pass cut at its limit before must not
    /// keep asking for the next turn at once.
    pub fn no_more(&mut self) {
        self.more = false;
    }

    /// `name` (a touched slot) is pending or not.
    pub fn note(&mut self, name: &str, pending: bool) {
        if pending {
            if !self.pending.contains(name) {
                self.pending.insert(name.to_string());
            }
        } else {
            self.pending.remove(name);
        }
    }

    /// Whether `name` is known to be pending.
    pub fn is_pending(&self, name: &str) -> bool {
        self.pending.contains(name)
    }

    /// Every service known to be pending.
    pub fn pending(&self) -> &BTreeSet<String> {
        &self.pending
    }

    /// Whether the last pass, cut, left `name` for the next.
    pub fn carried(&self, name: &str) -> bool {
        self.carry.contains(name)
    }

    /// A pass begins: what it looks at first, and whether that is every pending
    /// service. When it is not, it is what the last pass left, to which the coordinator
    /// adds the services touched and those after them.
    pub fn begin_pass(&mut self) -> (BTreeSet<String>, bool) {
        self.more = false;
        if std::mem::take(&mut self.recheck) {
            (self.pending.clone(), true)
        } else {
            (std::mem::take(&mut self.carry), false)
        }
    }

    /// The pass stopped before `look` was looked at: the next goes on with it, at once
    /// when `over` (its limit), else when the spawner's queue has room again.
    pub fn cut_pass(&mut self, over: bool, look: BTreeSet<String>) {
        self.more = over;
        self.carry = look;
    }

    /// A child was asked of the spawner under `ticket`.
    pub fn asked(&mut self, ticket: Ticket, f: Forking) {
        self.forks.insert(ticket, f);
    }

    /// The spawner answered `ticket`: what its spawn kept, if it was asked here.
    pub fn answered(&mut self, ticket: Ticket) -> Option<Forking> {
        self.forks.remove(&ticket)
    }

    /// Every request under way, taken (a shutdown, a reexec calls them off).
    pub fn take_forks(&mut self) -> Vec<Forking> {
        std::mem::take(&mut self.forks).into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_starts_at_least_one_and_stops_at_its_time_or_count() {
        let long = || Duration::from_secs(1);
        let short = || Duration::from_micros(100);
        assert!(!pass_is_over(0, long), "at least one start in each pass");
        assert!(pass_is_over(1, long), "a slow spawn ends the pass");
        assert!(pass_is_over(2, || PASS_TIME));
        assert!(!pass_is_over(SPAWNS_PER_PASS - 1, short));
        assert!(pass_is_over(SPAWNS_PER_PASS, short));
    }

    #[test]
    fn a_pass_looks_at_every_pending_service_once_asked_else_at_what_was_left() {
        let mut s = Starts::default();
        s.note("a", true);
        s.note("b", true);
        s.note("b", false);
        let (look, all) = s.begin_pass();
        assert!(all, "the first pass looks at all");
        assert_eq!(look, BTreeSet::from(["a".to_string()]));
        s.cut_pass(true, BTreeSet::from(["a".to_string()]));
        assert!(s.more_to_start() && s.carried("a"));
        let (look, all) = s.begin_pass();
        assert!(!all && !s.more_to_start());
        assert_eq!(look, BTreeSet::from(["a".to_string()]));
        s.look_again_at_every_pending();
        assert!(s.more_to_start());
        assert!(s.begin_pass().1);
    }
}
