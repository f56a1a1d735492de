//! The rule of leadership (SPEC.md, Leases), as a pure function: what one node sees in
//! the store and what it remembers from its earlier ticks, with `now`, in; what it must
//! do out. T is the store lease's TTL.
//!
//! - eligible: healthy (no leader-only service of the lease unhealthy on that node, as
//!   its supd says), committed or on trial, not below the floor, and the target when
//!   pinned;
//! - preferred: the highest eligible version (`newest`), the lowest (`oldest`), or the
//!   target (`pinned`); a member on trial (its leader-only tool waits in a probation that
//!   only leading lets it pass) counts as its version would if committed, once: a node
//!   that loses leadership while still on trial for a version is not offered it again
//!   ([`Trials`]);
//! - a holder leads while the keepalive of its last renewal was *sent* less than
//!   [`validity`] (T/2) ago, it proved this tick that it owns `leader`, and it is
//!   eligible; its grant is an absolute deadline, that send plus T/2, and supd kills what
//!   is left [`kill_grace`] (T/4) after it: T/2 + T/4 + a margin of T/4 = T, so the
//!   services are gone before the store lease, which counts T from the keepalive's
//!   arrival (later than its send), can end; it steps down when not preferred and a
//!   preferred member has been live for T;
//! - an eligible candidate takes an empty `leader`; one that is not preferred waits T;
//! - a preferred candidate takes over a holder that for 2T was not a live member, not
//!   eligible, or not preferred and did not step down; it waits T before it leads;
//! - a member whose leader-only services cannot run (`failing`: failed, in their
//!   crash-loop cooldown, unhealthy, or it stepped down for that and stays out, see
//!   [`Fails`]) counts as not eligible while a member that is not failing is eligible:
//!   a failing holder then steps down, and a failing candidate waits; when every
//!   eligible member is failing, they lead as before (a crash-looping engine on one
//!   node is no worse than none);
//! - an irreversible version that leads raises the floor to itself, once committed (a
//!   version on trial may still be rolled back: it raises nothing);
//! - a lease without a tool (members without a version) is plain leader election: every
//!   live member is eligible and preferred, and compare-and-create picks one.
//!
//! Every instant is on `CLOCK_BOOTTIME` ([`Boot`]), which the file store, sup-lease and
//! supd share on one host: it never steps and it counts suspend.

use super::record::{Leader, Member, Policy, Strategy};
use crate::time::Boot;
use semver::Version;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How long a grant lasts after the keepalive it rests on was sent: T/2.
pub fn validity(ttl: Duration) -> Duration {
    ttl / 2
}

/// How long supd may take, at the most, to end the leader-only services once a grant
/// ran out (then SIGKILL): T/4.
pub fn kill_grace(ttl: Duration) -> Duration {
    ttl / 4
}

/// What is left of T once a grant and its kill grace are over: T/4, for supd's timer
/// to fire late, the kill to land, and the clocks of this host and the store's to run at
/// slightly different rates. [`validity`] + [`kill_grace`] + [`margin`] <= T.
pub fn margin(ttl: Duration) -> Duration {
    ttl.saturating_sub(validity(ttl) + kill_grace(ttl))
}

/// What a node remembers between ticks, in its own clock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// Since when each member has been seen, healthy, without a break.
    pub first_seen: BTreeMap<String, Boot>,
    /// Since when `leader` has been seen empty.
    pub empty_since: Option<Boot>,
    /// A holder that should not hold: (node, leader revision, since).
    pub bad_holder: Option<(String, u64, Boot)>,
    /// After a takeover, this node leads only from then on.
    pub lead_from: Option<Boot>,
    /// The term of the last leader this node saw (kept while `leader` is empty), to
    /// match a `released` mark against.
    pub last_term: Option<u64>,
}

/// From when a node that took an empty `leader` at `acquired` leads, `last_term` being
/// the term it saw last before. An empty key alone does not prove that the last
/// holder's runs are gone: the key may have gone by a revoke while the holder ran (a
/// takeover's, an operator's, or a store revoking a lease early: an old etcd leader that
/// stalled, on resuming, revokes the leases it counted out meanwhile, though they were
/// kept alive through the new one), and the holder's last grant rests on a keepalive
/// sent before the key went; it ends, with its kill grace, within 3T/4 of that send, so
/// T after the key went is safe. It leads sooner when that term is known to be over:
/// - at once when it was `released`: that mark is written in the transaction that
///   deletes `leader`, after the holder's supd answered that its leader-only runs had
///   exited (or after the holder's last grant and kill grace were over);
/// - from U + T when the watch saw the key vanish with its holder's store lease and the
///   holder's last write before it at U (`ended`, see [`super::watch`]): the grant rests
///   on a keepalive sent before that write, and ends with its kill grace by U + 3T/4;
///   after an expiry that is at once, since the store lease ended T after that
///   keepalive's arrival.
///
/// Evidence that comes after the key was taken (the watch saw the end a moment later)
/// still counts: the node looks again while it waits.
pub fn lead_from_after_acquire(
    last_term: Option<u64>,
    released: Option<u64>,
    ended: Option<(u64, Boot)>,
    acquired: Boot,
    ttl: Duration,
) -> Boot {
    let late = acquired.plus(ttl);
    let Some(seen) = last_term else {
        return late;
    };
    if released == Some(seen) {
        return acquired;
    }
    match ended {
        Some((term, at)) if term == seen => at.plus(ttl).max(acquired).min(late),
        _ => late,
    }
}

/// Whether a node whose keepalive got no answer stops renewing that store lease: once
/// its grant can no longer be renewed (T/2 after the last keepalive it read an answer
/// to). A keepalive whose answer is lost may still arrive (a one-way partition): renewed
/// on, the store lease and the leader key bound to it would live for as long as the
/// partition, with nobody leading. A shorter silence (an etcd election) costs nothing.
pub fn stop_renewing(last_renewal: Option<Boot>, now: Boot, ttl: Duration) -> bool {
    last_renewal.is_none_or(|r| now >= r.plus(validity(ttl)))
}

/// When a holder that can no longer grant (its store or its supd does not answer) may
/// give its key up: once the last grant it sent (`sent_until`, its end), with the kill
/// grace, is over; by then the guard beside each leader-only run has killed what was
/// left, whatever supd does. At once when it sent none.
pub fn give_up_from(sent_until: Option<Boot>, now: Boot, ttl: Duration) -> Boot {
    sent_until.map_or(now, |u| u.plus(kill_grace(ttl)))
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
    pub now: Boot,
    /// When the keepalive (or grant) of this node's store lease that the store last
    /// acknowledged was *sent*: the store counts T from a later instant.
    pub last_renewal: Option<Boot>,
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
    /// Lead: grant supd leadership until this instant (absolute, on `CLOCK_BOOTTIME`).
    Lead {
        until: Boot,
        raise_floor: Option<String>,
    },
    /// Holder after a takeover, waiting out the old holder's grant.
    Wait(Duration),
    /// Holder that must not hold: release supd's services, then delete `leader`.
    StepDown(String),
    /// Holder that cannot prove it still leads: stop renewing (the grant runs out).
    Fence(String),
}

/// Whether `m` may lead under `p`. A member of a lease without a tool has no version:
/// it is eligible while live, unless the policy speaks of versions (a floor or a pin),
/// which it cannot meet. An unhealthy member (a leader-only service of the lease is
/// unhealthy on that node, or was so recently) is never eligible.
pub fn eligible(m: &Member, p: &Policy) -> bool {
    ineligible(m, p).is_none()
}

/// Why `m` may not lead under `p`, or `None` when it may.
pub fn ineligible(m: &Member, p: &Policy) -> Option<String> {
    if !m.healthy {
        let why = m.reason.as_deref().unwrap_or("a leader-only service");
        return Some(match why.strip_prefix(FAILING) {
            Some(f) => format!("failing ({f}), and a member that is not failing may lead"),
            None => format!("unhealthy ({why})"),
        });
    }
    if !m.versioned {
        return if !m.committed {
            Some("no candidacy from supd".into())
        } else if let Some(f) = p.floor() {
            Some(format!("no version, and the floor is {f}"))
        } else if p.strategy == Strategy::Pinned {
            Some("no version, and the policy is pinned".into())
        } else {
            None
        };
    }
    let Some(v) = m.semver() else {
        return Some("no version".into());
    };
    if !m.committed && !m.trial {
        return Some(format!("{v} is not committed (in probation)"));
    }
    if let Some(f) = p.floor().filter(|f| &v < f) {
        return Some(format!("{v} is below the floor {f}"));
    }
    if p.strategy == Strategy::Pinned && p.target().as_ref() != Some(&v) {
        let t = p.target.as_deref().unwrap_or("?");
        return Some(format!("{v} is not the pinned version {t}"));
    }
    None
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

/// The preferred version, and whether an eligible member of it is on trial.
struct Pref {
    version: Option<Version>,
    trial: bool,
}

fn preference(members: &[Member], p: &Policy) -> Pref {
    let version = preferred(members, p);
    let trial = version.is_some()
        && members
            .iter()
            .any(|m| m.trial && eligible(m, p) && m.semver() == version);
    Pref { version, trial }
}

/// A versioned member is preferred when its version is the preferred one; one without a
/// tool when no versioned member is eligible (then all of them are, alike). Among the
/// members of the preferred version, those on trial come first: a version committed on
/// the holder does not keep another node's probation of it waiting for ever (its
/// leader-only services prove it only while they run there), so each node of a roll
/// leads once, on trial, and commits.
fn is_preferred(m: &Member, p: &Policy, pref: &Pref) -> bool {
    if !m.versioned {
        return eligible(m, p) && pref.version.is_none();
    }
    eligible(m, p) && m.semver().is_some() && m.semver() == pref.version && (m.trial || !pref.trial)
}

/// The reason given to a failing member set aside for one that is not failing.
const FAILING: &str = "failing: ";

/// The members as the rule weighs them: while a member that is not failing is eligible,
/// each failing one is set aside (unhealthy, for this decision only, with its reason).
pub fn weigh_failing(members: &[Member], p: &Policy) -> Vec<Member> {
    let sound = members
        .iter()
        .any(|m| m.failing.is_none() && eligible(m, p));
    members
        .iter()
        .map(|m| match &m.failing {
            Some(why) if sound && eligible(m, p) => Member {
                healthy: false,
                reason: Some(format!("{FAILING}{why}")),
                ..m.clone()
            },
            _ => m.clone(),
        })
        .collect()
}

/// The decision of this tick, and what to remember.
pub fn decide(v: &View, mem: &Memory) -> (Decision, Memory) {
    let members = weigh_failing(v.members, v.policy);
    let v = &View {
        members: &members,
        ..v.clone()
    };
    decide_weighed(v, mem)
}

fn decide_weighed(v: &View, mem: &Memory) -> (Decision, Memory) {
    let mut mem = remember(v, mem);
    let t = v.ttl;
    let p = v.policy;
    let pref = preference(v.members, p);
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
        Some((l, revision)) if l.node == v.me => {
            mem.last_term = Some(revision);
            mem.empty_since = None;
            mem.bad_holder = None;
            let until = v.last_renewal.map(|r| r.plus(validity(t)));
            let fresh = until.is_some_and(|u| v.now < u);
            if !v.owns_leader || !fresh {
                // A wait for an old holder's grant goes on: the key may well still be
                // this node's at the next tick (one failed ownership transaction, one
                // slow tick), and that grant is no shorter for it. A key that is no
                // longer its own is seen so at the next look, which forgets the wait.
                let why = if v.owns_leader {
                    "its store lease was not renewed for T/2"
                } else {
                    "it could not prove it owns the leader key"
                };
                return (Decision::Fence(why.into()), mem);
            }
            let Some(me) = me.filter(|m| eligible(m, p)) else {
                let why = me
                    .and_then(|m| ineligible(m, p))
                    .unwrap_or_else(|| "it is not a member".into());
                return (
                    Decision::StepDown(format!("this node is not eligible: {why}")),
                    mem,
                );
            };
            if !is_preferred(me, p, &pref) && live_preferred_other(&mem) {
                let want = pref.version.map(|v| v.to_string()).unwrap_or_default();
                let trial = if pref.trial { " on trial" } else { "" };
                return (
                    Decision::StepDown(format!(
                        "version {want}{trial} is preferred and has been live for T"
                    )),
                    mem,
                );
            }
            if let Some(from) = mem.lead_from.filter(|f| *f > v.now) {
                return (Decision::Wait(from.since(v.now)), mem);
            }
            mem.lead_from = None;
            let until = until.unwrap_or(v.now);
            // Only a committed version raises the floor: one on trial may be rolled back.
            let raise_floor = match (me.irreversible && me.committed, me.semver()) {
                (true, Some(mv)) if p.floor().is_none_or(|f| mv > f) => me.version.clone(),
                _ => None,
            };
            (Decision::Lead { until, raise_floor }, mem)
        }
        Some((l, revision)) => {
            mem.last_term = Some(revision);
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
fn live_preferred_other_than(v: &View, mem: &Memory, pref: &Pref, holder: &str) -> bool {
    v.members.iter().any(|m| {
        m.node != holder
            && is_preferred(m, v.policy, pref)
            && mem
                .first_seen
                .get(&m.node)
                .is_some_and(|s| v.now.since(*s) >= v.ttl)
    })
}

/// Updates since when each member has been seen live and healthy (one that vanished, or
/// was unhealthy, starts again): a holder steps down for a preferred member only once it
/// has been healthy for T, not at its first healthy tick after a hold.
fn remember(v: &View, mem: &Memory) -> Memory {
    let mut n = mem.clone();
    n.first_seen
        .retain(|node, _| v.members.iter().any(|m| &m.node == node && m.healthy));
    for m in v.members.iter().filter(|m| m.healthy) {
        n.first_seen.entry(m.node.clone()).or_insert(v.now);
    }
    n
}

/// What a node remembers of its own trials, between ticks: a trial is offered once.
/// A node that held `leader` on trial for a version and lost it while still on trial for
/// it (it stepped down, was fenced or taken over) does not offer that trial again: its
/// member is then in probation, not eligible. The mark is forgotten once supd's
/// candidacy is no longer on trial for that version (committed, rolled back, another
/// upgrade), so that an operator's later `upgrade --force` of it is a new trial. It lives
/// in sup-lease's memory: a restart of sup-lease forgets it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trials {
    /// The version this node held `leader` on trial for, at its last look.
    pub holding: Option<String>,
    /// Versions whose trial this node had and lost.
    pub spent: BTreeSet<String>,
}

impl Trials {
    /// The candidacy to publish, from supd's `c` (`answered`: supd was asked; when it
    /// could not be, nothing is forgotten): a spent trial is withheld (`trial` false, so
    /// in probation). Also whether it withheld one.
    pub fn offer(&mut self, c: Member, answered: bool) -> (Member, bool) {
        let mut c = c;
        if answered {
            self.spent
                .retain(|v| c.trial && c.version.as_deref() == Some(v.as_str()));
        }
        let withheld = c.trial && c.version.as_ref().is_some_and(|v| self.spent.contains(v));
        if withheld {
            c.trial = false;
        }
        (c, withheld)
    }

    /// This node led on `me` (supd took its grant): a trial under way, from now, even if
    /// no later look at the store sees it hold the key (leading comes in the tick that
    /// took an empty key, and a node stopped right after must still count it).
    pub fn led(&mut self, me: &Member) {
        if me.trial {
            self.holding = me.version.clone();
        }
    }

    /// After a look at the store: `me` is what this node published, `holds` whether
    /// `leader` names it. Returns the version whose trial was just spent, if any.
    pub fn observe(&mut self, me: &Member, answered: bool, holds: bool) -> Option<String> {
        if !answered {
            return None;
        }
        if !me.trial {
            self.holding = None;
            return None;
        }
        if holds {
            self.holding = me.version.clone();
            return None;
        }
        let lost = self
            .holding
            .take()
            .filter(|v| me.version.as_ref() == Some(v));
        if let Some(v) = &lost {
            self.spent.insert(v.clone());
        }
        lost
    }
}

/// What a node remembers of its own failing leaderships, between ticks. A holder whose
/// leader-only services cannot run steps down; once they are stopped they no longer
/// look failing, and the node would take the lease straight back (it may well be the
/// preferred one). So after such a step-down it says `failing` itself for a hold: 2T the
/// first time, doubled at each step-down that follows (up to 64T), and back to the start
/// once it led for as long as its last hold without failing. In sup-lease's memory: a
/// restart of sup-lease forgets it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fails {
    /// Step-downs for failing since it last led well.
    pub strikes: u32,
    /// Stays out until then, for this reason.
    pub out: Option<(Boot, String)>,
    /// Leading without failing since then.
    pub good_since: Option<Boot>,
}

impl Fails {
    /// How long the node stays out after its `strikes`th step-down for failing.
    pub fn hold(strikes: u32, ttl: Duration) -> Duration {
        ttl * 2 * (1u32 << strikes.saturating_sub(1).min(5))
    }

    /// This holder steps down because it is failing (`why`, as supd said).
    pub fn stepped_down(&mut self, why: &str, now: Boot, ttl: Duration) {
        self.strikes = self.strikes.saturating_add(1);
        self.good_since = None;
        let hold = Self::hold(self.strikes, ttl);
        self.out = Some((now.plus(hold), why.to_string()));
    }

    /// The candidacy to publish from supd's `c`: during a hold, failing (its reason and
    /// the time left). `leads`: this node holds a grant now.
    pub fn offer(&mut self, c: Member, leads: bool, now: Boot, ttl: Duration) -> Member {
        let mut c = c;
        if leads && c.failing.is_none() {
            let since = *self.good_since.get_or_insert(now);
            if self.strikes > 0 && now.since(since) >= Self::hold(self.strikes, ttl) {
                self.strikes = 0;
            }
        } else {
            self.good_since = None;
        }
        if let Some((until, why)) = self.out.clone() {
            if until <= now {
                self.out = None;
            } else if c.failing.is_none() {
                c.failing = Some(format!(
                    "stepped down as its leader-only services failed ({why}); a candidate again in {}",
                    crate::time::Human(until.since(now))
                ));
            }
        }
        c
    }
}

#[cfg(test)]
mod tests;
