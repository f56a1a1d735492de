use super::*;

const T: Duration = Duration::from_millis(900);

fn m(node: &str, version: &str, committed: bool) -> Member {
    Member {
        node: node.into(),
        version: Some(version.into()),
        versioned: true,
        committed,
        trial: false,
        irreversible: false,
        healthy: true,
        reason: None,
        failing: None,
    }
}

fn pol(strategy: Strategy, target: Option<&str>, floor: Option<&str>) -> Policy {
    Policy {
        epoch: 1,
        strategy,
        target: target.map(Into::into),
        floor: floor.map(Into::into),
    }
}

#[test]
fn eligibility_and_preference() {
    let members = [
        m("a", "0.6.2", true),
        m("b", "0.8.1", true),
        m("c", "0.9.0", false),
        m("d", "0.5.0", true),
    ];
    let table: Vec<(Policy, Option<&str>, [bool; 4])> = vec![
        (
            pol(Strategy::Newest, None, None),
            Some("0.8.1"),
            [true, true, false, true],
        ),
        (
            pol(Strategy::Oldest, None, None),
            Some("0.5.0"),
            [true, true, false, true],
        ),
        (
            pol(Strategy::Newest, None, Some("0.6.2")),
            Some("0.8.1"),
            [true, true, false, false],
        ),
        (
            pol(Strategy::Oldest, None, Some("0.6.2")),
            Some("0.6.2"),
            [true, true, false, false],
        ),
        (
            pol(Strategy::Pinned, Some("0.6.2"), None),
            Some("0.6.2"),
            [true, false, false, false],
        ),
        (
            pol(Strategy::Pinned, Some("0.9.0"), None),
            None,
            [false, false, false, false],
        ),
        (
            pol(Strategy::Pinned, Some("0.5.0"), Some("0.6.2")),
            None,
            [false, false, false, false],
        ),
    ];
    for (p, want, elig) in table {
        assert_eq!(
            preferred(&members, &p).map(|v| v.to_string()).as_deref(),
            want,
            "{p:?}"
        );
        let got: Vec<bool> = members.iter().map(|x| eligible(x, &p)).collect();
        assert_eq!(got, elig, "{p:?}");
    }
    assert!(!eligible(
        &Member {
            node: "x".into(),
            version: None,
            versioned: true,
            committed: true,
            trial: false,
            irreversible: false,
            healthy: true,
            reason: None,
            failing: None,
        },
        &Policy::default()
    ));
}

fn view<'a>(
    me: &'a str,
    members: &'a [Member],
    leader: Option<(&'a Leader, u64)>,
    policy: &'a Policy,
    now: Boot,
    owns: bool,
) -> View<'a> {
    View {
        holder_releasing: false,
        me,
        members,
        leader,
        policy,
        ttl: T,
        now,
        last_renewal: Some(now),
        owns_leader: owns,
    }
}

#[test]
fn single_node_decisions() {
    let p = pol(Strategy::Newest, None, None);
    let members = [m("a", "0.6.2", true), m("b", "0.8.1", true)];
    let at = |ms: u64| Boot(ms * 1_000_000);
    let la = Leader {
        node: "a".into(),
        version: Some("0.6.2".into()),
        epoch: 1,
    };
    let lb = Leader {
        node: "b".into(),
        version: Some("0.8.1".into()),
        epoch: 1,
    };

    // Empty leader: the preferred one acquires at once, the other waits T.
    assert_eq!(
        decide(
            &view("b", &members, None, &p, at(0), false),
            &Memory::default()
        )
        .0,
        Decision::Acquire
    );
    let (d, mem) = decide(
        &view("a", &members, None, &p, at(0), false),
        &Memory::default(),
    );
    assert!(matches!(d, Decision::Follow(_)), "{d:?}");
    assert_eq!(
        decide(&view("a", &members, None, &p, at(900), false), &mem).0,
        Decision::Acquire
    );

    // A holder leads until T/2 after its keepalive was sent.
    let (d, _) = decide(
        &view("b", &members, Some((&lb, 5)), &p, at(0), true),
        &Memory::default(),
    );
    assert_eq!(
        d,
        Decision::Lead {
            until: at(450),
            raise_floor: None
        }
    );
    let mut stale = view("b", &members, Some((&lb, 5)), &p, at(450), true);
    stale.last_renewal = Some(at(0));
    assert!(matches!(
        decide(&stale, &Memory::default()).0,
        Decision::Fence(_)
    ));
    assert!(matches!(
        decide(
            &view("b", &members, Some((&lb, 5)), &p, at(0), false),
            &Memory::default()
        )
        .0,
        Decision::Fence(_)
    ));

    // The old holder steps down once the preferred member has been live for T.
    let (d, mem) = decide(
        &view("a", &members, Some((&la, 5)), &p, at(0), true),
        &Memory::default(),
    );
    assert!(matches!(d, Decision::Lead { .. }), "{d:?}");
    assert!(matches!(
        decide(
            &view("a", &members, Some((&la, 5)), &p, at(900), true),
            &mem
        )
        .0,
        Decision::StepDown(_)
    ));

    // A preferred candidate takes over a holder that did not step down for 2T after it
    // should have (once the preferred member was live for T): at 3T.
    let (d, mem) = decide(
        &view("b", &members, Some((&la, 5)), &p, at(0), false),
        &Memory::default(),
    );
    assert!(matches!(d, Decision::Follow(_)));
    let (d, mem) = decide(
        &view("b", &members, Some((&la, 5)), &p, at(900), false),
        &mem,
    );
    assert!(
        matches!(d, Decision::Follow(_)),
        "the holder may still step down: {d:?}"
    );
    let (d, mem) = decide(
        &view("b", &members, Some((&la, 5)), &p, at(2600), false),
        &mem,
    );
    assert!(matches!(d, Decision::Follow(_)), "not yet 2T: {d:?}");
    assert_eq!(
        decide(
            &view("b", &members, Some((&la, 5)), &p, at(2700), false),
            &mem
        )
        .0,
        Decision::TakeOver { revision: 5 }
    );
    // A holder that said it is stepping down is left to finish, however long it takes.
    let mut stepping = view("b", &members, Some((&la, 5)), &p, at(0), false);
    stepping.holder_releasing = true;
    let (_, mut mem2) = decide(&stepping, &Memory::default());
    for t in [900, 2700, 5000, 20_000] {
        stepping.now = at(t);
        let (d, m) = decide(&stepping, &mem2);
        assert!(matches!(d, Decision::Follow(_)), "at {t}ms: {d:?}");
        mem2 = m;
    }
    // A holder that is not a member at all is taken over after 2T.
    let only_b = [m("b", "0.8.1", true)];
    let (_, mem) = decide(
        &view("b", &only_b, Some((&la, 7)), &p, at(0), false),
        &Memory::default(),
    );
    assert_eq!(
        decide(
            &view("b", &only_b, Some((&la, 7)), &p, at(1800), false),
            &mem
        )
        .0,
        Decision::TakeOver { revision: 7 }
    );

    // An irreversible leader raises the floor, once.
    let irr = [Member {
        irreversible: true,
        ..m("b", "0.8.1", true)
    }];
    let (d, _) = decide(
        &view("b", &irr, Some((&lb, 5)), &p, at(0), true),
        &Memory::default(),
    );
    assert_eq!(
        d,
        Decision::Lead {
            until: at(450),
            raise_floor: Some("0.8.1".into())
        }
    );
    let raised = pol(Strategy::Newest, None, Some("0.8.1"));
    let (d, _) = decide(
        &view("b", &irr, Some((&lb, 5)), &raised, at(0), true),
        &Memory::default(),
    );
    assert_eq!(
        d,
        Decision::Lead {
            until: at(450),
            raise_floor: None
        }
    );

    // A holder that is no longer eligible (in probation) steps down at once.
    let probation = [m("a", "0.7.0", false), m("b", "0.8.1", true)];
    assert!(matches!(
        decide(
            &view("a", &probation, Some((&la, 5)), &p, at(0), true),
            &Memory::default()
        )
        .0,
        Decision::StepDown(_)
    ));
}

/// A model store and several nodes ticking every T/3: what the nodes decide is carried
/// out as sup-lease would, and every grant is checked against every other.
struct Sim {
    nodes: Vec<(String, Member, Memory, bool)>, // name, candidacy, memory, sup-lease alive
    /// Each node's trials, and the member it publishes this tick (its candidacy with a
    /// spent trial withheld), as sup-lease's node does.
    trials: Vec<Trials>,
    published: Vec<Member>,
    leader: Option<(Leader, u64)>,
    policy: Policy,
    rev: u64,
    now: u64,
    /// Grants in force: node -> valid until (ms).
    grants: BTreeMap<String, u64>,
    leads: Vec<String>,
}

impl Sim {
    fn new(nodes: &[(&str, &str)]) -> Sim {
        let nodes = nodes
            .iter()
            .map(|(n, v)| (n.to_string(), m(n, v, true), Memory::default(), true))
            .collect::<Vec<_>>();
        Sim {
            trials: vec![Trials::default(); nodes.len()],
            published: Vec::new(),
            nodes,
            leader: None,
            policy: Policy::default(),
            rev: 1,
            now: 0,
            grants: BTreeMap::new(),
            leads: Vec::new(),
        }
    }

    fn set(&mut self, node: &str, version: &str, committed: bool, irreversible: bool) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.0 == node) {
            n.1 = Member {
                node: node.into(),
                version: Some(version.into()),
                versioned: true,
                committed,
                trial: false,
                irreversible,
                healthy: n.1.healthy,
                reason: n.1.reason.clone(),
                failing: n.1.failing.clone(),
            };
        }
    }

    /// The node's supd says its leader-only tool waits in probation on `version`: a
    /// candidacy on trial.
    fn trial(&mut self, node: &str, version: &str) {
        self.set(node, version, false, false);
        if let Some(n) = self.nodes.iter_mut().find(|n| n.0 == node) {
            n.1.trial = true;
        }
    }

    /// The node's supd says its leader-only services are healthy, or not (and why).
    fn health(&mut self, node: &str, healthy: bool) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.0 == node) {
            n.1.healthy = healthy;
            n.1.reason = (!healthy).then(|| "engine: health: 3 failures".into());
        }
    }

    fn wedge(&mut self, node: &str) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.0 == node) {
            n.3 = false;
        }
    }

    /// Members whose sup-lease is alive; a wedged node's member key expires after T.
    fn members(&self) -> Vec<Member> {
        self.nodes
            .iter()
            .zip(&self.published)
            .filter(|(n, _)| n.3)
            .map(|(_, p)| p.clone())
            .collect()
    }

    fn tick(&mut self) {
        let step = T.as_millis() as u64 / 3;
        self.now += step;
        let now = Boot(self.now * 1_000_000);
        self.grants.retain(|_, until| *until > self.now);
        let wedged_holder = self
            .leader
            .as_ref()
            .is_some_and(|(l, _)| self.nodes.iter().any(|n| n.0 == l.node && !n.3));
        if wedged_holder {
            // Its store lease runs out T after its last renewal (here: by the next tick).
            self.leader = None;
        }
        self.published = (0..self.nodes.len())
            .map(|i| self.trials[i].offer(self.nodes[i].1.clone(), true).0)
            .collect();
        for i in 0..self.nodes.len() {
            if !self.nodes[i].3 {
                continue;
            }
            let members = self.members();
            let name = self.nodes[i].0.clone();
            let owns = self.leader.as_ref().is_some_and(|(l, _)| l.node == name);
            self.trials[i].observe(&self.published[i], true, owns);
            let leader = self.leader.clone();
            let v = View {
                me: &name,
                members: &members,
                leader: leader.as_ref().map(|(l, r)| (l, *r)),
                policy: &self.policy,
                ttl: T,
                now,
                last_renewal: Some(now),
                owns_leader: owns,
                holder_releasing: false,
            };
            let (d, mut mem) = decide(&v, &self.nodes[i].2);
            match d {
                Decision::Acquire if self.leader.is_none() => {
                    self.rev += 1;
                    self.leader = Some((
                        Leader {
                            node: name.clone(),
                            version: self.nodes[i].1.version.clone(),
                            epoch: self.policy.epoch,
                        },
                        self.rev,
                    ));
                }
                Decision::TakeOver { revision }
                    if self.leader.as_ref().is_some_and(|(_, r)| *r == revision) =>
                {
                    self.rev += 1;
                    self.leader = Some((
                        Leader {
                            node: name.clone(),
                            version: self.nodes[i].1.version.clone(),
                            epoch: self.policy.epoch,
                        },
                        self.rev,
                    ));
                    mem.lead_from = Some(now.plus(T));
                }
                Decision::Lead { until, raise_floor } => {
                    for (other, until) in &self.grants {
                        assert!(
                            other == &name || *until <= self.now,
                            "at {}ms {name} leads while {other}'s grant runs until {until}ms",
                            self.now
                        );
                    }
                    self.grants.insert(name.clone(), until.as_ms());
                    if self.leads.last() != Some(&name) {
                        self.leads.push(name.clone());
                    }
                    if let Some(f) = raise_floor {
                        self.policy.floor = Some(f);
                        self.policy.epoch += 1;
                    }
                }
                Decision::StepDown(_) => {
                    self.grants.remove(&name); // lease-release: services stopped first
                    self.leader = None;
                }
                Decision::Fence(_)
                | Decision::Wait(_)
                | Decision::Follow(_)
                | Decision::Acquire
                | Decision::TakeOver { .. } => {}
            }
            self.nodes[i].2 = mem;
        }
    }

    fn run(&mut self, ticks: usize) {
        for _ in 0..ticks {
            self.tick();
        }
    }

    fn holder(&self) -> Option<String> {
        self.leader.as_ref().map(|(l, _)| l.node.clone())
    }
}

#[test]
fn fleet_leadership_follows_the_upgrade_without_overlap() {
    let mut s = Sim::new(&[("n1", "0.6.2"), ("n2", "0.6.2"), ("n3", "0.6.2")]);
    s.run(10);
    let first = s.holder().expect("someone leads");
    let other = ["n1", "n2", "n3"]
        .into_iter()
        .find(|n| *n != first)
        .expect("another node");
    // The upgrade is in probation first: not committed, leadership stays.
    s.set(other, "0.8.1", false, false);
    s.run(10);
    assert_eq!(
        s.holder().as_deref(),
        Some(first.as_str()),
        "a version in probation does not take over"
    );
    s.set(other, "0.8.1", true, false);
    s.run(15);
    assert_eq!(s.holder().as_deref(), Some(other), "leads: {:?}", s.leads);
    assert_eq!(s.leads.last().map(String::as_str), Some(other));
}

#[test]
fn a_crash_looping_upgrade_never_takes_leadership() {
    let mut s = Sim::new(&[("n1", "0.6.2"), ("n2", "0.6.2")]);
    s.run(10);
    let first = s.holder().expect("someone leads");
    let other = if first == "n1" { "n2" } else { "n1" };
    s.set(other, "0.8.1", false, false); // probation, then rolled back
    s.run(10);
    s.set(other, "0.6.2", true, false);
    s.run(10);
    assert_eq!(s.holder().as_deref(), Some(first.as_str()));
    assert_eq!(s.leads, vec![first]);
}

#[test]
fn an_irreversible_leader_raises_the_floor_and_only_the_operator_lowers_it() {
    let mut s = Sim::new(&[("n1", "0.6.2"), ("n2", "0.6.2")]);
    s.run(10);
    let first = s.holder().expect("someone leads");
    let other = if first == "n1" { "n2" } else { "n1" };
    s.set(other, "0.8.1", true, true);
    s.run(15);
    assert_eq!(s.holder().as_deref(), Some(other));
    assert_eq!(s.policy.floor.as_deref(), Some("0.8.1"));
    // The irreversible node dies: the old version may not lead.
    s.wedge(other);
    s.run(15);
    assert_eq!(s.holder(), None, "nobody below the floor leads");
    s.policy.floor = Some("0.6.2".into());
    s.policy.epoch += 1;
    s.run(10);
    assert_eq!(s.holder().as_deref(), Some(first.as_str()));
}

#[test]
fn pinning_an_older_version_moves_leadership_and_keeps_it() {
    let mut s = Sim::new(&[("n1", "0.6.2"), ("n2", "0.8.1"), ("n3", "0.8.1")]);
    s.run(10);
    assert_eq!(s.holder().as_deref().map(|h| h != "n1"), Some(true));
    s.policy = pol(Strategy::Pinned, Some("0.6.2"), None);
    s.run(20);
    assert_eq!(s.holder().as_deref(), Some("n1"));
    s.run(20);
    assert_eq!(
        s.holder().as_deref(),
        Some("n1"),
        "newer nodes live, but the pin holds"
    );
}

#[test]
fn a_wedged_holder_is_replaced_without_overlap() {
    let mut s = Sim::new(&[("n1", "0.6.2"), ("n2", "0.6.2")]);
    s.run(10);
    let first = s.holder().expect("someone leads");
    s.wedge(&first);
    s.run(15);
    let second = s.holder().expect("the other one leads");
    assert_ne!(second, first);
}

#[test]
fn the_grant_and_its_kill_grace_end_before_the_store_lease_by_a_margin() {
    for ms in [300, 900, 1000, 2500, 3000, 10_000, 60_000] {
        let t = Duration::from_millis(ms);
        assert!(
            validity(t) + kill_grace(t) + margin(t) <= t,
            "{ms}ms: T/2 + T/4 + T/4 <= T"
        );
        assert!(margin(t) >= t / 4 - Duration::from_nanos(2), "{ms}ms");
        // A tick every T/3 renews before the grant of the last one ran out.
        assert!(t / 3 < validity(t), "{ms}ms");
    }
}

#[test]
fn a_grant_counts_from_the_keepalive_not_from_the_decision() {
    let p = Policy::default();
    let members = [m("b", "0.8.1", true)];
    let lb = Leader {
        node: "b".into(),
        version: Some("0.8.1".into()),
        epoch: 1,
    };
    let at = |ms: u64| Boot(ms * 1_000_000);
    // (keepalive sent, decided) -> the grant's end, or fenced. T = 900ms.
    let table: [(u64, u64, Option<u64>); 5] = [
        (0, 0, Some(450)),
        (0, 300, Some(450)), // a slow store: the grant is shorter, not later
        (1000, 1449, Some(1450)),
        (1000, 1450, None), // the keepalive is T/2 old: no grant at all
        (0, 5800, None),
    ];
    for (sent, now, want) in table {
        let mut v = view("b", &members, Some((&lb, 5)), &p, at(now), true);
        v.last_renewal = Some(at(sent));
        let (d, _) = decide(&v, &Memory::default());
        match want {
            Some(end) => assert_eq!(
                d,
                Decision::Lead {
                    until: at(end),
                    raise_floor: None
                },
                "sent {sent}, decided {now}"
            ),
            None => assert!(
                matches!(d, Decision::Fence(_)),
                "sent {sent}, decided {now}: {d:?}"
            ),
        }
    }
}

fn plain(node: &str) -> Member {
    Member {
        node: node.into(),
        version: None,
        versioned: false,
        committed: true,
        trial: false,
        irreversible: false,
        healthy: true,
        reason: None,
        failing: None,
    }
}

#[test]
fn a_lease_without_a_tool_elects_one_live_member() {
    let members = [plain("a"), plain("b"), plain("c")];
    // (policy, eligible): versions rules speak of versions, which such members lack.
    let table = [
        (Policy::default(), true),
        (pol(Strategy::Oldest, None, None), true),
        (pol(Strategy::Newest, None, Some("1.0.0")), false),
        (pol(Strategy::Pinned, Some("1.0.0"), None), false),
    ];
    for (p, want) in &table {
        for x in &members {
            assert_eq!(eligible(x, p), *want, "{p:?}");
        }
        assert_eq!(preferred(&members, p), None);
    }
    // No tool, but supd could not be asked: not a candidacy.
    let unknown = Member {
        committed: false,
        ..plain("d")
    };
    assert!(!eligible(&unknown, &Policy::default()));
    // Every one of them tries the empty key at once; the store's compare-and-create
    // picks one, and the others follow it without taking over.
    let p = Policy::default();
    for me in ["a", "b", "c"] {
        let (d, _) = decide(
            &view(me, &members, None, &p, Boot(0), false),
            &Memory::default(),
        );
        assert_eq!(d, Decision::Acquire, "{me}");
    }
    let la = Leader {
        node: "a".into(),
        version: None,
        epoch: 0,
    };
    let at = |ms: u64| Boot(ms * 1_000_000);
    let (_, mut mem) = decide(
        &view("b", &members, Some((&la, 3)), &p, at(0), false),
        &Memory::default(),
    );
    for t in [300, 900, 1800, 5000] {
        let (d, m2) = decide(&view("b", &members, Some((&la, 3)), &p, at(t), false), &mem);
        assert!(matches!(d, Decision::Follow(_)), "at {t}: {d:?}");
        mem = m2;
    }
    let (d, _) = decide(
        &view("a", &members, Some((&la, 3)), &p, at(0), true),
        &Memory::default(),
    );
    assert!(matches!(d, Decision::Lead { .. }), "{d:?}");
    // A holder without a tool that is no longer a member is taken over after 2T.
    let bc = [plain("b"), plain("c")];
    let (_, mem) = decide(
        &view("b", &bc, Some((&la, 3)), &p, at(0), false),
        &Memory::default(),
    );
    assert_eq!(
        decide(&view("b", &bc, Some((&la, 3)), &p, at(1800), false), &mem).0,
        Decision::TakeOver { revision: 3 }
    );
}

#[test]
fn nodes_without_a_tool_elect_exactly_one_in_the_simulation() {
    let mut s = Sim::new(&[("n1", "0.0.0"), ("n2", "0.0.0"), ("n3", "0.0.0")]);
    for n in &mut s.nodes {
        n.1 = plain(&n.0);
    }
    s.run(10);
    let first = s.holder().expect("someone leads");
    assert_eq!(s.leads, vec![first.clone()]);
    s.wedge(&first);
    s.run(15);
    assert!(s.holder().is_some_and(|h| h != first), "{:?}", s.leads);
}

// Issue 13: health ------------------------------------------------------------------

fn sick(node: &str, version: &str) -> Member {
    Member {
        healthy: false,
        reason: Some("engine: health: 3 failures: HTTP 500".into()),
        ..m(node, version, true)
    }
}

#[test]
fn an_unhealthy_member_is_not_eligible_and_says_why() {
    let p = Policy::default();
    assert!(!eligible(&sick("a", "1.0.0"), &p));
    assert_eq!(
        ineligible(&sick("a", "1.0.0"), &p).as_deref(),
        Some("unhealthy (engine: health: 3 failures: HTTP 500)")
    );
    let plain_sick = Member {
        healthy: false,
        ..plain("p")
    };
    assert!(!eligible(&plain_sick, &p), "without a tool too");
    // The healthy version is preferred, however old.
    let members = [sick("a", "2.0.0"), m("b", "1.0.0", true)];
    assert_eq!(
        preferred(&members, &p).map(|v| v.to_string()).as_deref(),
        Some("1.0.0")
    );
    // Records of older sup-leases know nothing of health: healthy.
    let old: Member = serde_json::from_str(
        r#"{"node":"a","version":"1.0.0","committed":true,"irreversible":false}"#,
    )
    .expect("an older record");
    assert!(old.healthy && old.reason.is_none() && eligible(&old, &p));
    let text = serde_json::to_string(&m("a", "1.0.0", true)).expect("json");
    assert!(!text.contains("reason"), "no reason when healthy: {text}");
}

#[test]
fn a_holder_that_turns_unhealthy_steps_down_at_once() {
    let p = Policy::default();
    let at = |ms: u64| Boot(ms * 1_000_000);
    let la = Leader {
        node: "a".into(),
        version: Some("1.0.0".into()),
        epoch: 1,
    };
    let healthy = [m("a", "1.0.0", true), m("b", "1.0.0", true)];
    let (d, mem) = decide(
        &view("a", &healthy, Some((&la, 5)), &p, at(0), true),
        &Memory::default(),
    );
    assert!(matches!(d, Decision::Lead { .. }), "{d:?}");
    let turned = [sick("a", "1.0.0"), m("b", "1.0.0", true)];
    let (d, _) = decide(&view("a", &turned, Some((&la, 5)), &p, at(300), true), &mem);
    match d {
        Decision::StepDown(why) => assert!(why.contains("unhealthy (engine: health"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Once the key is given up, the healthy member takes it at once (it is the preferred
    // one now), and the unhealthy one does not, however long it waits.
    let (d, _) = decide(
        &view("b", &turned, None, &p, at(600), false),
        &Memory::default(),
    );
    assert_eq!(d, Decision::Acquire);
    let (_, mut mem) = decide(
        &view("a", &turned, None, &p, at(600), false),
        &Memory::default(),
    );
    for t in [900, 1800, 5000] {
        let (d, m2) = decide(&view("a", &turned, None, &p, at(t), false), &mem);
        assert!(matches!(d, Decision::Follow(_)), "at {t}: {d:?}");
        mem = m2;
    }
    // An unhealthy holder that does not step down (its sup-lease is wedged) is taken
    // over after 2T, as any holder that is not eligible.
    let (_, mem) = decide(
        &view("b", &turned, Some((&la, 5)), &p, at(0), false),
        &Memory::default(),
    );
    assert_eq!(
        decide(
            &view("b", &turned, Some((&la, 5)), &p, at(1800), false),
            &mem
        )
        .0,
        Decision::TakeOver { revision: 5 }
    );
}

#[test]
fn a_preferred_member_back_from_unhealthy_waits_t_healthy_before_the_holder_steps_down() {
    let p = Policy::default();
    let at = |ms: u64| Boot(ms * 1_000_000);
    let la = Leader {
        node: "a".into(),
        version: Some("1.0.0".into()),
        epoch: 1,
    };
    // b has the newer version but was unhealthy (held out) all along.
    let held = [m("a", "1.0.0", true), sick("b", "2.0.0")];
    let (_, mut mem) = decide(
        &view("a", &held, Some((&la, 5)), &p, at(0), true),
        &Memory::default(),
    );
    for t in [900, 1800] {
        let (d, m2) = decide(&view("a", &held, Some((&la, 5)), &p, at(t), true), &mem);
        assert!(matches!(d, Decision::Lead { .. }), "at {t}: {d:?}");
        mem = m2;
    }
    // b's hold ends: a steps down for it only after b was healthy for T.
    let back = [m("a", "1.0.0", true), m("b", "2.0.0", true)];
    for t in [2100, 2700] {
        let (d, m2) = decide(&view("a", &back, Some((&la, 5)), &p, at(t), true), &mem);
        assert!(matches!(d, Decision::Lead { .. }), "at {t}: {d:?}");
        mem = m2;
    }
    let (d, _) = decide(&view("a", &back, Some((&la, 5)), &p, at(3000), true), &mem);
    assert!(matches!(d, Decision::StepDown(_)), "{d:?}");
}

#[test]
fn leadership_leaves_an_unhealthy_holder_without_overlap_and_stays_away() {
    let mut s = Sim::new(&[("n1", "0.6.2"), ("n2", "0.6.2"), ("n3", "0.6.2")]);
    s.run(10);
    let first = s.holder().expect("someone leads");
    s.health(&first, false);
    s.run(3);
    let second = s.holder().expect("another one leads within a tick or two");
    assert_ne!(second, first);
    // Healthy again (its hold over): leadership stays where it is, no flap back.
    s.health(&first, true);
    s.run(20);
    assert_eq!(s.holder(), Some(second.clone()));
    assert_eq!(s.leads, vec![first.clone(), second.clone()]);
    // Every member unhealthy: nobody leads.
    for n in ["n1", "n2", "n3"] {
        s.health(n, false);
    }
    s.run(5);
    assert_eq!(s.holder(), None, "{:?}", s.leads);
    s.health(&first, true);
    s.run(5);
    assert_eq!(s.holder(), Some(first));
}

#[test]
fn an_unhealthy_newer_version_does_not_take_leadership_until_it_recovers() {
    let mut s = Sim::new(&[("n1", "0.6.2"), ("n2", "0.6.2")]);
    s.run(10);
    let first = s.holder().expect("someone leads");
    let other = if first == "n1" { "n2" } else { "n1" };
    s.set(other, "0.8.1", true, false);
    s.health(other, false);
    s.run(15);
    assert_eq!(s.holder().as_deref(), Some(first.as_str()));
    s.health(other, true);
    s.run(15);
    assert_eq!(s.holder().as_deref(), Some(other), "{:?}", s.leads);
}

mod failing;
mod faults;
mod trials;

/// The holder `leader` (node "a")'s decision once the others have been live for T.
fn holder_after_t(members: &[Member], leader: &Leader, p: &Policy) -> Decision {
    let at = |ms: u64| Boot(ms * 1_000_000);
    let (_, mem) = decide(
        &view("a", members, Some((leader, 5)), p, at(0), true),
        &Memory::default(),
    );
    decide(
        &view("a", members, Some((leader, 5)), p, at(900), true),
        &mem,
    )
    .0
}

/// `me`'s decision at its first look at an empty `leader` key.
fn empty_key(me: &str, members: &[Member], p: &Policy) -> Decision {
    let at = |ms: u64| Boot(ms * 1_000_000);
    decide(
        &view(me, members, None, p, at(0), false),
        &Memory::default(),
    )
    .0
}

// Issue 22 -------------------------------------------------------------------------

#[test]
fn i22_a_successor_leads_at_once_after_a_clean_release_or_an_expiry_and_waits_t_otherwise() {
    let at = |ms: u64| Boot(ms * 1_000_000);
    let took = at(10_000);
    let from = |seen, released, ended| lead_from_after_acquire(seen, released, ended, took, T);
    // Released: the mark names the term this node last saw.
    assert_eq!(from(Some(7), Some(7), None), took);
    // A mark of an older term (this node saw a later holder, whose key just vanished):
    // nothing is proven about the later one.
    assert_eq!(from(Some(9), Some(7), None), took.plus(T));
    // Never saw a holder (just started): T.
    assert_eq!(from(None, Some(7), None), took.plus(T));
    // The store lease of term 9 ended, its holder's last write seen T ago (an expiry):
    // at once; seen T/4 ago (a revoke soon after a renewal): 3T/4 more.
    let ended = |ms| Some((9, at(ms)));
    assert_eq!(from(Some(9), None, ended(10_000 - 900)), took);
    assert_eq!(from(Some(9), None, ended(10_000 - 2_000)), took);
    assert_eq!(
        from(Some(9), None, ended(10_000 - 225)),
        took.plus(T * 3 / 4)
    );
    // An end of another term than the one last seen: T.
    assert_eq!(from(Some(11), None, ended(1_000)), took.plus(T));
    // The rule remembers the last term it saw, and keeps it while the key is empty.
    let members = [m("a", "0.6.2", true), m("b", "0.6.2", true)];
    let p = pol(Strategy::Newest, None, None);
    let la = Leader {
        node: "a".into(),
        version: Some("0.6.2".into()),
        epoch: 0,
    };
    let (_, mem) = decide(
        &view("b", &members, Some((&la, 9)), &p, took, false),
        &Memory::default(),
    );
    assert_eq!(mem.last_term, Some(9));
    let (d, mem) = decide(&view("b", &members, None, &p, took, false), &mem);
    assert_eq!((d, mem.last_term), (Decision::Acquire, Some(9)));
}

#[test]
fn i22_a_silent_store_or_supd_ends_renewals_then_the_key_after_the_last_grant() {
    let at = |ms: u64| Boot(ms * 1_000_000);
    // T = 900 ms: keepalives unanswered since 1 s go on until 1.45 s (T/2), then stop.
    assert!(!stop_renewing(Some(at(1_000)), at(1_400), T));
    assert!(stop_renewing(Some(at(1_000)), at(1_450), T));
    assert!(stop_renewing(None, at(0), T));
    // The key goes once the last grant sent (to 1.45 s) and its kill grace are over.
    assert_eq!(give_up_from(Some(at(1_450)), at(1_500), T), at(1_450 + 225));
    assert_eq!(
        give_up_from(None, at(1_500), T),
        at(1_500),
        "none sent: at once"
    );
}

/// Review of issue 22: a holder that took the key over (or took an empty key it must
/// wait T on) waits out the old holder's grant (`lead_from`). One tick that cannot
/// prove it owns `leader` (the ownership transaction failed: a slow or lost store
/// answer) or whose renewal is older than T/2 (a slow tick) is a Fence; the key is still
/// its own at the next tick, and the wait must go on: the old holder's runs may live
/// until T after the takeover.
#[test]
fn review_a_fence_during_the_wait_after_a_takeover_does_not_end_the_wait() {
    let at = |ms: u64| Boot(ms * 1_000_000);
    let members = [m("a", "0.6.2", true), m("b", "0.8.1", true)];
    let p = pol(Strategy::Newest, None, None);
    let lb = Leader {
        node: "b".into(),
        version: Some("0.8.1".into()),
        epoch: 1,
    };
    // b took over at 1000: it leads from 1900.
    let mem = Memory {
        lead_from: Some(at(1_900)),
        ..Memory::default()
    };
    let (d, mem) = decide(
        &view("b", &members, Some((&lb, 12)), &p, at(1_300), true),
        &mem,
    );
    assert!(matches!(d, Decision::Wait(_)), "{d:?}");
    // One tick whose ownership transaction got no answer.
    let (d, mem) = decide(
        &view("b", &members, Some((&lb, 12)), &p, at(1_600), false),
        &mem,
    );
    assert!(matches!(d, Decision::Fence(_)), "{d:?}");
    // The key is still b's: it must still wait until 1900.
    let (d, _) = decide(
        &view("b", &members, Some((&lb, 12)), &p, at(1_610), true),
        &mem,
    );
    assert!(
        matches!(d, Decision::Wait(_)),
        "b leads at 1610 though the old holder's grant may run until 1900: {d:?}"
    );
}
