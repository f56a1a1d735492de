//! One node's campaign for a lease: every tick (T/3), read the candidacy from supd,
//! renew the store lease and the member key, read the lease's keys, apply the rule,
//! and carry out its decision (in the store, then in supd).

use super::memory::Durable;
use super::record::{prefix, term, Leader, LeaderRecord, Member};
use super::rule::{
    decide, give_up_from, kill_grace, lead_from_after_acquire, stop_renewing, validity, Decision,
    Fails, Memory, Trials, View,
};
pub use super::snapshot::{read, snapshot, write_policy, Snapshot};
use super::store::{Cond, Identity, LeaseId, Store, StoreError};
use super::supd::Release;
pub use super::supd::{Supd, SupdError};
use crate::time::{Boot, Human};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// The `released` mark of a clean release of `term` by `node`.
fn released_mark(node: &str, term: u64) -> String {
    json!({"node": node, "term": term}).to_string()
}

/// The `lease-grant` request for a grant that ends at `until`, or `None` when it is
/// already over at `now`. supd enforces `until_boot_ms` (CLOCK_BOOTTIME, rounded down)
/// as given, and kills what is left `kill_grace` after it; an older supd reads only
/// `valid_for`, counted from when it receives it, so it is what is left at `now`.
pub fn grant_request(
    lease: &str,
    holder: &str,
    term: u64,
    until: Boot,
    ttl: Duration,
    now: Boot,
) -> Option<Value> {
    let left = until.since(now);
    if left < Duration::from_millis(1) {
        return None;
    }
    Some(json!({
        "cmd": "lease-grant", "lease": lease, "holder": holder, "term": term,
        "valid_for": format!("{}ms", left.as_millis()),
        "until_boot_ms": until.as_ms(),
        "kill_grace": format!("{}ms", kill_grace(ttl).as_millis()),
    }))
}

/// The campaign of one node.
pub struct Node {
    pub lease: String,
    pub name: String,
    pub ttl: Duration,
    pub store: Box<dyn Store>,
    pub supd: Supd,
    socket: PathBuf,
    my_lease: Option<LeaseId>,
    /// When the last acknowledged keepalive (or grant) of `my_lease` was sent.
    last_renewal: Option<Boot>,
    memory: Memory,
    /// The term of the leadership supd was last granted, to tell a change.
    leading: Option<u64>,
    /// A step-down under way.
    releasing: Option<Release>,
    last_note: String,
    /// Why this node was unhealthy at the last tick, to say when that changes.
    unhealthy: Option<String>,
    /// The lease's tool on this node, as supd last said.
    tool: Option<String>,
    /// The trials this node had (one each, see [`Trials`]).
    trials: Trials,
    /// The version whose spent trial was withheld at the last tick, to say it once.
    withheld: Option<String>,
    /// Its step-downs for failing, and the hold after them (see [`Fails`]).
    fails: Fails,
    /// What it remembers across restarts (the highest term, the store, the policy).
    durable: Durable,
    /// Where that is kept (`None`: not kept, as in unit tests), and when last written.
    durable_path: Option<PathBuf>,
    durable_saved: Option<Boot>,
    /// The mod revision of `leader` at the last look (0: empty).
    seen_leader: u64,
    /// The end of the latest grant sent to supd (answered or not): what a run may last
    /// until, with the kill grace.
    sent_until: Option<Boot>,
    /// The term of `leader` bound to this node's store lease at the last look.
    held: Option<u64>,
    /// After taking an empty key: the term seen last before, and when it was taken.
    acquired: Option<(Option<u64>, Boot)>,
    /// A store lease this node stopped renewing (its keepalives went unanswered), the
    /// term it held with it, and from when it is given up (revoked, its key deleted).
    abandoned: Option<(LeaseId, Option<u64>, Boot)>,
    /// What the watch of the lease's keys saw (when sup-lease runs one).
    pub seen: Option<std::sync::Arc<std::sync::Mutex<super::watch::Seen>>>,
    /// The member record this node wrote last, written again after each keepalive of
    /// a step-down in `leave` (see there).
    member_value: Option<String>,
}

impl Node {
    pub fn new(
        lease: String,
        name: String,
        ttl: Duration,
        store: Box<dyn Store>,
        socket: PathBuf,
    ) -> Node {
        Node {
            lease,
            name,
            ttl,
            store,
            supd: Supd::new(socket.clone()),
            socket,
            my_lease: None,
            last_renewal: None,
            memory: Memory::default(),
            leading: None,
            releasing: None,
            last_note: String::new(),
            unhealthy: None,
            tool: None,
            trials: Trials::default(),
            withheld: None,
            fails: Fails::default(),
            durable: Durable::default(),
            durable_path: None,
            durable_saved: None,
            seen_leader: 0,
            sent_until: None,
            held: None,
            acquired: None,
            abandoned: None,
            seen: None,
            member_value: None,
        }
    }

    /// Keeps what this node remembers of the lease in `dir` (read now, written when it
    /// changes): the highest term seen, the store's identity, the policy.
    pub fn remember_in(&mut self, dir: &std::path::Path) {
        let path = super::memory::path(dir, &self.lease);
        self.durable = super::memory::load(&path);
        if self.durable.term > 0 {
            log::info!(
                "{}: {} remembers term {} and store {} (revision {}) from {}",
                self.lease,
                self.name,
                self.durable.term,
                self.durable.store,
                self.durable.revision,
                path.display()
            );
        }
        self.durable_path = Some(path);
    }

    /// Writes the memory durably; a failure is said (then terms rest on what the
    /// process remembers).
    fn save_memory(&mut self) {
        let Some(path) = self.durable_path.clone() else {
            return;
        };
        match super::memory::save(&path, &self.durable) {
            Ok(()) => self.durable_saved = Some(Boot::now()),
            Err(e) => log::error!(
                "{}: cannot write {}: {e}; a restart of sup-lease forgets the highest term",
                self.lease,
                path.display()
            ),
        }
    }

    /// Looks at the store's identity before deciding: a store wiped or replaced since
    /// the last look is said (an error, once), the terms it hands out go on from the
    /// highest seen, and a policy the store lost is written back (create-if-absent).
    /// Returns the snapshot to decide on (read again after such a write).
    fn look_at_store(&mut self, snap: Snapshot, seen: Identity) -> Snapshot {
        if let Some(why) = self.durable.judge(&seen) {
            log::error!(
                "{}: {why}: terms go on above {} (no lower one is handed out), and the policy is written back from what this node last saw",
                self.lease,
                self.durable.term
            );
        }
        let has_policy = snap.policy_revision != 0;
        let terms: Vec<u64> = snap.term().into_iter().collect();
        let changed = self
            .durable
            .observe(&seen, &terms, has_policy.then_some(&snap.policy));
        let stale = self
            .durable_saved
            .is_none_or(|t| Boot::now().since(t) >= std::time::Duration::from_secs(60));
        if changed || stale {
            self.save_memory();
        }
        let Some(p) = self.durable.restore(has_policy) else {
            return snap;
        };
        let Ok(value) = serde_json::to_string(&p) else {
            return snap;
        };
        match self
            .store
            .put(&self.key("policy"), &value, 0, Some(Cond::Absent))
        {
            Ok(Some(_)) => log::error!(
                "{}: the store has no policy: written back as this node last saw it (floor {}, {:?}{}, epoch {})",
                self.lease,
                p.floor.as_deref().unwrap_or("none"),
                p.strategy,
                p.target.as_deref().map(|t| format!(" {t}")).unwrap_or_default(),
                p.epoch
            ),
            Ok(None) => {} // another node wrote one first: it stands.
            Err(e) => self.note(format!("store: {e}")),
        }
        snapshot(self.store.as_mut(), &self.lease).unwrap_or(snap)
    }

    /// Whether this node leads a lease whose tool is `tool` (a fleet upgrades it last),
    /// or holds its key and waits out T before it leads: a leader-to-be that took a
    /// fleet's slot meanwhile would lead from its probation.
    pub fn leads_tool(&self, tool: &str) -> bool {
        (self.leading.is_some() || self.memory.lead_from.is_some())
            && self.tool.as_deref() == Some(tool)
    }

    fn key(&self, k: &str) -> String {
        format!("{}{k}", prefix(&self.lease))
    }

    /// This node's candidacy, and whether supd answered; on any doubt, one that cannot
    /// lead.
    fn candidacy(&mut self) -> (Member, bool) {
        let req = json!({"cmd": "lease-candidacy", "lease": self.lease});
        match self.supd.call(req, self.ttl / 3) {
            Ok(c) => {
                self.tool = c["tool"].as_str().map(str::to_string);
                let m = Member {
                    node: self.name.clone(),
                    version: c["version"].as_str().map(str::to_string),
                    // supd answers `"tool": null` for a lease without a tool.
                    versioned: !c["tool"].is_null(),
                    committed: c["committed"] == true,
                    // An older supd does not answer it: no trial, as before.
                    trial: c["trial"] == true && c["committed"] != true,
                    irreversible: c["irreversible"] == true,
                    // An older supd does not answer it: healthy, as before.
                    healthy: c["healthy"] != false,
                    reason: c["reason"].as_str().map(str::to_string),
                    // An older supd does not answer it: not failing, as before.
                    failing: c["failing"].as_str().map(str::to_string),
                };
                (m, true)
            }
            Err(e) => {
                self.note(format!("candidacy: {e}"));
                let m = Member {
                    node: self.name.clone(),
                    version: None,
                    versioned: true,
                    committed: false,
                    trial: false,
                    irreversible: false,
                    healthy: true,
                    reason: None,
                    failing: None,
                };
                (m, false)
            }
        }
    }

    /// Says when this node becomes ineligible for its health, and when it recovers.
    fn say_health(&mut self, me: &Member) {
        let now = (!me.healthy).then(|| me.reason.clone().unwrap_or_default());
        match (&self.unhealthy, &now) {
            (None, Some(why)) => log::warn!(
                "{}: {} is not eligible to lead: {why}",
                self.lease,
                self.name
            ),
            (Some(_), None) => log::info!(
                "{}: {} is healthy again: eligible to lead",
                self.lease,
                self.name
            ),
            _ => {}
        }
        self.unhealthy = now;
    }

    /// Renews (or gets) this node's store lease and writes its member key. The renewal
    /// is dated from when the keepalive was sent: the store counts T from its arrival,
    /// later, however slow the store or the network.
    fn renew(&mut self, me: &Member) -> Result<(), StoreError> {
        if let Some(id) = self.my_lease {
            let sent = Boot::now();
            let alive = match self.store.keepalive(id) {
                Ok(alive) => alive,
                Err(e) => {
                    if stop_renewing(self.last_renewal, Boot::now(), self.ttl) {
                        let from = give_up_from(self.sent_until, Boot::now(), self.ttl);
                        log::warn!(
                            "{}: {} reads no answer to its keepalives for T/2: it stops renewing store lease {id} and gives it up in {}",
                            self.lease,
                            self.name,
                            Human(from.since(Boot::now()))
                        );
                        self.abandoned = Some((id, self.held, from));
                        self.my_lease = None;
                        self.last_renewal = None;
                        self.held = None;
                    }
                    return Err(e);
                }
            };
            if alive {
                self.last_renewal = Some(sent);
            } else {
                log::warn!(
                    "{}: store lease {id} is gone; getting a new one",
                    self.lease
                );
                self.my_lease = None;
                self.last_renewal = None;
            }
        }
        if self.my_lease.is_none() {
            let sent = Boot::now();
            self.my_lease = Some(self.store.grant(self.ttl)?);
            self.last_renewal = Some(sent);
        }
        let id = self.my_lease.unwrap_or(0);
        let value = serde_json::to_string(me).map_err(|e| StoreError(e.to_string()))?;
        self.store.put(
            &self.key(&format!("members/{}", self.name)),
            &value,
            id,
            None,
        )?;
        self.member_value = Some(value);
        Ok(())
    }

    /// One tick. The clock is read where it matters: before a keepalive is sent, and
    /// after the last store call that a decision rests on.
    pub fn tick(&mut self) {
        self.give_up_abandoned();
        let (me, answered) = self.candidacy();
        let (me, withheld) = self.trials.offer(me, answered);
        let withheld = withheld.then(|| me.version.clone().unwrap_or_default());
        if withheld.is_some() && withheld != self.withheld {
            log::warn!(
                "{}: {} waits in probation on {}, but its trial was had and lost: not eligible (restart sup-lease to offer it again, or roll it back)",
                self.lease,
                self.name,
                withheld.as_deref().unwrap_or("?")
            );
        }
        if answered {
            self.withheld = withheld;
        }
        let me = self
            .fails
            .offer(me, self.leading.is_some(), Boot::now(), self.ttl);
        self.say_health(&me);
        if let Err(e) = self.renew(&me) {
            // Unreachable store: nothing is renewed, the grant runs out by itself; the
            // next tick tries again.
            self.note(format!("store: {e}"));
            if self.leading.take().is_some() {
                log::warn!(
                    "{}: {} cannot renew its store lease: it stops renewing its leadership",
                    self.lease,
                    self.name
                );
            }
            return;
        }
        let (snap, seen) = match read(self.store.as_mut(), &self.lease) {
            Ok(s) => s,
            Err(e) => {
                // Unreachable store: nothing is renewed, the grant runs out by itself.
                self.note(format!("store: {e}"));
                return;
            }
        };
        let snap = self.look_at_store(snap, seen);
        self.seen_leader = snap.leader.as_ref().map_or(0, |(_, r, _)| *r);
        self.held = snap
            .leader
            .as_ref()
            .filter(|(l, _, id)| l.node == self.name && Some(*id) == self.my_lease)
            .map(|(_, r, _)| *r);
        if !answered && self.held.is_some() {
            self.supd_silent();
            return;
        }
        let holds = snap
            .leader
            .as_ref()
            .is_some_and(|(l, _, _)| l.node == self.name);
        if let Some(v) = self.trials.observe(&me, answered, holds) {
            log::warn!(
                "{}: {} lost leadership while on trial of {v}: that trial is not offered again",
                self.lease,
                self.name
            );
        }
        let decision = self.decide_on(&snap);
        self.act(decision, &snap, &me);
    }

    fn act(&mut self, d: Decision, snap: &Snapshot, me: &Member) {
        let mine = self.my_lease.unwrap_or(0);
        let record = Leader {
            node: self.name.clone(),
            version: me.version.clone(),
            epoch: snap.policy.epoch,
        };
        // The least term of a leadership this node writes: above every term it saw,
        // so that a wiped store's low revisions do not send the term back.
        let record = LeaderRecord {
            leader: record,
            min_term: self.durable.min_term(0),
        };
        let value = serde_json::to_string(&record).unwrap_or_default();
        let min_term = record.min_term;
        match d {
            Decision::Acquire => {
                match self
                    .store
                    .put(&self.key("leader"), &value, mine, Some(Cond::Absent))
                {
                    Ok(Some(rev)) => {
                        let now = Boot::now();
                        let before = self.memory.last_term;
                        self.acquired = Some((before, now));
                        let from = lead_from_after_acquire(
                            before,
                            snap.released,
                            self.ended(),
                            now,
                            self.ttl,
                        );
                        let when = if from <= now {
                            "its last holder is gone: it leads at once".to_string()
                        } else {
                            format!("it leads in {}", Human(from.since(now)))
                        };
                        log::info!(
                            "{}: {} takes the empty leader key (term {}); {}",
                            self.lease,
                            self.name,
                            term(rev, min_term),
                            when
                        );
                        // See `lead_from_after_acquire`: at once after a clean release
                        // of the term this node last saw, or after its holder's store
                        // lease expired; otherwise T (looked at again while it waits).
                        self.memory.lead_from = Some(from);
                        self.tick_again(me);
                    }
                    Ok(None) => self.note("another node took the leader key first".into()),
                    Err(e) => self.note(format!("store: {e}")),
                }
            }
            Decision::TakeOver { revision } => {
                let old = snap.leader.as_ref().map(|(l, _, id)| (l.node.clone(), *id));
                match self.store.put(
                    &self.key("leader"),
                    &value,
                    mine,
                    Some(Cond::ModRevision(revision)),
                ) {
                    Ok(Some(rev)) => {
                        if let Some((node, id)) = old {
                            log::warn!(
                                "{}: {} takes over from {node} (term {}); revoking its store lease and waiting T",
                                self.lease,
                                self.name,
                                term(rev, min_term)
                            );
                            if let Err(e) = self.store.revoke(id) {
                                log::warn!(
                                    "{}: cannot revoke {node}'s store lease: {e}",
                                    self.lease
                                );
                            }
                        }
                        // T from now, after the put and the revoke: the old holder's
                        // last grant rests on a keepalive sent before them, and ends
                        // with its kill grace before that keepalive's send plus T.
                        self.memory.lead_from = Some(Boot::now().plus(self.ttl));
                    }
                    Ok(None) => self.note("the leader key changed meanwhile".into()),
                    Err(e) => self.note(format!("store: {e}")),
                }
            }
            Decision::Lead { until, raise_floor } => {
                // A step-down that is no longer called for is dropped (supd forgets a
                // waiter whose client is gone); the grant starts the services again.
                if self.releasing.take().is_some() {
                    self.mark_releasing(false);
                }
                let term = snap.term().unwrap_or(0);
                // Remembered durably before supd hands it out.
                if term > self.durable.term {
                    self.durable.term = term;
                    self.save_memory();
                }
                // A `released` mark goes before this node's first grant: a candidate
                // that saw the released term and missed this one must not lead at once
                // by it if this node's key vanishes.
                if snap.released.is_some() {
                    if let Err(e) = self.store.delete(&self.key("released"), Cond::Lease(0)) {
                        self.note(format!(
                            "store: {e}; not leading before the released mark is gone"
                        ));
                        return;
                    }
                }
                let req =
                    grant_request(&self.lease, &self.name, term, until, self.ttl, Boot::now());
                let Some(req) = req else {
                    // Already over (a pause between the decision and here): nothing
                    // to grant; the next tick renews.
                    self.note("the grant ran out before it could be sent".into());
                    return;
                };
                self.sent_until = self.sent_until.max(Some(until));
                match self.supd.call(req, self.ttl / 3) {
                    Ok(_) => {
                        if self.leading != Some(term) {
                            let trial = match (me.trial, me.version.as_deref()) {
                                (true, Some(v)) => format!(", on trial of {v}"),
                                _ => String::new(),
                            };
                            log::info!("{}: {} leads (term {term}{trial})", self.lease, self.name);
                        }
                        self.leading = Some(term);
                        self.trials.led(me);
                        self.note(String::new());
                    }
                    Err(e) => self.note(format!("grant: {e}")),
                }
                if let Some(v) = raise_floor {
                    match write_policy(self.store.as_mut(), &self.lease, snap, |p| {
                        p.floor = Some(v.clone())
                    }) {
                        Ok(p) => log::warn!(
                            "{}: irreversible version {v} leads: the floor rises to it (epoch {})",
                            self.lease,
                            p.epoch
                        ),
                        Err(e) => self.note(e),
                    }
                }
            }
            Decision::StepDown(why) => {
                if self.releasing.is_none() {
                    log::info!("{}: {} steps down: {why}", self.lease, self.name);
                    // Its services stop and then no longer look failing: it stays out.
                    if let Some(f) = me.failing.as_deref() {
                        self.fails.stepped_down(f, Boot::now(), self.ttl);
                    }
                    // Said in the store, so that nobody takes over meanwhile; bound to
                    // this node's store lease, it goes with it.
                    self.mark_releasing(true);
                    // The services stop first; only then is the key given up.
                    match Release::start(&self.socket, &self.lease) {
                        Ok(r) => self.releasing = Some(r),
                        Err(e) => {
                            self.note(format!("release: {e}; keeping the key until it is done"))
                        }
                    }
                }
                if self.releasing.is_some() {
                    self.send_stopping(self.last_renewal);
                }
                self.finish_release();
            }
            Decision::Fence(why) => {
                if self.releasing.take().is_some() {
                    self.mark_releasing(false);
                }
                if self.leading.take().is_some() {
                    log::warn!(
                        "{}: {} stops renewing its leadership: {why}",
                        self.lease,
                        self.name
                    );
                }
            }
            Decision::Wait(left) => self.note(format!("took over; leading in {}", Human(left))),
            Decision::Follow(why) => {
                if self.leading.take().is_some() {
                    log::info!("{}: {} no longer leads", self.lease, self.name);
                }
                self.note(why);
            }
        }
    }

    /// While it steps down, the holder keeps its store lease and key renewed until the
    /// leader-only services exited; each renewal (`renewed`, when its keepalive was
    /// sent) is also sent to supd as a `stopping` grant, which moves the guards' end so
    /// that a slow stop is not cut at the last grant's end, and raises `sent_until` (the
    /// key is given up only after it, with the kill grace, when supd falls silent).
    fn send_stopping(&mut self, renewed: Option<Boot>) {
        let Some(until) = renewed.map(|r| r.plus(validity(self.ttl))) else {
            return;
        };
        let term = self.leading.or(self.held).unwrap_or(self.seen_leader);
        let Some(mut req) =
            grant_request(&self.lease, &self.name, term, until, self.ttl, Boot::now())
        else {
            return;
        };
        req["stopping"] = json!(true);
        self.sent_until = self.sent_until.max(Some(until));
        if let Err(e) = self.supd.call(req, self.ttl / 3) {
            self.note(format!("stopping grant: {e}"));
        }
    }

    /// Writes this node's last member record again, bound to store lease `id`; whether
    /// it was written.
    fn write_member_again(&mut self, id: LeaseId) -> bool {
        let Some(value) = self.member_value.clone() else {
            return false;
        };
        let key = self.key(&format!("members/{}", self.name));
        self.store.put(&key, &value, id, None).is_ok()
    }

    /// Says (or unsays) in the store that this holder is stepping down.
    fn mark_releasing(&mut self, on: bool) {
        let mine = self.my_lease.unwrap_or(0);
        let key = self.key("releasing");
        let result = if on {
            self.store.put(&key, &self.name, mine, None).map(|_| ())
        } else {
            self.store.delete(&key, Cond::Lease(mine)).map(|_| ())
        };
        if let Err(e) = result {
            self.note(format!("store: {e}"));
        }
    }

    /// Gives the key up once supd said the services exited (sup-lease calls it as soon
    /// as the answer can be read, besides each tick).
    pub fn finish_release(&mut self) {
        let Some(r) = self.releasing.as_mut() else {
            return;
        };
        match r.poll() {
            None => self.note("stepping down: waiting for the leader-only services to exit".into()),
            Some(Ok(())) => {
                self.releasing = None;
                self.leading = None;
                // The key's revision, which candidates remember and match the mark with
                // (not the term, min_term after a wipe).
                let revision = self.held.unwrap_or(self.seen_leader);
                let deleted = self.give_up(revision);
                self.mark_releasing(false);
                match deleted {
                    Ok(_) => log::info!(
                        "{}: {} stepped down: the services exited, the key is given up",
                        self.lease,
                        self.name
                    ),
                    Err(e) => self.note(format!("store: {e}")),
                }
            }
            Some(Err(e)) => {
                self.releasing = None;
                self.note(format!("release: {e}; trying again"));
            }
        }
    }

    /// A holder whose supd does not answer sends no grant; once the last one it sent,
    /// with its kill grace, is over (the guard has killed what was left, whatever supd
    /// does), it gives the key up, marked released so that a successor leads at once.
    /// It leads again only once supd answers (a candidacy it cannot read is not
    /// eligible).
    fn supd_silent(&mut self) {
        let from = give_up_from(self.sent_until, Boot::now(), self.ttl);
        let now = Boot::now();
        if now < from {
            self.note(format!(
                "supd does not answer: the key is given up in {} unless it does",
                Human(from.since(now))
            ));
            return;
        }
        let term = self.held.unwrap_or(self.seen_leader);
        match self.give_up(term) {
            Ok(_) => {
                log::warn!(
                    "{}: {} gives the key up: its supd takes no grant, and the last one is over",
                    self.lease,
                    self.name
                );
                self.leading = None;
                self.held = None;
                if self.releasing.take().is_some() {
                    self.mark_releasing(false);
                }
            }
            Err(e) => self.note(format!("store: {e}")),
        }
    }

    /// Gives up a store lease this node stopped renewing, once the last grant it sent
    /// and its kill grace are over: its key deleted (marked released: the runs are gone)
    /// and the lease revoked. Both may well arrive though their answers do not (a
    /// one-way partition): a successor leads at once. Tried at each tick until the
    /// store answers, or until the lease has surely run out by itself (T more).
    fn give_up_abandoned(&mut self) {
        let Some((id, term, from)) = self.abandoned else {
            return;
        };
        let now = Boot::now();
        if now < from {
            return;
        }
        let mut done = true;
        if let Some(term) = term {
            done &= self.delete_leader(id, term).is_ok();
        }
        done &= self.store.revoke(id).is_ok();
        if done || now >= from.plus(self.ttl) {
            log::info!(
                "{}: {} gave store lease {id} up{}",
                self.lease,
                self.name,
                if done {
                    ""
                } else {
                    " (no answer: it has run out by now)"
                }
            );
            self.abandoned = None;
        }
    }

    /// The last end of a holder's store lease the watch saw: its term, and when its
    /// holder's last write was seen.
    fn ended(&self) -> Option<(u64, Boot)> {
        let seen = self.seen.as_ref()?;
        seen.lock().unwrap_or_else(|e| e.into_inner()).ended
    }

    /// The connection of a step-down under way, whose answer (the services exited)
    /// sup-lease waits on beside its tick: the key is given up as soon as it comes.
    pub fn release_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.releasing
            .as_ref()
            .map(|r| std::os::fd::AsFd::as_fd(&r.conn))
    }

    /// Deletes `leader` (if it is still bound to this node's store lease) after a clean
    /// release of `term`, the key's revision (what candidates remember, not min_term):
    /// the leader-only runs have exited, which the `released` mark says in the same
    /// transaction, so that a successor leads at once.
    fn give_up(&mut self, term: u64) -> Result<bool, StoreError> {
        let mine = self.my_lease.unwrap_or(0);
        self.delete_leader(mine, term)
    }

    /// Deletes `leader` if bound to store lease `id`, with the `released` mark of `term`
    /// once this node's wait for an old holder's grant is over: while it waits (after a
    /// takeover, or after taking an empty key whose last holder is not known gone), that
    /// holder's runs may still live, and a successor that matched the mark would lead
    /// at once beside them. Without the mark it waits T from its taking of the key.
    fn delete_leader(&mut self, id: LeaseId, term: u64) -> Result<bool, StoreError> {
        let key = self.key("leader");
        if self.memory.lead_from.is_some_and(|f| f > Boot::now()) {
            return self.store.delete(&key, Cond::Lease(id));
        }
        self.store.delete_marking(
            &key,
            Cond::Lease(id),
            &self.key("released"),
            &released_mark(&self.name, term),
        )
    }

    /// After taking an empty key, lead in the same tick (its owner is proven next tick).
    fn tick_again(&mut self, me: &Member) {
        if let Ok(snap) = snapshot(self.store.as_mut(), &self.lease) {
            let d = self.decide_on(&snap);
            if matches!(d, Decision::Lead { .. }) {
                self.act(d, &snap, me);
            }
        }
    }

    /// Proves ownership of the leader key (a transaction) and applies the rule, with
    /// `now` read after that transaction.
    fn decide_on(&mut self, snap: &Snapshot) -> Decision {
        let owns = match (&snap.leader, self.my_lease) {
            (Some((l, _, id)), Some(mine)) if l.node == self.name && *id == mine => self
                .store
                .check(&self.key("leader"), Cond::Lease(mine))
                .unwrap_or(false),
            _ => false,
        };
        // Taken empty and waiting: evidence that the last holder is gone may have come
        // since (the watch saw its store lease end a moment after the key was taken).
        match (self.acquired, self.memory.lead_from) {
            (Some((before, at)), Some(from)) => {
                let sooner =
                    lead_from_after_acquire(before, snap.released, self.ended(), at, self.ttl);
                self.memory.lead_from = Some(from.min(sooner));
            }
            _ => self.acquired = None,
        }
        let leader = snap.leader.as_ref().map(|(l, r, _)| (l, *r));
        let now = Boot::now();
        let holder_releasing = snap
            .leader
            .as_ref()
            .is_some_and(|(l, _, _)| snap.releasing.as_deref() == Some(l.node.as_str()));
        let view = View {
            me: &self.name,
            members: &snap.members,
            leader,
            policy: &snap.policy,
            ttl: self.ttl,
            now,
            last_renewal: self.last_renewal,
            owns_leader: owns,
            holder_releasing,
        };
        let (decision, memory) = decide(&view, &self.memory);
        self.memory = memory;
        decision
    }

    /// Logs a note when it changes (no flood of the same line every tick).
    fn note(&mut self, s: String) {
        if s != self.last_note {
            if !s.is_empty() {
                log::info!("{}: {}", self.lease, s);
            }
            self.last_note = s;
        }
    }

    /// Leaving: release supd's services if leading (renewing the store lease while they
    /// stop, for up to 10 T), give up the key and the store lease.
    pub fn leave(&mut self) {
        let Some(mine) = self.my_lease else { return };
        if self.leading.is_some() || self.releasing.is_some() {
            if self.releasing.is_none() {
                self.mark_releasing(true);
                self.releasing = Release::start(&self.socket, &self.lease).ok();
            }
            let end = Boot::now().plus(self.ttl * 10);
            // The key's revision: what candidates match the released mark with.
            let term = self.held.unwrap_or(self.seen_leader);
            let mut exited = false;
            while let Some(r) = self.releasing.as_mut() {
                match r.poll() {
                    Some(done) => {
                        exited = done.is_ok();
                        break;
                    }
                    None if Boot::now() >= end => break,
                    None => {
                        let mut fds = [nix::poll::PollFd::new(
                            std::os::fd::AsFd::as_fd(&r.conn),
                            nix::poll::PollFlags::POLLIN,
                        )];
                        let wait =
                            nix::poll::PollTimeout::try_from((self.ttl / 3).as_millis() as i32)
                                .unwrap_or(nix::poll::PollTimeout::MAX);
                        let _ = nix::poll::poll(&mut fds, wait);
                        // The member key is written after the keepalive, as at each
                        // tick, before the stopping grant that rests on it: a watch that
                        // sees this store lease end (a revoke) dates the end by that
                        // write, and a successor leads only T after it.
                        let sent = Boot::now();
                        if matches!(self.store.keepalive(mine), Ok(true))
                            && self.write_member_again(mine)
                        {
                            self.send_stopping(Some(sent));
                        }
                    }
                }
            }
            self.releasing = None;
            if exited {
                let _ = self.give_up(term);
            } else {
                // Still stopping after 10 T: the guards end what is left at the last
                // stopping grant's end and kill grace; the key is kept (renewed) until
                // then, so that no successor runs beside it.
                let until = give_up_from(self.sent_until, Boot::now(), self.ttl);
                while Boot::now() < until {
                    let left = until.since(Boot::now()).min(self.ttl / 3);
                    let wait = nix::poll::PollTimeout::try_from(left.as_millis() as i32)
                        .unwrap_or(nix::poll::PollTimeout::MAX);
                    let _ = nix::poll::poll(&mut [], wait); // waits out the guards' end
                    let _ = self.store.keepalive(mine);
                }
                let _ = self.store.delete(&self.key("leader"), Cond::Lease(mine));
            }
            self.mark_releasing(false);
        }
        let _ = self.store.revoke(mine);
    }
}

#[cfg(test)]
mod tests;
