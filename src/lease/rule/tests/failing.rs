//! A holder whose leader-only services cannot run (failed, in their crash-loop cooldown,
//! unhealthy) steps down for a member that is not failing, and stays out for a while.

use super::*;

fn failing(node: &str, version: &str) -> Member {
    Member {
        failing: Some("engine is in its crash-loop cooldown".into()),
        ..m(node, version, true)
    }
}

fn at(ms: u64) -> Boot {
    Boot(ms * 1_000_000)
}

fn leader(node: &str, version: &str) -> Leader {
    Leader {
        node: node.into(),
        version: Some(version.into()),
        epoch: 1,
    }
}

#[test]
fn a_failing_holder_steps_down_when_a_member_that_is_not_failing_is_live() {
    let p = Policy::default();
    let la = leader("a", "2.0.0");
    // The newer version holds; its engine fails. The older one is live and sound.
    let members = [failing("a", "2.0.0"), m("b", "1.0.0", true)];
    let (d, _) = decide(
        &view("a", &members, Some((&la, 5)), &p, at(0), true),
        &Memory::default(),
    );
    match d {
        Decision::StepDown(why) => assert!(
            why.contains("failing (engine is in its crash-loop cooldown)"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    // The key given up, the sound member takes it at once: it is the preferred one now.
    assert_eq!(empty_key("b", &members, &p), Decision::Acquire);
    // The failing one does not, however long it waits.
    let (_, mut mem) = decide(
        &view("a", &members, None, &p, at(0), false),
        &Memory::default(),
    );
    for t in [900, 1800, 5000] {
        let (d, m2) = decide(&view("a", &members, None, &p, at(t), false), &mem);
        assert!(matches!(d, Decision::Follow(_)), "at {t}: {d:?}");
        mem = m2;
    }
    // Others see it as a holder that may not lead: taken over after 2T if it does not go.
    let (_, mem) = decide(
        &view("b", &members, Some((&la, 5)), &p, at(0), false),
        &Memory::default(),
    );
    assert_eq!(
        decide(
            &view("b", &members, Some((&la, 5)), &p, at(1800), false),
            &mem
        )
        .0,
        Decision::TakeOver { revision: 5 }
    );
}

#[test]
fn a_failing_holder_keeps_the_lease_when_no_one_else_may_lead() {
    let la = leader("a", "2.0.0");
    // Alone, or beside members that are failing too or below the floor: it stays.
    let p = pol(Strategy::Newest, None, Some("2.0.0"));
    for members in [
        vec![failing("a", "2.0.0")],
        vec![failing("a", "2.0.0"), failing("b", "2.0.0")],
        vec![failing("a", "2.0.0"), m("b", "1.0.0", true)],
    ] {
        let d = holder_after_t(&members, &la, &p);
        assert!(matches!(d, Decision::Lead { .. }), "{members:?}: {d:?}");
    }
    // An empty key among failing members only is taken, as before.
    let members = [failing("a", "2.0.0"), failing("b", "1.0.0")];
    assert_eq!(
        empty_key("a", &members, &Policy::default()),
        Decision::Acquire
    );
}

#[test]
fn a_failing_member_is_set_aside_only_beside_a_sound_eligible_one() {
    let p = Policy::default();
    let weighed = weigh_failing(&[failing("a", "2.0.0"), m("b", "1.0.0", true)], &p);
    assert!(!eligible(&weighed[0], &p) && eligible(&weighed[1], &p));
    assert_eq!(
        ineligible(&weighed[0], &p).as_deref(),
        Some("failing (engine is in its crash-loop cooldown), and a member that is not failing may lead")
    );
    let alone = weigh_failing(&[failing("a", "2.0.0")], &p);
    assert!(eligible(&alone[0], &p));
    // Records of older sup-leases know nothing of it: not failing.
    let text = serde_json::to_string(&m("a", "1.0.0", true)).expect("json");
    assert!(!text.contains("failing"), "{text}");
}

#[test]
fn after_a_step_down_for_failing_the_node_stays_out_longer_each_time() {
    let ttl = T;
    let mut f = Fails::default();
    let sound = m("a", "2.0.0", true);
    // Leading well: nothing said.
    assert_eq!(f.offer(sound.clone(), true, at(0), ttl), sound);
    f.stepped_down("engine failed", at(1000), ttl);
    // Its services stopped, supd says nothing failing; the node says it for 2T.
    let c = f.offer(sound.clone(), false, at(1100), ttl);
    let why = c.failing.expect("held out");
    assert!(
        why.contains("engine failed") && why.contains("a candidate again in 1700ms"),
        "{why}"
    );
    assert_eq!(f.offer(sound.clone(), false, at(2800), ttl).failing, None);
    // Back, it led and failed again at once: 4T this time, then 8T.
    f.stepped_down("engine failed", at(3000), ttl);
    assert!(f
        .offer(sound.clone(), false, at(6500), ttl)
        .failing
        .is_some());
    assert_eq!(f.offer(sound.clone(), false, at(6600), ttl).failing, None);
    f.stepped_down("engine failed", at(7000), ttl);
    assert_eq!(f.strikes, 3);
    assert!(f
        .offer(sound.clone(), false, at(14_000), ttl)
        .failing
        .is_some());
    assert_eq!(f.offer(sound.clone(), false, at(14_200), ttl).failing, None);
    // Leading well for as long as its last hold (8T) forgets the strikes.
    f.offer(sound.clone(), true, at(20_000), ttl);
    f.offer(sound.clone(), true, at(27_000), ttl);
    assert_eq!(f.strikes, 3, "7s of 7.2s");
    f.offer(sound.clone(), true, at(27_200), ttl);
    assert_eq!(f.strikes, 0);
    // A hold never grows past 64T.
    assert_eq!(Fails::hold(40, ttl), ttl * 64);
}

#[test]
fn leadership_leaves_a_failing_holder_and_does_not_come_straight_back() {
    // Two nodes; a (newer, preferred) leads and its engine fails. It steps down, b
    // leads, and a's own hold keeps it out for 2T although supd no longer says failing.
    let p = Policy::default();
    let la = leader("a", "2.0.0");
    let lb = leader("b", "1.0.0");
    let ttl = T;
    let mut fa = Fails::default();
    let supd_says = failing("a", "2.0.0");
    let (d, _) = decide(
        &view(
            "a",
            &[supd_says.clone(), m("b", "1.0.0", true)],
            Some((&la, 5)),
            &p,
            at(0),
            true,
        ),
        &Memory::default(),
    );
    assert!(matches!(d, Decision::StepDown(_)), "{d:?}");
    fa.stepped_down("engine is in its crash-loop cooldown", at(0), ttl);
    // Released: supd says a is sound; a's candidacy still says failing. b leads.
    let a_now = fa.offer(m("a", "2.0.0", true), false, at(300), ttl);
    let members = [a_now, m("b", "1.0.0", true)];
    let (d, mem) = decide(
        &view("b", &members, Some((&lb, 9)), &p, at(300), true),
        &Memory::default(),
    );
    assert!(matches!(d, Decision::Lead { .. }), "{d:?}");
    // b does not step down for a while a is held out, whatever the time.
    let d = decide(
        &view("b", &members, Some((&lb, 9)), &p, at(1500), true),
        &mem,
    )
    .0;
    assert!(matches!(d, Decision::Lead { .. }), "{d:?}");
}
