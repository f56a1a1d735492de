//! The rule of a roll, for one node: from what the store holds (the target, the nodes'
//! statuses, the slots) and what supd says of the tool here, this node's status and the
//! one thing it does next. Plain data in, plain data out; no store, no supd, no clock.
//!
//! The order of a roll: the nodes in the order they first joined (their roster keys'
//! create revisions), those that lead a lease of this tool last, so that leadership has
//! somewhere to go (a committed node of the new version) before its holder upgrades. The
//! first `canary` nodes go first; the rest wait until that many committed. At most
//! `max_parallel` nodes hold a slot, and only a slot's holder upgrades. A node that is
//! gone, or whose download failed, is passed over; one still downloading keeps its place.

use super::record::{Phase, Slot, Status, Target};
use std::collections::BTreeMap;
use std::time::Duration;

/// The result a node shows while its fetches fail.
pub const DOWNLOAD_FAILED: &str = "download failed";

/// supd's upgrade phase of the tool on this node (`versions TOOL`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LocalPhase {
    #[default]
    Idle,
    Probation,
    Committed,
    RolledBack,
    Failed,
}

impl LocalPhase {
    pub fn parse(s: &str) -> LocalPhase {
        match s {
            "probation" => LocalPhase::Probation,
            "committed" => LocalPhase::Committed,
            "rolled-back" => LocalPhase::RolledBack,
            "failed" => LocalPhase::Failed,
            _ => LocalPhase::Idle,
        }
    }
}

/// One installed version, as supd marks it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Installed {
    /// Marked bad, and why.
    pub bad: Option<String>,
    pub irreversible: bool,
    /// Upgrades to it tried so far.
    pub attempts: u32,
}

/// What supd says of the tool on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Local {
    pub current: Option<String>,
    pub phase: LocalPhase,
    pub proposed: Option<String>,
    /// Why the last upgrade ended as it did.
    pub reason: Option<String>,
    pub installed: BTreeMap<String, Installed>,
    /// The current version is committed but still in its regression window: a crash
    /// loop or an unhealthy verdict would yet roll it back.
    pub watching: bool,
    /// What is left of the probation in course (or of the regression window).
    pub left: Option<Duration>,
}

/// A node of the roster, in the order of the roll.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    pub node: String,
    /// Its live status (absent: the node is gone).
    pub live: Option<Status>,
    /// The last status it wrote in the roster.
    pub last: Option<Status>,
}

impl Peer {
    /// Its live status, or the last it wrote when it is gone.
    pub fn status(&self) -> Option<&Status> {
        self.live.as_ref().or(self.last.as_ref())
    }
}

/// Where this node's fetch of the target stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Fetch {
    /// None under way, none failed lately.
    #[default]
    Idle,
    Running,
    /// The last one failed (why); the next may start once `retry` is true.
    Failed {
        reason: String,
        retry: bool,
    },
}

/// Everything the rule looks at.
#[derive(Clone, Debug)]
pub struct View<'a> {
    pub me: &'a str,
    /// The fleet's tool (for the commands a reason names).
    pub tool: &'a str,
    pub target: &'a Target,
    pub local: &'a Local,
    /// Every node of the roster, this one included, in join order.
    pub peers: &'a [Peer],
    /// The slots held: index and holder.
    pub slots: &'a [(u32, Slot)],
    /// This node leads a lease of this tool.
    pub leader: bool,
    pub fetch: &'a Fetch,
    /// The nodes gone in probation for longer than their limit, as [`gone`] says.
    pub gone: &'a BTreeMap<String, u64>,
}

/// What the node does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Nothing,
    /// Fetch, verify and install the target version.
    Fetch(String),
    /// Take slot `index` (compare-and-create, guarded by the target's revision).
    TakeSlot {
        index: u32,
        attempts_before: u32,
    },
    /// Ask supd for the upgrade.
    Upgrade {
        version: String,
        force: bool,
        irreversible: bool,
    },
    /// Give slot `index` back.
    Release(u32),
    /// Mark `version` bad for the fleet (when `bad`) and halt the roll (when `version` is
    /// the target), saying why.
    Halt {
        version: String,
        reason: String,
        bad: bool,
    },
}

/// This node's status (without its name, epoch and time, which the caller adds) and its
/// next action.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub phase: Phase,
    pub result: Option<String>,
    pub reason: Option<String>,
    pub action: Action,
}

fn decision(
    phase: Phase,
    result: Option<&str>,
    reason: Option<String>,
    action: Action,
) -> Decision {
    Decision {
        phase,
        result: result.map(str::to_string),
        reason,
        action,
    }
}

/// The rule.
pub fn decide(v: &View) -> Decision {
    if let Some((index, slot)) = v.slots.iter().find(|(_, s)| s.node == v.me) {
        return with_slot(v, *index, slot);
    }
    let l = v.local;
    if l.phase == LocalPhase::Probation {
        // Not under a slot of ours (an upgrade by hand): its end is awaited all the same.
        let why = format!("{} is in probation", l.proposed.as_deref().unwrap_or("?"));
        return decision(Phase::Probation, None, Some(why), Action::Nothing);
    }
    let Some(target) = v.target.version.as_deref() else {
        return decision(
            Phase::Idle,
            None,
            Some("no target set".into()),
            Action::Nothing,
        );
    };
    if l.current.as_deref() == Some(target) {
        return settled(v, target);
    }
    let installed = l.installed.get(target);
    if let Some(mark) = v.target.bad.get(target) {
        let why = format!(
            "{target} is marked bad for the fleet (on {}: {})",
            mark.node, mark.reason
        );
        let phase = match installed.and_then(|i| i.bad.as_ref()) {
            Some(_) if l.proposed.as_deref() == Some(target) => Phase::RolledBack,
            _ => Phase::Idle,
        };
        return decision(phase, None, Some(why), Action::Nothing);
    }
    if let Some(h) = &v.target.halted {
        let why = format!("the roll is halted: {}", h.reason);
        let phase = if installed.is_some() {
            Phase::Waiting
        } else {
            Phase::Idle
        };
        return decision(phase, None, Some(why), Action::Nothing);
    }
    if let Some(why) = installed.and_then(|i| i.bad.as_ref()) {
        if !v.target.forced_versions.contains(target) {
            // Rolled back here without a slot to say it under (its sup-lease was away,
            // and the slot forgotten; or an upgrade by hand): said now, as any rollback.
            // It is not forced again but by an operator.
            let result = format!("{target} rolled back");
            return decision(
                Phase::RolledBack,
                Some(&result),
                Some(why.clone()),
                Action::Halt {
                    version: target.into(),
                    reason: why.clone(),
                    bad: true,
                },
            );
        }
    }
    let Some(installed) = installed else {
        return match v.fetch {
            Fetch::Running => decision(Phase::Downloading, None, None, Action::Nothing),
            Fetch::Failed { reason, retry } => {
                let action = if *retry {
                    Action::Fetch(target.into())
                } else {
                    Action::Nothing
                };
                decision(
                    Phase::Downloading,
                    Some(DOWNLOAD_FAILED),
                    Some(reason.clone()),
                    action,
                )
            }
            Fetch::Idle => decision(Phase::Downloading, None, None, Action::Fetch(target.into())),
        };
    };
    match turn(v, target) {
        Ok(index) => decision(
            Phase::Waiting,
            None,
            Some("its turn".into()),
            Action::TakeSlot {
                index,
                attempts_before: installed.attempts,
            },
        ),
        Err(why) => decision(Phase::Waiting, None, Some(why), Action::Nothing),
    }
}

/// This node runs the target and holds no slot: committed, or failed and staying.
fn settled(v: &View, target: &str) -> Decision {
    let l = v.local;
    if l.phase == LocalPhase::Failed && l.proposed.as_deref() == Some(target) {
        let result = format!("{target} failed");
        return decision(
            Phase::Failed,
            Some(&result),
            l.reason.clone(),
            Action::Nothing,
        );
    }
    let result = format!("{target} committed");
    decision(Phase::Committed, Some(&result), None, Action::Nothing)
}

/// This node holds slot `index`: the upgrade is to be asked for, under way, or over.
fn with_slot(v: &View, index: u32, slot: &Slot) -> Decision {
    let l = v.local;
    let sv = slot.version.as_str();
    let here = l.installed.get(sv);
    if l.phase == LocalPhase::Probation && l.proposed.as_deref() == Some(sv) {
        return decision(Phase::Probation, None, None, Action::Nothing);
    }
    let asked = here.is_some_and(|i| i.attempts > slot.attempts_before);
    if !asked && l.phase == LocalPhase::Probation {
        // Another upgrade is in probation here (by hand): supd would refuse this one
        // until it ends. The slot is kept meanwhile.
        let why = format!(
            "{} is in probation here: {sv} waits for it",
            l.proposed.as_deref().unwrap_or("?")
        );
        return decision(Phase::Waiting, None, Some(why), Action::Nothing);
    }
    // Already there (by hand, say): nothing to ask for; the slot is over as a commit.
    if !asked && l.current.as_deref() != Some(sv) {
        if v.target.version.as_deref() != Some(sv) || v.target.blocked() || here.is_none() {
            // The target moved on, or the roll halted, before this node started it.
            return decision(
                Phase::Waiting,
                None,
                Some("slot given back".into()),
                Action::Release(index),
            );
        }
        let force = here.is_some_and(|i| i.bad.is_some());
        let action = Action::Upgrade {
            version: sv.to_string(),
            force,
            irreversible: v.target.irreversible,
        };
        return decision(Phase::Probation, None, Some("upgrading".into()), action);
    }
    let proposed = l.proposed.as_deref() == Some(sv);
    let rolled_back = here.and_then(|i| i.bad.clone());
    let failed = l.phase == LocalPhase::Failed && proposed;
    if rolled_back.is_some() || failed {
        let (phase, result) = match rolled_back.is_some() {
            true => (Phase::RolledBack, "rolled back"),
            false => (Phase::Failed, "failed"),
        };
        let reason = rolled_back
            .or_else(|| l.reason.clone())
            .unwrap_or_else(|| "no reason given".into());
        let action = if v.target.bad.contains_key(sv) {
            Action::Release(index)
        } else {
            Action::Halt {
                version: sv.to_string(),
                reason: reason.clone(),
                bad: true,
            }
        };
        let result = format!("{sv} {result}");
        return decision(phase, Some(&result), Some(reason), action);
    }
    if l.current.as_deref() == Some(sv) && l.watching {
        // Committed, but its regression window is not over: the slot is kept, so the
        // roll goes on only once the version has held here for it too.
        let why = format!("{sv} committed, in its regression window");
        return decision(Phase::Probation, None, Some(why), Action::Nothing);
    }
    if l.current.as_deref() == Some(sv) {
        let irreversible = here.is_some_and(|i| i.irreversible);
        let pause = irreversible
            && !v.target.allow_irreversible
            && v.target.version.as_deref() == Some(sv)
            && v.target.halted.is_none();
        let action = match pause {
            true => Action::Halt {
                version: sv.to_string(),
                reason: format!(
                    "{sv} is irreversible and committed on {}: `fleet resume` lets the roll go on",
                    v.me
                ),
                bad: false,
            },
            false => Action::Release(index),
        };
        let result = format!("{sv} committed");
        return decision(Phase::Committed, Some(&result), None, action);
    }
    // Over some other way (rolled back by hand to another version): nothing to hold.
    decision(Phase::Waiting, None, None, Action::Release(index))
}

/// Whether it is this node's turn, and the slot it takes; or why it waits.
fn turn(v: &View, target: &str) -> Result<u32, String> {
    let committed: Vec<&str> = v
        .peers
        .iter()
        .filter(|p| p.node != v.me)
        .filter_map(Peer::status)
        .filter(|s| s.running.as_deref() == Some(target) && s.phase == Phase::Committed)
        .map(|s| s.node.as_str())
        .collect();
    if !v.target.allow_irreversible {
        let irreversible = v.peers.iter().filter_map(Peer::status).find(|s| {
            s.running.as_deref() == Some(target) && s.phase == Phase::Committed && s.irreversible
        });
        if let Some(s) = irreversible {
            return Err(format!(
                "{target} is irreversible and committed on {}: waiting for `fleet resume`",
                s.node
            ));
        }
    }
    if v.leader {
        let pending: Vec<&str> = v
            .peers
            .iter()
            .filter(|p| p.node != v.me)
            .filter_map(|p| p.live.as_ref())
            .filter(|s| s.running.as_deref() != Some(target) || s.phase != Phase::Committed)
            .map(|s| s.node.as_str())
            .collect();
        if !pending.is_empty() {
            return Err(format!(
                "it leads a lease of this tool: it upgrades last (after {})",
                pending.join(", ")
            ));
        }
    }
    let max = v.target.max_parallel.max(1);
    // Slots held count against max_parallel whatever their index: one above it is from
    // a roll set with more (it is still in probation).
    let free: Vec<u32> = (0..max)
        .filter(|i| !v.slots.iter().any(|(j, _)| j == i))
        .take((max as usize).saturating_sub(v.slots.len()))
        .collect();
    if free.is_empty() {
        let holders: Vec<&str> = v.slots.iter().map(|(_, s)| s.node.as_str()).collect();
        let mut why = format!("waiting for {} to finish probation", holders.join(", "));
        for h in holders.iter().filter(|h| v.gone.contains_key(**h)) {
            why.push_str(&format!(
                "; {h} has been gone longer than its probation plus T: if it is not coming \
                 back, run `{}`",
                forget_command("STORE", v.tool, h)
            ));
        }
        return Err(why);
    }
    let canary = v.target.canary.max(1) as usize;
    let allowed = if committed.len() < canary {
        let started = committed.len() + v.slots.iter().filter(|(_, s)| s.version == target).count();
        canary.saturating_sub(started).min(free.len())
    } else {
        free.len()
    };
    let queue = queue(v, target);
    let rank = queue.iter().position(|n| *n == v.me).unwrap_or(queue.len());
    if rank < allowed {
        return Ok(free[rank]);
    }
    if committed.len() < canary && allowed == 0 {
        return Err(format!(
            "waiting for the canary ({canary}) to commit {target}"
        ));
    }
    let ahead: Vec<&str> = queue.iter().take(rank).copied().collect();
    Err(format!("waiting behind {}", ahead.join(", ")))
}

/// What an operator runs to forget `node` (on the store `store`, as given to sup-lease).
pub fn forget_command(store: &str, tool: &str, node: &str) -> String {
    format!("sup-lease --store {store} fleet forget {tool} {node}")
}

/// The probation assumed of a node that did not say what was left of its own (a status
/// written by an older sup-lease): supd's default `probation`.
pub const UNSAID_PROBATION: Duration = Duration::from_secs(300);

/// Whether `p` is a node gone in probation, which the roll may wait for: no live status
/// (its status key went with its store lease), and it holds a slot or last said
/// `probation`.
pub fn gone_in_probation(p: &Peer, slots: &[(u32, Slot)]) -> bool {
    p.live.is_none()
        && (slots.iter().any(|(_, s)| s.node == p.node)
            || p.last.as_ref().is_some_and(|s| s.phase == Phase::Probation))
}

/// The nodes gone in probation that this node has watched gone longer than what was left
/// of their probation (as they last said it) plus `ttl`: each with that limit, in ms.
///
/// `watched` is how long this node has seen each one's status key absent, counted on
/// its own clock from the first round it saw it so. What "gone since" rests on is the
/// store: a node's status key is bound to its store lease, and goes when the node stopped
/// renewing it for its T; no time the gone node wrote is compared with this node's clock
/// (the wall clocks of two machines may differ by any amount). The count starts at or
/// after the key went, and that is at or after the node's last status: so when it passes
/// the limit, the probation the node last spoke of is over by T at least, and its
/// sup-lease has not come back to say how it ended. A node that restarts counts anew,
/// which only says it later, never sooner.
pub fn gone(
    peers: &[Peer],
    slots: &[(u32, Slot)],
    watched: &BTreeMap<String, Duration>,
    ttl: Duration,
) -> BTreeMap<String, u64> {
    peers
        .iter()
        .filter(|p| gone_in_probation(p, slots))
        .filter_map(|p| {
            let left = p
                .last
                .as_ref()
                .and_then(|s| s.probation_left_ms)
                .map(Duration::from_millis)
                .unwrap_or(UNSAID_PROBATION);
            let limit = left + ttl;
            let for_ = watched.get(&p.node)?;
            (*for_ > limit).then(|| (p.node.clone(), limit.as_millis() as u64))
        })
        .collect()
}

/// The nodes ready to start the target, in the order of the roll: this one (ready, or
/// the rule would not ask), and every live node that says it waits (or has not said
/// yet); those that tried the target before first, leaders last.
fn queue<'a>(v: &View<'a>, target: &str) -> Vec<&'a str> {
    // A live node keeps its place while it downloads, or before it answered the target's
    // epoch (the others wait for it rather than overtake it: the order is the roster's,
    // not the fastest download's); one whose download failed is passed over.
    let ready = |p: &Peer| {
        p.node == v.me
            || p.live.as_ref().is_some_and(|s| {
                let fetching =
                    s.phase == Phase::Downloading && s.result.as_deref() != Some(DOWNLOAD_FAILED);
                s.running.as_deref() != Some(target)
                    && (s.phase == Phase::Waiting || fetching || s.epoch < v.target.epoch)
            })
    };
    let leads = |p: &Peer| match p.node == v.me {
        true => v.leader,
        false => p.live.as_ref().is_some_and(|s| s.leader),
    };
    // After a forced resume, the nodes that tried the target already (and rolled it
    // back) try it again first: the others are not exposed to it before them.
    let tried = |p: &Peer| match p.node == v.me {
        true => v.local.proposed.as_deref() == Some(target),
        false => p
            .live
            .as_ref()
            .is_some_and(|s| s.proposed.as_deref() == Some(target)),
    };
    let (mut first, last): (Vec<&Peer>, Vec<&Peer>) =
        v.peers.iter().filter(|p| ready(p)).partition(|p| !leads(p));
    first.sort_by_key(|p| !tried(p));
    first.extend(last);
    first.into_iter().map(|p| p.node.as_str()).collect()
}

#[cfg(test)]
mod tests;
