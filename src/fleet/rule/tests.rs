use super::*;
use crate::fleet::record::{Halt, Mark};

fn target(v: &str) -> Target {
    Target {
        epoch: 1,
        version: Some(v.into()),
        url: "file:///a.tar.gz".into(),
        sha256: "0".repeat(64),
        canary: 1,
        max_parallel: 1,
        ..Target::default()
    }
}

fn local(current: &str, installed: &[&str]) -> Local {
    Local {
        current: Some(current.into()),
        phase: LocalPhase::Committed,
        installed: installed
            .iter()
            .map(|v| (v.to_string(), Installed::default()))
            .collect(),
        ..Local::default()
    }
}

fn status(node: &str, running: &str, phase: Phase) -> Status {
    Status {
        node: node.into(),
        running: Some(running.into()),
        phase,
        epoch: 1,
        ..Status::default()
    }
}

fn live(s: Status) -> Peer {
    Peer {
        node: s.node.clone(),
        live: Some(s.clone()),
        last: Some(s),
    }
}

fn gone(s: Status) -> Peer {
    Peer {
        node: s.node.clone(),
        live: None,
        last: Some(s),
    }
}

fn slot(node: &str, version: &str, before: u32) -> Slot {
    Slot {
        node: node.into(),
        version: version.into(),
        attempts_before: before,
    }
}

struct Case {
    me: &'static str,
    target: Target,
    local: Local,
    peers: Vec<Peer>,
    slots: Vec<(u32, Slot)>,
    leader: bool,
    fetch: Fetch,
    gone: BTreeMap<String, u64>,
}

impl Case {
    fn new(me: &'static str, t: Target, l: Local) -> Case {
        Case {
            me,
            target: t,
            local: l,
            peers: Vec::new(),
            slots: Vec::new(),
            leader: false,
            fetch: Fetch::Idle,
            gone: BTreeMap::new(),
        }
    }

    fn decide(&self) -> Decision {
        decide(&View {
            me: self.me,
            tool: "agent",
            target: &self.target,
            local: &self.local,
            peers: &self.peers,
            slots: &self.slots,
            leader: self.leader,
            fetch: &self.fetch,
            gone: &self.gone,
        })
    }
}

/// Four nodes on 1.0.0, all with 2.0.0 installed and waiting.
fn four_waiting(me: &'static str) -> Case {
    let mut c = Case::new(me, target("2.0.0"), local("1.0.0", &["1.0.0", "2.0.0"]));
    c.peers = ["a", "b", "c", "d"]
        .iter()
        .map(|n| live(status(n, "1.0.0", Phase::Waiting)))
        .collect();
    c
}

#[test]
fn no_target_is_idle_and_a_missing_version_is_fetched() {
    let c = Case::new("a", Target::default(), local("1.0.0", &["1.0.0"]));
    assert_eq!(c.decide().phase, Phase::Idle);
    assert_eq!(c.decide().action, Action::Nothing);
    let mut c = Case::new("a", target("2.0.0"), local("1.0.0", &["1.0.0"]));
    let d = c.decide();
    assert_eq!(
        (d.phase, d.action),
        (Phase::Downloading, Action::Fetch("2.0.0".into()))
    );
    c.fetch = Fetch::Running;
    assert_eq!(c.decide().action, Action::Nothing, "one fetch at a time");
    c.fetch = Fetch::Failed {
        reason: "sha256 mismatch".into(),
        retry: false,
    };
    let d = c.decide();
    assert_eq!(d.action, Action::Nothing, "backing off");
    assert_eq!(d.result.as_deref(), Some("download failed"));
    assert_eq!(d.reason.as_deref(), Some("sha256 mismatch"));
    c.fetch = Fetch::Failed {
        reason: "x".into(),
        retry: true,
    };
    assert_eq!(c.decide().action, Action::Fetch("2.0.0".into()));
}

#[test]
fn an_installed_version_is_never_fetched_again() {
    let c = Case::new("a", target("2.0.0"), local("1.0.0", &["1.0.0", "2.0.0"]));
    assert!(matches!(
        c.decide().action,
        Action::TakeSlot { index: 0, .. }
    ));
}

#[test]
fn the_first_node_in_order_is_the_canary_and_the_rest_wait_for_its_commit() {
    let a = four_waiting("a");
    assert_eq!(
        a.decide().action,
        Action::TakeSlot {
            index: 0,
            attempts_before: 0
        }
    );
    let b = four_waiting("b");
    let d = b.decide();
    assert_eq!(d.action, Action::Nothing);
    assert_eq!(d.phase, Phase::Waiting);
    // a holds the slot: b waits for its probation, whatever max_parallel says of slots.
    let mut b = four_waiting("b");
    b.target.max_parallel = 2;
    b.slots = vec![(0, slot("a", "2.0.0", 0))];
    b.peers[0] = live(status("a", "2.0.0", Phase::Probation));
    let d = b.decide();
    assert_eq!(d.action, Action::Nothing, "the canary has not committed");
    assert!(d.reason.unwrap_or_default().contains("canary"));
}

#[test]
fn after_the_canary_commits_the_next_in_order_goes_one_at_a_time() {
    let mut b = four_waiting("b");
    b.peers[0] = live(status("a", "2.0.0", Phase::Committed));
    assert!(matches!(
        b.decide().action,
        Action::TakeSlot { index: 0, .. }
    ));
    let mut c = four_waiting("c");
    c.peers[0] = live(status("a", "2.0.0", Phase::Committed));
    let d = c.decide();
    assert_eq!(d.action, Action::Nothing, "b is ahead in the order");
    assert!(d.reason.unwrap_or_default().contains("behind b"));
    c.slots = vec![(0, slot("b", "2.0.0", 0))];
    assert_eq!(c.decide().action, Action::Nothing, "the one slot is held");
    // Two slots: the next two go together, each to its own slot.
    c.slots.clear();
    c.target.max_parallel = 2;
    assert!(matches!(
        c.decide().action,
        Action::TakeSlot { index: 1, .. }
    ));
}

#[test]
fn a_node_that_is_gone_or_not_ready_is_passed_over() {
    let mut c = four_waiting("c");
    c.peers[0] = live(status("a", "2.0.0", Phase::Committed));
    c.peers[1] = gone(status("b", "1.0.0", Phase::Waiting));
    assert!(
        matches!(c.decide().action, Action::TakeSlot { .. }),
        "b is gone"
    );
    let mut fetching = status("b", "1.0.0", Phase::Downloading);
    fetching.result = Some("1.0.0 committed".into());
    c.peers[1] = live(fetching);
    assert_eq!(
        c.decide().action,
        Action::Nothing,
        "b keeps its place while it downloads"
    );
    let mut failed = status("b", "1.0.0", Phase::Downloading);
    failed.result = Some("download failed".into());
    c.peers[1] = live(failed);
    assert!(
        matches!(c.decide().action, Action::TakeSlot { .. }),
        "b's download failed: passed over"
    );
    // A gone node's last commit still counts for the canary.
    c.peers[0] = gone(status("a", "2.0.0", Phase::Committed));
    assert!(matches!(c.decide().action, Action::TakeSlot { .. }));
}

#[test]
fn the_leader_goes_last() {
    let mut a = four_waiting("a");
    a.leader = true;
    let d = a.decide();
    assert_eq!(d.action, Action::Nothing);
    assert!(d.reason.unwrap_or_default().contains("last"));
    let mut b = four_waiting("b");
    if let Some(s) = b.peers[0].live.as_mut() {
        s.leader = true;
    }
    assert!(
        matches!(b.decide().action, Action::TakeSlot { .. }),
        "b is the canary"
    );
    let mut a = four_waiting("a");
    a.leader = true;
    for p in &mut a.peers[1..] {
        p.live = Some(status(&p.node, "2.0.0", Phase::Committed));
    }
    assert!(
        matches!(a.decide().action, Action::TakeSlot { .. }),
        "everyone else committed"
    );
}

#[test]
fn a_slot_holder_upgrades_then_gives_the_slot_back_on_commit() {
    let mut a = four_waiting("a");
    a.slots = vec![(0, slot("a", "2.0.0", 0))];
    assert_eq!(
        a.decide().action,
        Action::Upgrade {
            version: "2.0.0".into(),
            force: false,
            irreversible: false
        }
    );
    a.local.phase = LocalPhase::Probation;
    a.local.proposed = Some("2.0.0".into());
    a.local.current = Some("2.0.0".into());
    if let Some(i) = a.local.installed.get_mut("2.0.0") {
        i.attempts = 1;
    }
    let d = a.decide();
    assert_eq!((d.phase, d.action), (Phase::Probation, Action::Nothing));
    a.local.phase = LocalPhase::Committed;
    // Issue 21, item 9: committed, in its regression window: the slot is kept.
    a.local.watching = true;
    let d = a.decide();
    assert_eq!((d.phase, d.action), (Phase::Probation, Action::Nothing));
    assert!(d
        .reason
        .as_deref()
        .unwrap_or("")
        .contains("regression window"));
    a.local.watching = false;
    let d = a.decide();
    assert_eq!((d.phase, d.action), (Phase::Committed, Action::Release(0)));
    a.slots.clear();
    let d = a.decide();
    assert_eq!((d.phase, d.action), (Phase::Committed, Action::Nothing));
}

#[test]
fn a_rollback_marks_the_version_bad_and_halts_then_gives_the_slot_back() {
    let mut a = four_waiting("a");
    a.slots = vec![(0, slot("a", "2.0.0", 0))];
    a.local.phase = LocalPhase::RolledBack;
    a.local.proposed = Some("2.0.0".into());
    let i = a.local.installed.get_mut("2.0.0").expect("installed");
    i.attempts = 1;
    i.bad = Some("crash loop: 10 restarts in 5m".into());
    let d = a.decide();
    assert_eq!(d.phase, Phase::RolledBack);
    assert_eq!(
        d.action,
        Action::Halt {
            version: "2.0.0".into(),
            reason: "crash loop: 10 restarts in 5m".into(),
            bad: true
        }
    );
    a.target.bad.insert(
        "2.0.0".into(),
        Mark {
            node: "a".into(),
            reason: "x".into(),
            at: String::new(),
        },
    );
    assert_eq!(a.decide().action, Action::Release(0));
}

#[test]
fn a_slot_taken_but_not_used_is_used_after_a_restart_and_a_stale_bad_mark_is_forced() {
    let mut a = four_waiting("a");
    let i = a.local.installed.get_mut("2.0.0").expect("installed");
    i.attempts = 1;
    i.bad = Some("rolled back before".into());
    a.target.forced = 1;
    // The mark is from before the slot: not this slot's attempt.
    a.slots = vec![(0, slot("a", "2.0.0", 1))];
    assert_eq!(
        a.decide().action,
        Action::Upgrade {
            version: "2.0.0".into(),
            force: true,
            irreversible: false
        }
    );
}

#[test]
fn a_halted_or_bad_version_is_not_started() {
    let mut b = four_waiting("b");
    b.peers[0] = live(status("a", "2.0.0", Phase::Committed));
    b.target.halted = Some(Halt {
        version: "2.0.0".into(),
        node: None,
        reason: "by hand".into(),
        at: String::new(),
    });
    let d = b.decide();
    assert_eq!(d.action, Action::Nothing);
    assert!(d.reason.unwrap_or_default().contains("halted"));
    // Nor is it fetched.
    b.local.installed.remove("2.0.0");
    assert_eq!(b.decide().action, Action::Nothing);
    b.target.halted = None;
    b.target.bad.insert(
        "2.0.0".into(),
        Mark {
            node: "a".into(),
            reason: "crash loop".into(),
            at: String::new(),
        },
    );
    assert_eq!(b.decide().action, Action::Nothing);
    // A slot taken just before the halt is given back unused.
    b.local
        .installed
        .insert("2.0.0".into(), Installed::default());
    b.slots = vec![(0, slot("b", "2.0.0", 0))];
    assert_eq!(b.decide().action, Action::Release(0));
}

#[test]
fn an_irreversible_commit_pauses_the_roll_unless_allowed() {
    let mut a = four_waiting("a");
    a.slots = vec![(0, slot("a", "2.0.0", 0))];
    a.local.current = Some("2.0.0".into());
    let i = a.local.installed.get_mut("2.0.0").expect("installed");
    i.attempts = 1;
    i.irreversible = true;
    assert!(matches!(a.decide().action, Action::Halt { bad: false, .. }));
    a.target.allow_irreversible = true;
    assert_eq!(a.decide().action, Action::Release(0));
    // The others wait, even before the halt is written.
    let mut b = four_waiting("b");
    let mut s = status("a", "2.0.0", Phase::Committed);
    s.irreversible = true;
    b.peers[0] = live(s);
    let d = b.decide();
    assert_eq!(d.action, Action::Nothing);
    assert!(d.reason.unwrap_or_default().contains("irreversible"));
    b.target.allow_irreversible = true;
    assert!(matches!(b.decide().action, Action::TakeSlot { .. }));
}

#[test]
fn a_failed_irreversible_upgrade_halts_too() {
    let mut a = four_waiting("a");
    a.slots = vec![(0, slot("a", "2.0.0", 0))];
    a.local.current = Some("2.0.0".into());
    a.local.phase = LocalPhase::Failed;
    a.local.proposed = Some("2.0.0".into());
    a.local.reason = Some("health check failed".into());
    if let Some(i) = a.local.installed.get_mut("2.0.0") {
        i.attempts = 1;
    }
    let d = a.decide();
    assert_eq!(d.phase, Phase::Failed);
    assert!(matches!(d.action, Action::Halt { bad: true, .. }));
}

#[test]
fn a_node_already_on_the_target_is_committed() {
    let c = Case::new("a", target("2.0.0"), local("2.0.0", &["2.0.0"]));
    let d = c.decide();
    assert_eq!((d.phase, d.action), (Phase::Committed, Action::Nothing));
}

#[test]
fn a_node_that_has_not_answered_the_new_epoch_keeps_its_place() {
    let mut b = four_waiting("b");
    b.target.epoch = 2;
    // a said "rolled-back" at epoch 1 (before a forced resume): it may be ready now.
    let mut a = status("a", "1.0.0", Phase::RolledBack);
    a.epoch = 1;
    b.peers[0] = live(a.clone());
    for p in &mut b.peers[1..] {
        if let Some(s) = p.live.as_mut() {
            s.epoch = 2;
        }
    }
    let d = b.decide();
    assert_eq!(d.action, Action::Nothing, "a keeps its place");
    a.epoch = 2;
    b.peers[0] = live(a);
    assert!(
        matches!(b.decide().action, Action::TakeSlot { .. }),
        "a said it is not ready"
    );
}

#[test]
fn a_slot_held_by_another_node_keeps_the_next_waiting_until_it_is_given_back() {
    // The canary committed; b holds the one slot, in probation: c (next in order, and
    // ready) waits for it, and takes no slot of its own.
    let mut c = four_waiting("c");
    c.peers[0] = live(status("a", "2.0.0", Phase::Committed));
    c.peers[1] = live(status("b", "2.0.0", Phase::Probation));
    c.slots = vec![(0, slot("b", "2.0.0", 0))];
    let d = c.decide();
    assert_eq!(d.action, Action::Nothing, "b is in probation");
    assert!(
        d.reason
            .unwrap_or_default()
            .contains("b to finish probation"),
        "says whom it waits for"
    );
    // Two slots, one held: c takes the other one, never b's.
    c.target.max_parallel = 2;
    assert!(matches!(
        c.decide().action,
        Action::TakeSlot { index: 1, .. }
    ));
    // Both held (b, and d out of order by hand): c waits.
    c.slots.push((1, slot("d", "2.0.0", 0)));
    assert_eq!(c.decide().action, Action::Nothing);
    // A slot held for another version (a roll set meanwhile) counts as well.
    c.target.max_parallel = 1;
    c.slots = vec![(0, slot("b", "1.5.0", 0))];
    assert_eq!(c.decide().action, Action::Nothing);
}

#[test]
fn after_a_forced_resume_the_node_that_rolled_it_back_goes_first() {
    // b rolled 2.0.0 back (a was still downloading then, and so passed over); the
    // operator forced the roll on. b tries it again before a, first in order, is exposed.
    let mut rolled = status("b", "1.0.0", Phase::Waiting);
    rolled.proposed = Some("2.0.0".into());
    let mut a = four_waiting("a");
    a.target.forced = 1;
    a.peers[1] = live(rolled.clone());
    let d = a.decide();
    assert_eq!(d.action, Action::Nothing);
    assert!(d.reason.unwrap_or_default().contains("behind b"));
    let mut b = four_waiting("b");
    b.target.forced = 1;
    b.target.forced_versions.insert("2.0.0".into());
    b.peers[1] = live(rolled);
    b.local.proposed = Some("2.0.0".into());
    let i = b.local.installed.get_mut("2.0.0").expect("installed");
    i.attempts = 1;
    i.bad = Some("crash loop".into());
    assert!(matches!(
        b.decide().action,
        Action::TakeSlot {
            index: 0,
            attempts_before: 1
        }
    ));
}

#[test]
fn a_slot_above_a_lowered_max_parallel_still_counts() {
    // The last roll had two slots; b holds slot 1 of it, in probation. The new target
    // has max-parallel 1: slot 0 is free by its index, but one node is in probation.
    let mut c = four_waiting("c");
    c.peers[0] = live(status("a", "2.0.0", Phase::Committed));
    c.peers[1] = live(status("b", "1.5.0", Phase::Probation));
    c.slots = vec![(1, slot("b", "1.5.0", 0))];
    let d = c.decide();
    assert_eq!(d.action, Action::Nothing, "b is in probation");
    c.slots.clear();
    assert!(matches!(
        c.decide().action,
        Action::TakeSlot { index: 0, .. }
    ));
}

#[test]
fn a_rollback_here_without_a_slot_is_reported_and_not_forced_but_by_an_operator() {
    let mut a = four_waiting("a");
    a.local.phase = LocalPhase::RolledBack;
    a.local.proposed = Some("2.0.0".into());
    let i = a.local.installed.get_mut("2.0.0").expect("installed");
    i.attempts = 1;
    i.bad = Some("crash loop".into());
    let d = a.decide();
    assert_eq!(d.phase, Phase::RolledBack);
    assert_eq!(
        d.action,
        Action::Halt {
            version: "2.0.0".into(),
            reason: "crash loop".into(),
            bad: true
        }
    );
    // The operator forced it (`resume --force`): tried again, forced.
    a.target.forced = 1;
    a.target.forced_versions.insert("2.0.0".into());
    assert!(matches!(
        a.decide().action,
        Action::TakeSlot {
            attempts_before: 1,
            ..
        }
    ));
}

#[test]
fn a_slot_holder_waits_for_an_upgrade_by_hand_in_probation() {
    let mut a = four_waiting("a");
    a.slots = vec![(0, slot("a", "2.0.0", 0))];
    a.local.phase = LocalPhase::Probation;
    a.local.current = Some("1.5.0".into());
    a.local.proposed = Some("1.5.0".into());
    let d = a.decide();
    assert_eq!(d.action, Action::Nothing, "supd would refuse the upgrade");
    assert!(d
        .reason
        .unwrap_or_default()
        .contains("1.5.0 is in probation"));
    a.local.phase = LocalPhase::Committed;
    assert!(matches!(a.decide().action, Action::Upgrade { .. }));
}

#[test]
fn a_slot_holder_already_on_the_version_gives_the_slot_back() {
    let mut a = four_waiting("a");
    a.slots = vec![(0, slot("a", "2.0.0", 0))];
    a.local.current = Some("2.0.0".into());
    let d = a.decide();
    assert_eq!((d.phase, d.action), (Phase::Committed, Action::Release(0)));
}

/// A node gone in probation is said gone once this node has watched its status key
/// absent longer than what was left of its probation (as it last said) plus T; not
/// before, not a live node, not one gone while waiting without a slot, and one that did
/// not say its probation is given supd's default.
#[test]
fn a_node_gone_in_probation_is_said_gone_after_its_probation_left_plus_t() {
    let ttl = Duration::from_secs(4);
    let mut b = status("b", "2.0.0", Phase::Probation);
    b.probation_left_ms = Some(30_000);
    let peers = &[
        live(status("a", "1.0.0", Phase::Waiting)),
        gone(b.clone()),
        gone(status("c", "1.0.0", Phase::Waiting)),
    ];
    let slots = vec![(0, slot("b", "2.0.0", 0))];
    let watched = |pairs: &[(&str, u64)]| -> BTreeMap<String, Duration> {
        pairs
            .iter()
            .map(|(n, s)| (n.to_string(), Duration::from_secs(*s)))
            .collect()
    };
    assert!(super::gone_in_probation(&peers[1], &slots));
    assert!(!super::gone_in_probation(&peers[0], &slots), "live");
    assert!(
        !super::gone_in_probation(&peers[2], &slots),
        "not in probation"
    );
    let said = |w: &[(&str, u64)]| super::gone(peers, &slots, &watched(w), ttl);
    assert!(said(&[("b", 34)]).is_empty(), "30 s + 4 s: not yet");
    assert_eq!(
        said(&[("b", 35), ("c", 1000)]),
        [("b".into(), 34_000)].into()
    );
    assert!(said(&[]).is_empty(), "not watched: never said");
    // Live again (its sup-lease came back): not gone, whatever was watched.
    let back = [peers[0].clone(), live(b.clone())];
    assert!(super::gone(&back, &slots, &watched(&[("b", 1000)]), ttl).is_empty());
    // Its last word was probation without a slot (an upgrade by hand): gone too. One
    // that never said what was left of it: supd's default probation.
    let mut unsaid = b.clone();
    unsaid.probation_left_ms = None;
    let peers = [gone(unsaid)];
    let none: Vec<(u32, Slot)> = Vec::new();
    assert!(super::gone(&peers, &none, &watched(&[("b", 303)]), ttl).is_empty());
    assert_eq!(
        super::gone(&peers, &none, &watched(&[("b", 305)]), ttl),
        [("b".into(), 304_000)].into()
    );
}

/// A node waiting for a slot held by a node said gone names the command that forgets it.
#[test]
fn waiting_for_a_gone_slot_holder_names_the_command_to_forget_it() {
    let mut c = four_waiting("a");
    c.peers[1] = gone(status("b", "2.0.0", Phase::Probation));
    c.slots = vec![(0, slot("b", "2.0.0", 0))];
    let why = c.decide().reason.unwrap_or_default();
    assert_eq!(why, "waiting for b to finish probation");
    c.gone = [("b".into(), 34_000)].into();
    let why = c.decide().reason.unwrap_or_default();
    assert!(
        why.starts_with("waiting for b to finish probation; b has been gone longer")
            && why.ends_with("run `sup-lease --store STORE fleet forget agent b`"),
        "{why}"
    );
    assert_eq!(
        c.decide().action,
        Action::Nothing,
        "the slot is not taken over"
    );
}
