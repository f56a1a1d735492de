//! One node following its fleet's target: every tick (T/3), renew the store lease, ask
//! supd how the tool stands here, read the fleet's keys, apply the rule, publish the
//! status when it changed, and carry out the rule's action (in the store, in supd, or by
//! starting a fetch).
//!
//! A fetch (download, sha256, unpack, `install`) can take minutes: it runs in a child
//! process (`sup-lease fleet fetch ...`), looked at every tick, so that the ticks (and a
//! lease campaign in the same process) go on meanwhile.

pub use super::fetch::{
    fetch_backoff, parent_gone, parse_progress, progress_line, FetchConfig, PARENT_ENV,
};
use super::fetch::{Failure, Job};
use super::record::{prefix, Halt, Mark, Phase, Slot, Status, Target, Transfer};
use super::rule::{decide, Action, Fetch, Installed, Local, LocalPhase, Peer, View};
use crate::lease::node::{Supd, SupdError};
use crate::lease::store::{Cond, LeaseId, Store, StoreError};
use crate::protocol::ErrorKind;
use crate::time::{Boot, Human};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

/// What the fleet's keys hold, read in one range.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub target: Target,
    /// The target key's last write (0: none yet), for compare-and-swap.
    pub target_revision: u64,
    /// The roster in join order.
    pub peers: Vec<Peer>,
    /// The slots held, with their revisions.
    pub slots: Vec<(u32, Slot, u64)>,
    /// Slot keys whose value cannot be read (index, revision): free to take.
    pub unreadable_slots: Vec<(u32, u64)>,
}

/// Reads every key of the fleet of `tool`. Undecodable values are skipped and said.
pub fn snapshot(store: &mut dyn Store, tool: &str) -> Result<Snapshot, StoreError> {
    let p = prefix(tool);
    let mut s = Snapshot::default();
    let mut roster: Vec<(u64, Peer)> = Vec::new();
    let mut live: BTreeMap<String, Status> = BTreeMap::new();
    for kv in store.range(&p)? {
        let name = &kv.key[p.len()..];
        let bad = |e: serde_json::Error| {
            log::warn!("{}: cannot read its value ({e}); ignoring it", kv.key)
        };
        if name == "target" {
            // An unreadable target is no target, but its revision is kept: an operator's
            // `fleet set` overwrites it (by compare-and-swap, as any other).
            s.target_revision = kv.mod_revision;
            match serde_json::from_str(&kv.value) {
                Ok(t) => s.target = t,
                Err(e) => bad(e),
            }
        } else if let Some(node) = name.strip_prefix("roster/") {
            let last = serde_json::from_str(&kv.value).ok();
            let peer = Peer {
                node: node.to_string(),
                live: None,
                last,
            };
            roster.push((kv.create_revision, peer));
        } else if let Some(node) = name.strip_prefix("nodes/") {
            match serde_json::from_str(&kv.value) {
                Ok(st) => {
                    live.insert(node.to_string(), st);
                }
                Err(e) => bad(e),
            }
        } else if let Some(i) = name.strip_prefix("slots/") {
            match (i.parse(), serde_json::from_str(&kv.value)) {
                (Ok(i), Ok(slot)) => s.slots.push((i, slot, kv.mod_revision)),
                // Nobody holds an unreadable slot: it is free, and taken over by
                // compare-and-swap on its revision.
                (Ok(i), Err(e)) => {
                    bad(e);
                    s.unreadable_slots.push((i, kv.mod_revision));
                }
                (Err(_), _) => log::warn!("{}: not a slot number; ignoring it", kv.key),
            }
        }
    }
    roster.sort_by_key(|(rev, _)| *rev);
    s.peers = roster.into_iter().map(|(_, p)| p).collect();
    for (node, st) in live {
        match s.peers.iter_mut().find(|p| p.node == node) {
            Some(p) => p.live = Some(st),
            // Live but not in the roster yet (it joins at its next tick): last in order.
            None => s.peers.push(Peer {
                node,
                last: None,
                live: Some(st),
            }),
        }
    }
    Ok(s)
}

/// Writes a new target if nobody wrote it since `snap` was read (and, when `expect` is
/// given, if its epoch is still that one); the epoch goes up.
pub fn write_target(
    store: &mut dyn Store,
    tool: &str,
    snap: &Snapshot,
    expect: Option<u64>,
    change: impl FnOnce(&mut Target) -> Result<(), String>,
) -> Result<Target, String> {
    if let Some(e) = expect.filter(|e| *e != snap.target.epoch) {
        return Err(format!(
            "the target of {tool} is at epoch {}, not {e}: it changed since you read it; \
             look again (`fleet status {tool}`) and retry",
            snap.target.epoch
        ));
    }
    let mut t = snap.target.clone();
    change(&mut t)?;
    t.epoch = snap.target.epoch + 1;
    let cond = match snap.target_revision {
        0 => Cond::Absent,
        r => Cond::ModRevision(r),
    };
    let value = serde_json::to_string(&t).map_err(|e| e.to_string())?;
    match store.put(&format!("{}target", prefix(tool)), &value, 0, Some(cond)) {
        Ok(Some(_)) => Ok(t),
        Ok(None) => Err(format!(
            "the target of {tool} was changed by another writer since epoch {}; \
             look again (`fleet status {tool}`) and retry",
            snap.target.epoch
        )),
        Err(e) => Err(format!("cannot write the target of {tool}: {e}")),
    }
}

/// Now on the wall clock, for people.
pub fn stamp() -> String {
    crate::time::utc_stamp(SystemTime::now())
}

/// One node of a fleet.
pub struct FleetNode {
    pub tool: String,
    pub name: String,
    pub ttl: Duration,
    store: Box<dyn Store>,
    supd: Supd,
    fetch: FetchConfig,
    my_lease: Option<LeaseId>,
    /// The status last written to `nodes/NODE`, and to `roster/NODE`.
    published: Option<Status>,
    in_roster: Option<Status>,
    job: Option<Job>,
    failure: Option<Failure>,
    last_note: String,
    /// The progress last put in the status, and when: it is written at most once per T.
    shown_progress: Option<(Transfer, Boot)>,
    /// Since when (this node's CLOCK_BOOTTIME) each node gone in probation has been seen
    /// gone (see `rule::gone`).
    gone_since: BTreeMap<String, Boot>,
}

impl FleetNode {
    pub fn new(
        tool: String,
        name: String,
        ttl: Duration,
        store: Box<dyn Store>,
        fetch: FetchConfig,
    ) -> FleetNode {
        FleetNode {
            supd: Supd::new(fetch.socket.clone()),
            tool,
            name,
            ttl,
            store,
            fetch,
            my_lease: None,
            published: None,
            in_roster: None,
            job: None,
            failure: None,
            last_note: String::new(),
            shown_progress: None,
            gone_since: BTreeMap::new(),
        }
    }

    fn key(&self, k: &str) -> String {
        format!("{}{k}", prefix(&self.tool))
    }

    /// One tick; `leader`: this node leads a lease of this tool.
    pub fn tick(&mut self, leader: bool) {
        if let Err(e) = self.renew() {
            self.note(format!("store: {e}"));
            return;
        }
        self.reap_fetch();
        // A store write done, the rule looks again at once (at most a few times).
        for _ in 0..4 {
            match self.round(leader) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    self.note(e);
                    break;
                }
            }
        }
    }

    /// Renews (or gets) this node's store lease.
    fn renew(&mut self) -> Result<(), StoreError> {
        if let Some(id) = self.my_lease {
            if !self.store.keepalive(id)? {
                log::warn!(
                    "fleet {}: store lease {id} is gone; getting a new one",
                    self.tool
                );
                self.my_lease = None;
                // The status went with it.
                self.published = None;
            }
        }
        if self.my_lease.is_none() {
            self.my_lease = Some(self.store.grant(self.ttl)?);
        }
        Ok(())
    }

    /// Reads, decides, publishes, acts; whether the store changed (look again).
    fn round(&mut self, leader: bool) -> Result<bool, String> {
        let snap = snapshot(self.store.as_mut(), &self.tool).map_err(|e| format!("store: {e}"))?;
        let local = match self.local() {
            Ok(l) => l,
            Err(e) => {
                self.publish_unreachable(&e, &snap);
                return Err(format!("supd: {e}"));
            }
        };
        if let Some(job) = &mut self.job {
            if snap.target.version.as_deref() != Some(job.version.as_str()) || snap.target.blocked()
            {
                log::info!(
                    "fleet {}: the target moved on: the fetch of {} is stopped",
                    self.tool,
                    job.version
                );
                let _ = job.child.kill();
                let _ = job.child.wait();
                self.job = None;
            }
        }
        let fetch = self.fetch_state(&snap.target);
        let slots: Vec<(u32, Slot)> = snap.slots.iter().map(|(i, s, _)| (*i, s.clone())).collect();
        let gone = self.watch_gone(&snap.peers, &slots);
        let d = decide(&View {
            me: &self.name,
            tool: &self.tool,
            target: &snap.target,
            local: &local,
            peers: &snap.peers,
            slots: &slots,
            leader,
            fetch: &fetch,
            gone: &gone,
        });
        // What was left of the probation when the status first said it, kept while it
        // lasts (a status that changes every round would be written every round).
        let probation_left_ms = match d.phase {
            Phase::Probation => self
                .published
                .as_ref()
                .filter(|p| p.phase == Phase::Probation)
                .and_then(|p| p.probation_left_ms)
                .or(local.left.map(|d| d.as_millis() as u64)),
            _ => None,
        };
        let mut reason = d.reason.clone();
        if let (Fetch::Running, Some(f)) = (&fetch, &self.failure) {
            // Tried again: the last attempt's reason stays in view meanwhile.
            reason = Some(format!("trying again; the last attempt: {}", f.reason));
        }
        let status = Status {
            node: self.name.clone(),
            running: local.current.clone(),
            proposed: local.proposed.clone(),
            phase: d.phase,
            result: d.result.clone().or_else(|| last_result(&local)),
            reason,
            at: String::new(),
            epoch: snap.target.epoch,
            irreversible: local
                .current
                .as_ref()
                .and_then(|c| local.installed.get(c))
                .is_some_and(|i| i.irreversible),
            leader,
            progress: match d.phase {
                Phase::Downloading => self.progress_to_show(),
                _ => None,
            },
            probation_left_ms,
            gone,
        };
        self.publish(status, &snap)
            .map_err(|e| format!("store: {e}"))?;
        self.act(d.action, &snap)
    }

    /// Looks at the nodes gone in probation: since when each has been seen gone, and
    /// those gone longer than their limit (`rule::gone`).
    fn watch_gone(&mut self, peers: &[Peer], slots: &[(u32, Slot)]) -> BTreeMap<String, u64> {
        let now = Boot::now();
        let gone: Vec<&Peer> = peers
            .iter()
            .filter(|p| super::rule::gone_in_probation(p, slots))
            .collect();
        self.gone_since
            .retain(|n, _| gone.iter().any(|p| p.node == *n));
        for p in &gone {
            self.gone_since.entry(p.node.clone()).or_insert(now);
        }
        let watched: BTreeMap<String, Duration> = self
            .gone_since
            .iter()
            .map(|(n, since)| (n.clone(), now.since(*since)))
            .collect();
        super::rule::gone(peers, slots, &watched, self.ttl)
    }

    /// The fetch's progress as the status shows it: the first said at once, then at most
    /// once per T (each change is a write to the store).
    fn progress_to_show(&mut self) -> Option<Transfer> {
        let now_said = self.job.as_ref().and_then(|j| j.progress)?;
        let show = match self.shown_progress {
            Some((shown, at)) if shown != now_said && Boot::now().since(at) < self.ttl => shown,
            Some((shown, _)) if shown == now_said => shown,
            _ => {
                self.shown_progress = Some((now_said, Boot::now()));
                now_said
            }
        };
        Some(show)
    }

    /// Whether supd says `version` is current here now (false when it cannot be asked).
    fn is_current(&mut self, version: &str) -> bool {
        self.local()
            .is_ok_and(|l| l.current.as_deref() == Some(version))
    }

    /// supd's view of the tool here.
    fn local(&mut self) -> Result<Local, String> {
        let v = self
            .supd
            .call(json!({"cmd": "versions", "tool": self.tool}), self.ttl / 3)?;
        Ok(local_from(&v))
    }

    fn fetch_state(&self, target: &Target) -> Fetch {
        if self.job.is_some() {
            return Fetch::Running;
        }
        match &self.failure {
            Some(f) if target.version.as_deref() == Some(f.version.as_str()) => Fetch::Failed {
                reason: f.reason.clone(),
                retry: Boot::now() >= f.retry_at,
            },
            _ => Fetch::Idle,
        }
    }

    /// Writes the status when it changed: in `nodes/NODE` (bound to the store lease) and
    /// in the roster (made the first time: the node's place in the order).
    fn publish(&mut self, mut status: Status, snap: &Snapshot) -> Result<(), StoreError> {
        let before = self.published.as_ref().or(self.in_roster.as_ref());
        let changed = |b: &Status| b.phase != status.phase || b.result != status.result;
        status.at = match before {
            Some(b) if !changed(b) => b.at.clone(),
            _ => stamp(),
        };
        let value = serde_json::to_string(&status).map_err(|e| StoreError(e.to_string()))?;
        // What the store holds as this node's status (gone, or overwritten by hand, it is
        // written again).
        let stored = snap
            .peers
            .iter()
            .find(|p| p.node == self.name)
            .and_then(|p| p.live.as_ref());
        if self.published.as_ref() != Some(&status) || stored != Some(&status) {
            let mine = self.my_lease.unwrap_or(0);
            self.store.put(
                &self.key(&format!("nodes/{}", self.name)),
                &value,
                mine,
                None,
            )?;
            if self
                .published
                .as_ref()
                .is_none_or(|p| p.phase != status.phase || p.reason != status.reason)
            {
                log::info!(
                    "fleet {}: {} {}{}",
                    self.tool,
                    self.name,
                    status.phase.as_str(),
                    status
                        .reason
                        .as_deref()
                        .map(|r| format!(": {r}"))
                        .unwrap_or_default()
                );
            }
            self.published = Some(status.clone());
        }
        let joined = snap
            .peers
            .iter()
            .any(|p| p.node == self.name && p.last.is_some());
        if !joined || self.in_roster.as_ref() != Some(&status) {
            let cond = (!joined).then_some(Cond::Absent);
            self.store
                .put(&self.key(&format!("roster/{}", self.name)), &value, 0, cond)?;
            self.in_roster = Some(status);
        }
        Ok(())
    }

    /// When supd cannot be reached, the status says so, idle at the target's epoch (the
    /// roll passes this node over until it answers again).
    fn publish_unreachable(&mut self, e: &str, snap: &Snapshot) {
        let mut s = self.published.clone().unwrap_or_else(|| Status {
            node: self.name.clone(),
            ..Status::default()
        });
        s.phase = Phase::Idle;
        s.reason = Some(format!("cannot reach supd: {e}"));
        s.epoch = snap.target.epoch;
        if let Err(e) = self.publish(s, snap) {
            self.note(format!("store: {e}"));
        }
    }

    /// Carries out the rule's action; whether the store or supd changed.
    fn act(&mut self, action: Action, snap: &Snapshot) -> Result<bool, String> {
        match action {
            Action::Nothing => Ok(false),
            Action::Fetch(version) => {
                self.start_fetch(&snap.target, &version);
                Ok(false)
            }
            Action::TakeSlot {
                index,
                attempts_before,
            } => {
                let Some(version) = snap.target.version.clone() else {
                    return Ok(false);
                };
                let slot = Slot {
                    node: self.name.clone(),
                    version,
                    attempts_before,
                };
                let value = serde_json::to_string(&slot).map_err(|e| e.to_string())?;
                let key = self.key(&format!("slots/{index}"));
                // Taken only while the target is as read (a halt written meanwhile wins)
                // and every slot too: the rule counted them (the canary's count, the free
                // ones), and a node that read them before another's take or give-back
                // must not take one more than the roll allows.
                let held = snap.slots.iter().map(|(i, _, rev)| (*i, *rev));
                let held: Vec<(u32, u64)> = held.chain(snap.unreadable_slots.clone()).collect();
                let top = held
                    .iter()
                    .map(|(i, _)| i + 1)
                    .chain([snap.target.max_parallel, index + 1])
                    .max()
                    .unwrap_or(1);
                let mut conds: Vec<(String, Cond)> = (0..top)
                    .map(|i| {
                        let cond = match held.iter().find(|(j, _)| *j == i) {
                            Some((_, rev)) => Cond::ModRevision(*rev),
                            None => Cond::Absent,
                        };
                        (self.key(&format!("slots/{i}")), cond)
                    })
                    .collect();
                conds.push((self.key("target"), Cond::ModRevision(snap.target_revision)));
                let conds: Vec<(&str, Cond)> =
                    conds.iter().map(|(k, c)| (k.as_str(), *c)).collect();
                match self.store.put_when(&key, &value, 0, &conds) {
                    Ok(Some(_)) => {
                        log::info!(
                            "fleet {}: {} takes slot {index} for {}",
                            self.tool,
                            self.name,
                            slot.version
                        );
                        Ok(true)
                    }
                    Ok(None) => Ok(false),
                    Err(e) => Err(format!("store: {e}")),
                }
            }
            Action::Upgrade {
                version,
                force,
                irreversible,
            } => {
                let req = json!({"cmd": "upgrade", "tool": self.tool, "version": version,
                                 "force": force, "irreversible": irreversible});
                log::info!(
                    "fleet {}: {} upgrades to {version}{}",
                    self.tool,
                    self.name,
                    if force { " (forced)" } else { "" }
                );
                match self.supd.call_typed(req, self.ttl / 3) {
                    Ok(_) => Ok(true),
                    // The version is current here already (made so meanwhile: by hand, a
                    // self-switch, an answer that did not come back in time): nothing was
                    // refused; the next round reads supd's record again.
                    Err(e) if is_refusal(&e) && self.is_current(&version) => Err(format!(
                        "upgrade to {version}: {e}; it is current here already"
                    )),
                    Err(e) if is_refusal(&e) => {
                        // supd refused the version (it cannot run here, say): the roll
                        // stops as for a rollback, and the slot is given back.
                        let reason = format!("supd refused the upgrade: {e}");
                        let halt = Action::Halt {
                            version,
                            reason,
                            bad: true,
                        };
                        self.act(halt, snap)?;
                        self.give_back(snap)?;
                        Ok(true)
                    }
                    // Not answered (supd restarting, slow): the slot is kept, and the next
                    // round sees whether the upgrade was made.
                    Err(e) => Err(format!("upgrade to {version}: {e}")),
                }
            }
            Action::Release(index) => {
                let Some((_, _, rev)) = snap.slots.iter().find(|(i, _, _)| *i == index) else {
                    return Ok(false);
                };
                let key = self.key(&format!("slots/{index}"));
                match self.store.delete(&key, Cond::ModRevision(*rev)) {
                    Ok(done) => {
                        if done {
                            log::info!(
                                "fleet {}: {} gives slot {index} back",
                                self.tool,
                                self.name
                            );
                        }
                        Ok(done)
                    }
                    Err(e) => Err(format!("store: {e}")),
                }
            }
            Action::Halt {
                version,
                reason,
                bad,
            } => {
                let me = self.name.clone();
                let at = stamp();
                let written = write_target(self.store.as_mut(), &self.tool, snap, None, |t| {
                    if bad {
                        t.bad.insert(
                            version.clone(),
                            Mark {
                                node: me.clone(),
                                reason: reason.clone(),
                                at: at.clone(),
                            },
                        );
                    }
                    if t.version.as_deref() == Some(version.as_str()) && t.halted.is_none() {
                        t.halted = Some(Halt {
                            version: version.clone(),
                            node: Some(me.clone()),
                            reason: reason.clone(),
                            at: at.clone(),
                        });
                    }
                    Ok(())
                });
                match written {
                    Ok(t) => {
                        log::warn!(
                            "fleet {}: {me} halts the roll of {version} (epoch {}): {reason}",
                            self.tool,
                            t.epoch
                        );
                        Ok(true)
                    }
                    // Somebody wrote the target meanwhile: read it again next round.
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Gives back any slot this node holds (after a refused upgrade).
    fn give_back(&mut self, snap: &Snapshot) -> Result<(), String> {
        for (i, s, rev) in &snap.slots {
            if s.node == self.name {
                let key = self.key(&format!("slots/{i}"));
                self.store
                    .delete(&key, Cond::ModRevision(*rev))
                    .map_err(|e| format!("store: {e}"))?;
            }
        }
        Ok(())
    }

    fn start_fetch(&mut self, target: &Target, version: &str) {
        let f = &self.fetch;
        let mut cmd = Command::new(&f.program);
        cmd.arg("fleet")
            .arg("fetch")
            .arg(&self.tool)
            .arg(version)
            .arg("--url")
            .arg(&target.url)
            .arg("--sha256")
            .arg(&target.sha256)
            .arg("--staging")
            .arg(&f.staging)
            .arg("--socket")
            .arg(&f.socket)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // The fetch ends with this process (see `parent_gone`): a sup-lease killed
            // and started again must not meet its last fetch still writing the staging
            // dir, or installing behind its back.
            .env(PARENT_ENV, std::process::id().to_string());
        if let Some(ca) = &f.ca_file {
            cmd.arg("--ca-file").arg(ca);
        }
        log::info!(
            "fleet {}: {} fetches {version} from {}",
            self.tool,
            self.name,
            target.url
        );
        match cmd.spawn() {
            Ok(child) => {
                // Its progress lines are read every tick: a read must not wait for one.
                if let Some(out) = &child.stdout {
                    use std::os::fd::AsFd;
                    let nonblocking = nix::fcntl::fcntl(
                        out.as_fd(),
                        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
                    );
                    if let Err(e) = nonblocking {
                        log::warn!("fleet {}: the fetch's output may block: {e}", self.tool);
                    }
                }
                self.shown_progress = None;
                self.job = Some(Job {
                    child,
                    version: version.to_string(),
                    said: String::new(),
                    partial: Vec::new(),
                    progress: None,
                })
            }
            Err(e) => {
                self.failed_fetch(version, format!("cannot run {}: {e}", f.program.display()))
            }
        }
    }

    /// Looks at the fetch under way: done, failed (said, and retried after a backoff), or
    /// still running.
    fn reap_fetch(&mut self) {
        let Some(job) = &mut self.job else { return };
        job.drain();
        match job.child.try_wait() {
            Ok(None) => {}
            Ok(Some(status)) => {
                job.drain();
                let said = job.said();
                let version = job.version.clone();
                self.job = None;
                if status.success() {
                    log::info!("fleet {}: {} installed {version}", self.tool, self.name);
                    self.failure = None;
                } else {
                    let why = match said.trim() {
                        "" => format!("the fetch ended with {status}"),
                        s => s.to_string(),
                    };
                    self.failed_fetch(&version, why);
                }
            }
            Err(e) => {
                let version = job.version.clone();
                self.job = None;
                self.failed_fetch(&version, format!("cannot wait for the fetch: {e}"));
            }
        }
    }

    fn failed_fetch(&mut self, version: &str, reason: String) {
        let count = match &self.failure {
            Some(f) if f.version == version => f.count + 1,
            _ => 1,
        };
        let wait = fetch_backoff(count);
        log::warn!(
            "fleet {}: fetching {version} failed (attempt {count}; next in {}): {reason}",
            self.tool,
            Human(wait)
        );
        self.failure = Some(Failure {
            version: version.to_string(),
            reason: format!("{reason} (attempt {count}, next in {})", Human(wait)),
            count,
            retry_at: Boot::now().plus(wait),
        });
    }

    /// Logs a note when it changes.
    fn note(&mut self, s: String) {
        if s != self.last_note {
            if !s.is_empty() {
                log::info!("fleet {}: {s}", self.tool);
            }
            self.last_note = s;
        }
    }

    /// Leaving: a fetch under way is stopped, the store lease (and the status) given up.
    pub fn leave(&mut self) {
        if let Some(mut job) = self.job.take() {
            let _ = job.child.kill();
            let _ = job.child.wait();
        }
        if let Some(id) = self.my_lease.take() {
            let _ = self.store.revoke(id);
        }
    }
}

/// The last upgrade's result as supd has it ("0.9.0 rolled back"), when the rule says
/// none of its own.
fn last_result(l: &Local) -> Option<String> {
    let v = l.proposed.as_deref()?;
    let how = match l.phase {
        LocalPhase::Committed => "committed",
        LocalPhase::RolledBack => "rolled back",
        LocalPhase::Failed => "failed",
        LocalPhase::Probation | LocalPhase::Idle => return None,
    };
    Some(format!("{v} {how}"))
}

/// Whether supd's error answer refuses the request (rather than the request not
/// reaching it, or its answer not coming back), read from its stable error kind alone,
/// never from its wording. supd's refusals for the moment (kind `busy`: another upgrade
/// in probation, a record write it retries) are not: the next round looks again. (A
/// refusal because the version is current already is told apart by supd's record, not
/// by the answer: `FleetNode::is_current`.)
fn is_refusal(e: &SupdError) -> bool {
    let SupdError::Refused {
        kind: Some(kind), ..
    } = e
    else {
        // Not there, or a kind this build does not know: nothing to decide on.
        return false;
    };
    match kind {
        ErrorKind::Failed
        | ErrorKind::UnknownTool
        | ErrorKind::PermissionDenied
        | ErrorKind::BadRequest => true,
        ErrorKind::Busy
        | ErrorKind::UnknownCommand
        | ErrorKind::UnknownService
        | ErrorKind::InvalidConfig
        | ErrorKind::UnknownLease => false,
    }
}

/// supd's `versions` data as the rule reads it.
pub fn local_from(v: &Value) -> Local {
    let s = |v: &Value| v.as_str().map(str::to_string);
    let installed = v["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let name = e["version"].as_str()?.to_string();
            let bad = (e["bad"] == true)
                .then(|| s(&e["bad_reason"]).unwrap_or_else(|| "marked bad".into()));
            Some((
                name,
                Installed {
                    bad,
                    irreversible: e["irreversible"] == true,
                    attempts: e["attempts"].as_u64().unwrap_or(0) as u32,
                },
            ))
        })
        .collect();
    let ms = |k: &str| v[k].as_u64().map(Duration::from_millis);
    Local {
        left: ms("probation_left_ms").or_else(|| ms("window_in_ms")),
        current: s(&v["current"]),
        phase: LocalPhase::parse(v["phase"].as_str().unwrap_or("idle")),
        proposed: s(&v["proposed"]),
        reason: s(&v["reason"]),
        installed,
        watching: v["window_in_ms"].is_u64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::admin::{self, SetArgs};

    fn refused(kind: &str, message: &str) -> SupdError {
        SupdError::Refused {
            kind: ErrorKind::from_name(kind),
            name: kind.into(),
            message: message.into(),
        }
    }

    /// The kind decides, whatever the words: a busy refusal never halts the roll, a
    /// failed one does even when worded as one for now used to be.
    #[test]
    fn a_refusal_is_read_from_its_kind_not_its_words() {
        assert!(is_refusal(&refused(
            "failed",
            "version 2.0.0 of agent cannot run: bin/agent is not executable"
        )));
        assert!(is_refusal(&refused("unknown-tool", "no tool agent")));
        assert!(is_refusal(&refused("failed", "is in probation; wait")));
        for e in [
            refused(
                "busy",
                "the upgrade of agent to 1.5.0 is in probation; wait for it to commit or roll back",
            ),
            refused("busy", "cannot run"),
            SupdError::Unreachable("no answer within 333ms".into()),
        ] {
            assert!(!is_refusal(&e), "{e}");
        }
    }

    #[test]
    fn progress_lines_are_read_back() {
        for t in [
            Transfer {
                bytes: 5,
                total: Some(1_000_000),
            },
            Transfer {
                bytes: 0,
                total: None,
            },
        ] {
            let line = progress_line(t.bytes, t.total);
            assert!(line.ends_with('\n'));
            assert_eq!(parse_progress(line.trim_end()), Some(t));
        }
        for not in [
            "progress",
            "progress x 3",
            "download of a too slow: 3 bytes in 5 s",
        ] {
            assert_eq!(parse_progress(not), None, "{not}");
        }
    }

    use crate::lease::file::FileStore;

    fn node(store: &std::path::Path) -> FleetNode {
        let dir = store.with_extension("d");
        FleetNode::new(
            "agent".into(),
            "n1".into(),
            Duration::from_secs(3),
            Box::new(FileStore::new(store.to_path_buf())),
            FetchConfig {
                program: "/nonexistent".into(),
                staging: dir.join("staging"),
                ca_file: None,
                socket: dir.join("sup.sock"),
            },
        )
    }

    fn args(v: &str) -> SetArgs {
        SetArgs {
            version: v.into(),
            url: "http://127.0.0.1:1/a.tar.gz".into(),
            sha256: "ab".repeat(32),
            ..SetArgs::default()
        }
    }

    /// A slot is taken only while the target is as the node read it: a halt, or a new
    /// target, written between the read and the take wins, and no slot is taken.
    #[test]
    fn a_slot_is_not_taken_when_the_target_changed_since_it_was_read() {
        let dir = crate::scratch::Scratch::new("fleet-take");
        let path = dir.join("store.json");
        let mut s = FileStore::new(path.clone());
        admin::set(&mut s, "agent", &args("2.0.0"), None).expect("set");
        let mut n = node(&path);
        let take = Action::TakeSlot {
            index: 0,
            attempts_before: 0,
        };
        let slot = |s: &mut FileStore| {
            snapshot(s, "agent")
                .expect("read")
                .slots
                .iter()
                .map(|(i, sl, _)| (*i, sl.node.clone(), sl.version.clone()))
                .collect::<Vec<_>>()
        };
        for change in ["halt", "set"] {
            let read = snapshot(&mut s, "agent").expect("read");
            match change {
                "halt" => admin::halt(&mut s, "agent", None).map(|_| ()),
                _ => admin::set(&mut s, "agent", &args("3.0.0"), None).map(|_| ()),
            }
            .expect("operator's write");
            assert_eq!(n.act(take.clone(), &read), Ok(false), "{change}");
            assert_eq!(slot(&mut s), vec![], "no slot taken after a {change}");
        }
        // As read: taken.
        let read = snapshot(&mut s, "agent").expect("read");
        assert_eq!(n.act(take.clone(), &read), Ok(true));
        assert_eq!(slot(&mut s), vec![(0, "n1".into(), "3.0.0".into())]);
        // Read while n2 held slot 1; n2 gave it back since: the take of slot 2 (free by
        // that read) is refused, the next read sees slot 1 free.
        s.put(
            "/sup/fleet/agent/slots/1",
            r#"{"node":"n2","version":"3.0.0"}"#,
            0,
            None,
        )
        .expect("put");
        let read = snapshot(&mut s, "agent").expect("read");
        let rev = read
            .slots
            .iter()
            .find(|(i, _, _)| *i == 1)
            .expect("slot 1")
            .2;
        s.delete("/sup/fleet/agent/slots/1", Cond::ModRevision(rev))
            .expect("give back");
        let two = Action::TakeSlot {
            index: 2,
            attempts_before: 0,
        };
        assert_eq!(n.act(two, &read), Ok(false), "slot 1 changed since read");
        assert_eq!(slot(&mut s).len(), 1);
        // An unreadable slot is nobody's: taken over (by compare-and-swap).
        let index = Action::TakeSlot {
            index: 1,
            attempts_before: 0,
        };
        s.put("/sup/fleet/agent/slots/1", "garbage", 0, None)
            .expect("put");
        let read = snapshot(&mut s, "agent").expect("read");
        assert_eq!(read.unreadable_slots.len(), 1);
        assert_eq!(n.act(index, &read), Ok(true));
        assert_eq!(slot(&mut s).len(), 2);
    }
}
