//! The rule of leadership (SPEC.md, Leases), as a pure function: what one node sees in
//! the store and what it remembers from its earlier ticks, with `now`, in; what it must
//! do out. T is the store lease's TTL.
//!
//! - eligible: committed, not below the floor, and the target when pinned;
//! - preferred: the highest eligible version (`newest`), the lowest (`oldest`), or the
//!   target (`pinned`);
//! - a holder leads while its last renewal is younger than 2T/3, it proved this tick that
//!   it owns `leader`, and it is eligible; it steps down when not preferred and a
//!   preferred member has been live for T;
//! - an eligible candidate takes an empty `leader`; one that is not preferred waits T;
//! - a preferred candidate takes over a holder that for 2T was not a live member, not
//!   eligible, or not preferred and did not step down; it waits T before it leads;
//! - an irreversible version that leads raises the floor to itself.

use super::record::{Leader, Member, Policy, Strategy};
use crate::time::Mono;
use semver::Version;
use std::collections::BTreeMap;
use std::time::Duration;

/// What a node remembers between ticks, in its own clock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// Since when each member has been seen without a break.
    pub first_seen: BTreeMap<String, Mono>,
    /// Since when `leader` has been seen empty.
    pub empty_since: Option<Mono>,
    /// A holder that should not hold: (node, leader revision, since).
    pub bad_holder: Option<(String, u64, Mono)>,
    /// After a takeover, this node leads only from then on.
    pub lead_from: Option<Mono>,
}

/// What the node sees this tick.
#[derive(Clone, Debug)]
pub struct View<'a> {
    pub me: &'a str,
    pub members: &'a [Member],
    /// The leader record and the revision of its last write.
    pub leader: Option<(&'a Leader, u64)>,
    pub policy: &'a Policy,
    pub ttl: Duration,
    pub now: Mono,
    /// When this node's store lease was last renewed (keepalive acknowledged).
    pub last_renewal: Option<Mono>,
    /// This tick's transaction proved that `leader` is bound to this node's store lease.
    pub owns_leader: bool,
    /// The holder has said it is stepping down (its services are stopping): it is not
    /// taken over meanwhile. It is bounded: the services are killed after their
    /// `stop_timeout`, and the mark goes with the holder's store lease.
    pub holder_releasing: bool,
}

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not leading; nothing to write.
    Follow(String),
    /// Create `leader` (it is empty).
    Acquire,
    /// Replace `leader` written at this revision, revoke the old holder's store lease,
    /// and lead only after T.
    TakeOver { revision: u64 },
    /// Lead: grant supd leadership for this long.
    Lead {
        valid_for: Duration,
        raise_floor: Option<String>,
    },
    /// Holder after a takeover, waiting out the old holder's grant.
    Wait(Duration),
    /// Holder that must not hold: release supd's services, then delete `leader`.
    StepDown(String),
    /// Holder that cannot prove it still leads: stop renewing (the grant runs out).
    Fence(String),
}

/// Whether `m` may lead under `p`.
pub fn eligible(m: &Member, p: &Policy) -> bool {
    let Some(v) = m.semver() else { return false };
    m.committed
        && p.floor().is_none_or(|f| v >= f)
        && (p.strategy != Strategy::Pinned || p.target().as_ref() == Some(&v))
}

/// The preferred version among the eligible members.
pub fn preferred(members: &[Member], p: &Policy) -> Option<Version> {
    let mut vs = members
        .iter()
        .filter(|m| eligible(m, p))
        .filter_map(Member::semver);
    match p.strategy {
        Strategy::Newest => vs.max(),
        Strategy::Oldest => vs.min(),
        Strategy::Pinned => vs.find(|v| Some(v) == p.target().as_ref()),
    }
}

fn is_preferred(m: &Member, p: &Policy, pref: &Option<Version>) -> bool {
    eligible(m, p) && m.semver().is_some() && &m.semver() == pref
}

/// The decision of this tick, and what to remember.
pub fn decide(v: &View, mem: &Memory) -> (Decision, Memory) {
    let mut mem = remember(v, mem);
    let t = v.ttl;
    let p = v.policy;
    let pref = preferred(v.members, p);
    let me = v.members.iter().find(|m| m.node == v.me);
    let live_preferred_other = |mem: &Memory| {
        v.members.iter().any(|m| {
            m.node != v.me
                && is_preferred(m, p, &pref)
                && mem
                    .first_seen
                    .get(&m.node)
                    .is_some_and(|s| v.now.since(*s) >= t)
        })
    };
    match v.leader {
        Some((l, _)) if l.node == v.me => {
            mem.empty_since = None;
            mem.bad_holder = None;
            let fresh = v.last_renewal.is_some_and(|r| v.now.since(r) < t * 2 / 3);
            if !v.owns_leader || !fresh {
                mem.lead_from = None;
                let why = if v.owns_leader {
                    "its store lease was not renewed for 2T/3"
                } else {
                    "it could not prove it owns the leader key"
                };
                return (Decision::Fence(why.into()), mem);
            }
            let Some(me) = me.filter(|m| eligible(m, p)) else {
                return (Decision::StepDown("this node is not eligible".into()), mem);
            };
            if !is_preferred(me, p, &pref) && live_preferred_other(&mem) {
                let want = pref.map(|v| v.to_string()).unwrap_or_default();
                return (
                    Decision::StepDown(format!(
                        "version {want} is preferred and has been live for T"
                    )),
                    mem,
                );
            }
            if let Some(from) = mem.lead_from.filter(|f| *f > v.now) {
                return (Decision::Wait(from.since(v.now)), mem);
            }
            mem.lead_from = None;
            let valid_for =
                (t * 2 / 3).saturating_sub(v.now.since(v.last_renewal.unwrap_or(v.now)));
            let raise_floor = match (me.irreversible, me.semver()) {
                (true, Some(mv)) if p.floor().is_none_or(|f| mv > f) => me.version.clone(),
                _ => None,
            };
            (
                Decision::Lead {
                    valid_for,
                    raise_floor,
                },
                mem,
            )
        }
        Some((l, revision)) => {
            mem.empty_since = None;
            mem.lead_from = None;
            let holder = v.members.iter().find(|m| m.node == l.node);
            let bad = !v.holder_releasing
                && match holder {
                    None => true,
                    Some(h) => {
                        !eligible(h, p)
                            || (!is_preferred(h, p, &pref)
                                && live_preferred_other_than(v, &mem, &pref, &h.node))
                    }
                };
            mem.bad_holder = match (&mem.bad_holder, bad) {
                (_, false) => None,
                (Some((n, r, since)), true) if *n == l.node && *r == revision => {
                    Some((n.clone(), *r, *since))
                }
                (_, true) => Some((l.node.clone(), revision, v.now)),
            };
            let overdue = mem
                .bad_holder
                .as_ref()
                .is_some_and(|(_, _, since)| v.now.since(*since) >= t * 2);
            if overdue && me.is_some_and(|m| is_preferred(m, p, &pref)) {
                return (Decision::TakeOver { revision }, mem);
            }
            (Decision::Follow(format!("{} leads", l.node)), mem)
        }
        None => {
            mem.bad_holder = None;
            mem.lead_from = None;
            let since = *mem.empty_since.get_or_insert(v.now);
            match me {
                Some(m) if is_preferred(m, p, &pref) => (Decision::Acquire, mem),
                Some(m) if eligible(m, p) && v.now.since(since) >= t => (Decision::Acquire, mem),
                Some(m) if eligible(m, p) => (
                    Decision::Follow("waiting T for a preferred candidate".into()),
                    mem,
                ),
                _ => (Decision::Follow("not eligible".into()), mem),
            }
        }
    }
}

/// A preferred member other than `holder` (and not necessarily this node) live for T.
fn live_preferred_other_than(v: &View, mem: &Memory, pref: &Option<Version>, holder: &str) -> bool {
    v.members.iter().any(|m| {
        m.node != holder
            && is_preferred(m, v.policy, pref)
            && mem
                .first_seen
                .get(&m.node)
                .is_some_and(|s| v.now.since(*s) >= v.ttl)
    })
}

/// Updates when each member was first seen (a member that vanished starts again).
fn remember(v: &View, mem: &Memory) -> Memory {
    let mut n = mem.clone();
    n.first_seen
        .retain(|node, _| v.members.iter().any(|m| &m.node == node));
    for m in v.members {
        n.first_seen.entry(m.node.clone()).or_insert(v.now);
    }
    n
}

#[cfg(test)]
mod tests;
