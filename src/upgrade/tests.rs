use super::*;

fn facts() -> Facts {
    Facts {
        installed: true,
        not_executable: None,
        manifest_irreversible: false,
        probation: Duration::from_secs(2),
        clocks: clocks(1000),
    }
}

/// The clocks at wall-clock `ms`, in boot "b1" at BOOTTIME `ms` too.
fn clocks(ms: u64) -> Clocks {
    Clocks {
        wall_ms: ms,
        boot_id: "b1".into(),
        boot_ms: ms,
    }
}

/// A self-switch with a probation of 2 s, to an irreversible version or not.
fn sw(irreversible: bool) -> SelfSwitch {
    SelfSwitch {
        probation: Duration::from_secs(2),
        manifest_irreversible: irreversible,
    }
}

fn req(v: &str) -> Request {
    Request {
        version: v.into(),
        force: false,
        irreversible: false,
    }
}

fn at(current: &str) -> Record {
    Record {
        current: Some(current.into()),
        phase: Phase::Committed,
        ..Record::default()
    }
}

#[test]
fn refusals_change_nothing() {
    let mut bad = at("1.0.0");
    bad.bad.insert(
        "2.0.0".into(),
        BadMark {
            reason: "crash loop".into(),
            time_ms: 5,
        },
    );
    let mut in_probation = at("1.0.0");
    in_probation.phase = Phase::Probation;
    in_probation.proposed = Some("1.5.0".into());
    let table: Vec<(&str, Record, Request, Facts, &str)> = vec![
        (
            "not installed",
            at("1.0.0"),
            req("2.0.0"),
            Facts {
                installed: false,
                ..facts()
            },
            "is not installed",
        ),
        (
            "not executable",
            at("1.0.0"),
            req("2.0.0"),
            Facts {
                not_executable: Some("bin/agent: Permission denied".into()),
                ..facts()
            },
            "cannot run: bin/agent",
        ),
        (
            "bad",
            bad.clone(),
            req("2.0.0"),
            facts(),
            "is marked bad (crash loop); --force",
        ),
        (
            "probation",
            in_probation,
            req("2.0.0"),
            facts(),
            "in probation",
        ),
        (
            "same",
            at("1.0.0"),
            req("1.0.0"),
            facts(),
            "already at 1.0.0",
        ),
    ];
    for (what, r, q, f, msg) in table {
        let e = begin_upgrade("agent", &r, &q, &f).expect_err(what);
        assert!(e.contains(msg), "{what}: {e}");
    }
}

#[test]
fn an_upgrade_records_its_intent() {
    let n = begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &facts()).expect("upgrade");
    assert_eq!(n.phase, Phase::Probation);
    assert_eq!(
        (
            n.current.as_deref(),
            n.from.as_deref(),
            n.proposed.as_deref()
        ),
        (Some("2.0.0"), Some("1.0.0"), Some("2.0.0"))
    );
    assert_eq!((n.started_ms, n.deadline_ms), (Some(1000), Some(3000)));
    assert_eq!(n.attempts["2.0.0"], 1);
    assert!(!n.irreversible_upgrade);
}

#[test]
fn force_clears_the_mark_and_counts_the_attempt() {
    let mut r = at("1.0.0");
    r.bad.insert(
        "2.0.0".into(),
        BadMark {
            reason: "crash loop".into(),
            time_ms: 5,
        },
    );
    r.attempts.insert("2.0.0".into(), 1);
    let n = begin_upgrade(
        "agent",
        &r,
        &Request {
            force: true,
            ..req("2.0.0")
        },
        &facts(),
    )
    .expect("forced");
    assert!(n.bad.is_empty());
    assert_eq!(n.attempts["2.0.0"], 2);
}

#[test]
fn force_to_the_current_version_clears_its_mark() {
    let mut r = at("1.0.0");
    r.phase = Phase::Failed;
    r.bad.insert(
        "1.0.0".into(),
        BadMark {
            reason: "crash loop".into(),
            time_ms: 5,
        },
    );
    let mut force = req("1.0.0");
    let plain = clear_current_mark("agent", &r, &force).expect("for the current version");
    assert!(plain
        .expect_err("no --force")
        .contains("marked bad (crash loop); --force clears"),);
    force.force = true;
    let n = clear_current_mark("agent", &r, &force)
        .expect("for the current version")
        .expect("cleared");
    assert!(n.bad.is_empty());
    assert_eq!(n.phase, Phase::Committed);
    assert_eq!(n.current.as_deref(), Some("1.0.0"));
    assert_eq!(n.attempts, r.attempts, "not an attempt: nothing runs anew");
    // Nothing to clear: already there.
    let e = clear_current_mark("agent", &at("1.0.0"), &force).expect("current");
    assert!(e.expect_err("no mark").contains("already at 1.0.0"));
    // Another version: an upgrade proper.
    assert!(clear_current_mark("agent", &r, &req("2.0.0")).is_none());
}

#[test]
fn probation_outcomes() {
    let base = begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &facts()).expect("upgrade");
    let ok = probation_passed(&base, Duration::ZERO, &clocks(0));
    assert_eq!(
        (
            ok.phase,
            ok.current.as_deref(),
            ok.previous.as_deref(),
            ok.from.as_deref()
        ),
        (Phase::Committed, Some("2.0.0"), Some("1.0.0"), None)
    );

    let (rb, out) = probation_failed(&base, "crash loop: 3 restarts within 1s", 2000);
    assert_eq!(out, Outcome::RollBack("1.0.0".into()));
    assert_eq!(
        (rb.phase, rb.current.as_deref()),
        (Phase::RolledBack, Some("1.0.0"))
    );
    assert_eq!(
        rb.bad["2.0.0"],
        BadMark {
            reason: "crash loop: 3 restarts within 1s".into(),
            time_ms: 2000
        }
    );

    let irr = begin_upgrade(
        "agent",
        &at("1.0.0"),
        &Request {
            irreversible: true,
            ..req("2.0.0")
        },
        &facts(),
    )
    .expect("upgrade");
    let (f, out) = probation_failed(&irr, "crash loop", 2000);
    assert_eq!(out, Outcome::Stay);
    assert_eq!(
        (f.phase, f.current.as_deref()),
        (Phase::Failed, Some("2.0.0"))
    );
    assert!(
        f.bad.is_empty(),
        "an irreversible version is not marked bad: it stays"
    );
    assert!(f.irreversible.contains("2.0.0"));

    let manifest = begin_upgrade(
        "agent",
        &at("1.0.0"),
        &req("2.0.0"),
        &Facts {
            manifest_irreversible: true,
            ..facts()
        },
    )
    .expect("upgrade");
    assert_eq!(probation_failed(&manifest, "x", 1).1, Outcome::Stay);

    let first = begin_upgrade("agent", &Record::default(), &req("1.0.0"), &facts()).expect("first");
    let (f, out) = probation_failed(&first, "crash loop", 2000);
    assert_eq!((f.phase, out), (Phase::Failed, Outcome::Stay));
    assert!(f.bad.contains_key("1.0.0"));
}

#[test]
fn a_probation_ended_by_a_refused_start_marks_nothing_bad() {
    let base = begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &facts()).expect("upgrade");
    let (rb, out) = probation_refused(&base, "agent: cannot start: permission denied");
    assert_eq!(out, Outcome::RollBack("1.0.0".into()));
    assert_eq!(
        (rb.phase, rb.current.as_deref(), rb.reason.as_deref()),
        (
            Phase::RolledBack,
            Some("1.0.0"),
            Some("agent: cannot start: permission denied")
        )
    );
    assert!(rb.bad.is_empty(), "not the version's fault: {:?}", rb.bad);
    // Mended, it may be tried again without --force.
    assert!(begin_upgrade("agent", &rb, &req("2.0.0"), &facts()).is_ok());

    let first = begin_upgrade("agent", &Record::default(), &req("1.0.0"), &facts()).expect("first");
    let (f, out) = probation_refused(&first, "permission denied");
    assert_eq!((f.phase, out), (Phase::Failed, Outcome::Stay));
    assert!(f.bad.is_empty());
}

#[test]
fn operator_rollbacks() {
    let mut r = probation_passed(
        &begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &facts()).expect("up"),
        Duration::ZERO,
        &clocks(0),
    );
    let installed = |_: &str| true;
    let (n, to) = begin_rollback("agent", &r, None, false, installed).expect("rollback");
    assert_eq!(
        (
            to.as_str(),
            n.current.as_deref(),
            n.previous.as_deref(),
            n.phase
        ),
        ("1.0.0", Some("1.0.0"), Some("2.0.0"), Phase::RolledBack)
    );

    r.irreversible.insert("2.0.0".into());
    let e = begin_rollback("agent", &r, None, false, installed).expect_err("crosses 2.0.0");
    assert!(e.contains("crosses the irreversible version 2.0.0"), "{e}");
    assert!(
        begin_rollback("agent", &r, None, true, installed).is_ok(),
        "--force goes across"
    );

    // Crossing is about the versions in between, not only the current one.
    let mut r3 = at("3.0.0");
    r3.irreversible.insert("2.0.0".into());
    assert!(begin_rollback("agent", &r3, Some("2.5.0"), false, installed).is_ok());
    assert!(begin_rollback("agent", &r3, Some("1.0.0"), false, installed).is_err());

    assert!(
        begin_rollback("agent", &at("1.0.0"), None, false, installed)
            .expect_err("no previous")
            .contains("no previous version")
    );
    assert!(
        begin_rollback("agent", &r3, Some("2.5.0"), false, |_| false)
            .expect_err("missing")
            .contains("not installed")
    );
}

#[test]
fn a_tool_that_switches_itself_gets_probation() {
    let r = at("1.0.0");
    let (n, c) = on_start(&r, "1.0.0", &sw(false), &clocks(10));
    let seen = Record {
        link_seen: true,
        ..r.clone()
    };
    assert_eq!((c, n), (StartCheck::Expected, seen.clone()));
    let (n, _) = on_start(&seen, "1.0.0", &sw(false), &clocks(10));
    assert_eq!(n, seen, "seen already: nothing to write");
    let (n, c) = on_start(&r, "1.1.0", &sw(false), &clocks(10));
    assert_eq!(c, StartCheck::SelfUpgrade);
    assert_eq!(
        (
            n.phase,
            n.from.as_deref(),
            n.current.as_deref(),
            n.deadline_ms
        ),
        (Phase::Probation, Some("1.0.0"), Some("1.1.0"), Some(2010))
    );
    let mut bad = r.clone();
    bad.bad.insert(
        "1.1.0".into(),
        BadMark {
            reason: "x".into(),
            time_ms: 1,
        },
    );
    assert_eq!(
        on_start(&bad, "1.1.0", &sw(false), &clocks(10)).1,
        StartCheck::SwitchBack("1.0.0".into())
    );
    let (n, c) = on_start(&Record::default(), "0.9.0", &sw(false), &clocks(10));
    assert_eq!(
        (c, n.phase, n.current.as_deref()),
        (StartCheck::Expected, Phase::Committed, Some("0.9.0"))
    );
}

/// Every point where a crash can leave the record and the link apart.
#[test]
fn reconcile_after_a_crash() {
    let before = at("1.0.0");
    let intent = begin_upgrade("agent", &before, &req("2.0.0"), &facts()).expect("up");
    let (rolled, _) = probation_failed(&intent, "crash loop", 2000);
    let table: Vec<(&str, &Record, Option<&str>, Fix)> = vec![
        ("before the intent", &before, Some("1.0.0"), Fix::Nothing),
        (
            "intent written, not switched",
            &intent,
            Some("1.0.0"),
            Fix::SwitchTo("2.0.0".into()),
        ),
        (
            "switched, in probation",
            &intent,
            Some("2.0.0"),
            Fix::Nothing,
        ),
        (
            "rollback written, not switched",
            &rolled,
            Some("2.0.0"),
            Fix::SwitchTo("1.0.0".into()),
        ),
        ("rolled back", &rolled, Some("1.0.0"), Fix::Nothing),
    ];
    for (what, r, link, fix) in table {
        let (n, got) = reconcile(r, link, &clocks(50_000));
        assert_eq!(got, fix, "{what}");
        let after = match &got {
            Fix::SwitchTo(v) => Some(v.as_str()),
            Fix::Nothing => link,
        };
        assert_eq!(
            n.current.as_deref(),
            after,
            "{what}: the record agrees with the link"
        );
        assert_eq!(n.bad, r.bad, "{what}: bad marks are kept");
    }
    // A probation that resumes keeps its deadline; one whose switch was redone restarts it.
    assert_eq!(
        reconcile(&intent, Some("2.0.0"), &clocks(50_000))
            .0
            .deadline_ms,
        Some(3000)
    );
    assert_eq!(
        reconcile(&intent, Some("1.0.0"), &clocks(50_000))
            .0
            .deadline_ms,
        Some(52_000)
    );
    // No record yet: the link is committed.
    let (n, f) = reconcile(&Record::default(), Some("0.5.0"), &clocks(1));
    assert_eq!(
        (n.phase, n.current.as_deref(), f),
        (Phase::Committed, Some("0.5.0"), Fix::Nothing)
    );
}

/// A probation's deadline never depends on the wall clock: stepped a day back or ahead,
/// what is left is the same (see: issue 9, item 7).
#[test]
fn a_wall_clock_step_neither_extends_nor_shortens_a_probation() {
    let day = 86_400_000;
    let r = begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &facts()).expect("up");
    assert_eq!(
        (r.probation_ms, r.boot_id.as_deref(), r.boot_deadline_ms),
        (Some(2000), Some("b1"), Some(3001)),
        "a millisecond more: boot_ms is rounded down"
    );
    // 500 ms later on BOOTTIME, whatever the wall clock says.
    for wall in [1500, 0, 1500 + day] {
        let c = Clocks {
            wall_ms: wall,
            boot_id: "b1".into(),
            boot_ms: 1500,
        };
        assert_eq!(
            probation_left(&r, &c),
            Duration::from_millis(1501),
            "{wall}"
        );
        // Written just now (a supd re-executed): it goes on as it was.
        let w = noted(&r, &c);
        assert_eq!(resume(&w, &c), w, "same boot: nothing to rewrite");
    }
    // Past the deadline: nothing left; a corrupt deadline is clamped to the length.
    let late = Clocks {
        boot_ms: 9000,
        ..clocks(0)
    };
    assert_eq!(probation_left(&r, &late), Duration::ZERO);
    let mut far = r.clone();
    far.boot_deadline_ms = Some(u64::MAX);
    assert_eq!(probation_left(&far, &clocks(1500)), Duration::from_secs(2));
}

#[test]
fn another_boot_or_an_old_record_starts_a_fresh_probation() {
    let r = begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &facts()).expect("up");
    let reboot = Clocks {
        wall_ms: 7,
        boot_id: "b2".into(),
        boot_ms: 40,
    };
    assert_eq!(probation_left(&r, &reboot), Duration::from_secs(2));
    let n = resume(&r, &reboot);
    assert_eq!(
        (n.boot_id.as_deref(), n.boot_deadline_ms, n.deadline_ms),
        (Some("b2"), Some(2041), Some(2007))
    );
    assert_eq!(resume(&n, &reboot), n, "then it resumes in that boot");
    // A record of an older supd: wall-clock times only. Its length is their difference.
    let mut old = r.clone();
    (old.probation_ms, old.boot_id, old.boot_deadline_ms) = (None, None, None);
    assert_eq!(probation_length(&old), Duration::from_secs(2));
    let n = resume(&old, &clocks(100));
    assert_eq!(
        (n.probation_ms, n.boot_deadline_ms),
        (Some(2000), Some(2101))
    );
    let json = r#"{"current":"2.0.0","phase":"probation","proposed":"2.0.0","from":"1.0.0","started_ms":5,"deadline_ms":18446744073709551615}"#;
    let old: Record = serde_json::from_str(json).expect("an old record loads");
    assert_eq!(probation_length(&old), crate::time::MAX_DURATION, "clamped");
    // An unreadable boot id resumes nothing.
    let blind = Clocks {
        boot_id: String::new(),
        ..clocks(1500)
    };
    assert_eq!(probation_left(&r, &blind), Duration::from_secs(2));
}

#[test]
fn huge_lengths_saturate() {
    let f = Facts {
        probation: Duration::from_secs(u64::MAX),
        clocks: Clocks {
            wall_ms: u64::MAX - 5,
            boot_id: "b1".into(),
            boot_ms: u64::MAX - 5,
        },
        ..facts()
    };
    let n = begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &f).expect("up");
    assert_eq!(n.deadline_ms, Some(u64::MAX));
    assert_eq!(
        n.probation_ms,
        Some(crate::time::MAX_DURATION.as_millis() as u64)
    );
}

fn bad_mark() -> BadMark {
    BadMark {
        reason: "x".into(),
        time_ms: 1,
    }
}

/// Issue 21, item 3: a switch during another version's probation rolls back, on
/// failure, to the last committed version; the one in probation is never the target.
#[test]
fn a_self_switch_in_probation_keeps_the_last_committed_as_target() {
    let p = begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &facts()).expect("up");
    let (n, c) = on_start(&p, "2.1.0", &sw(false), &clocks(100));
    assert_eq!(c, StartCheck::SelfUpgrade);
    assert_eq!(
        (n.from.as_deref(), n.proposed.as_deref(), n.phase),
        (Some("1.0.0"), Some("2.1.0"), Phase::Probation)
    );
    let (f, out) = probation_failed(&n, "crash loop", 500);
    assert_eq!(out, Outcome::RollBack("1.0.0".into()));
    assert!(f.bad.contains_key("2.1.0") && !f.bad.contains_key("2.0.0"));
    // Outside a probation the version that runs is the one to go back to.
    let (n, _) = on_start(&at("1.0.0"), "1.1.0", &sw(false), &clocks(100));
    assert_eq!(n.from.as_deref(), Some("1.0.0"));
    // A first version in probation: nothing committed, nothing to go back to.
    let first = begin_upgrade("agent", &Record::default(), &req("1.0.0"), &facts()).expect("up");
    let (n, _) = on_start(&first, "1.1.0", &sw(false), &clocks(100));
    assert_eq!(probation_failed(&n, "x", 1).1, Outcome::Stay);
}

/// Issue 21, item 4: a self-switch to a version whose manifest says `revertible = false`
/// is irreversible; a switch away from an irreversible version in probation too.
#[test]
fn a_self_switch_to_an_irreversible_version_stays() {
    let (n, _) = on_start(&at("1.0.0"), "2.0.0", &sw(true), &clocks(100));
    assert!(n.irreversible_upgrade && n.irreversible.contains("2.0.0"));
    let (f, out) = probation_failed(&n, "crash loop", 500);
    assert_eq!((f.phase, out), (Phase::Failed, Outcome::Stay));
    assert_eq!(f.current.as_deref(), Some("2.0.0"));
    // From the irreversible 2.0.0, still in probation, to 2.1.0: no way back either.
    let (m, _) = on_start(&n, "2.1.0", &sw(false), &clocks(200));
    assert!(m.irreversible_upgrade);
    assert_eq!(probation_failed(&m, "x", 1).1, Outcome::Stay);
}

/// Issue 21, item 7: a rollback is carried out after a crash only while the link still
/// names what it rolled back from; a link moved to a third version is a self-switch.
#[test]
fn a_link_moved_after_a_rollback_is_not_switched_back() {
    let intent = begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &facts()).expect("up");
    let (rolled, _) = probation_failed(&intent, "crash loop", 2000);
    assert_eq!(rolled.rolled_back_from.as_deref(), Some("2.0.0"));
    assert_eq!(
        reconcile(&rolled, Some("2.0.0"), &clocks(1)).1,
        Fix::SwitchTo("1.0.0".into())
    );
    assert_eq!(
        reconcile(&rolled, Some("3.0.0"), &clocks(1)).1,
        Fix::Nothing
    );
    // An operator's rollback: from what it left.
    let committed = probation_passed(&intent, Duration::ZERO, &clocks(1));
    let (op, _) = begin_rollback("agent", &committed, None, false, |_| true).expect("rb");
    assert_eq!(
        reconcile(&op, Some("2.0.0"), &clocks(1)).1,
        Fix::SwitchTo("1.0.0".into())
    );
    assert_eq!(reconcile(&op, Some("3.0.0"), &clocks(1)).1, Fix::Nothing);
    // A record of an older supd (no `rolled_back_from`): the bad version, or previous.
    let mut old = rolled.clone();
    old.rolled_back_from = None;
    assert_eq!(
        reconcile(&old, Some("2.0.0"), &clocks(1)).1,
        Fix::SwitchTo("1.0.0".into())
    );
    assert_eq!(reconcile(&old, Some("3.0.0"), &clocks(1)).1, Fix::Nothing);
}

/// Issue 21, item 1: a probation that waits (its leader-only services do not run here)
/// keeps what is left of it, across restarts of supd and in another boot.
#[test]
fn a_paused_probation_keeps_what_is_left() {
    let p = begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &facts()).expect("up");
    // facts(): a probation of 2 s from 1000 ms; paused at 1500 ms: 1.5 s left.
    let paused = pause(&p, &clocks(1500)).expect("paused");
    assert!(self::paused(&paused));
    assert!(pause(&paused, &clocks(1600)).is_none(), "already paused");
    assert_eq!(
        probation_left(&paused, &clocks(90_000)),
        Duration::from_millis(1501)
    );
    // supd restarted, same boot: still paused, the same left.
    assert_eq!(resume(&paused, &clocks(90_000)), paused);
    let on = unpause(&paused, &clocks(90_000)).expect("counts");
    assert!(!self::paused(&on));
    assert_eq!(
        probation_left(&on, &clocks(90_000)),
        Duration::from_millis(1501)
    );
    assert_eq!(
        probation_left(&on, &clocks(91_000)),
        Duration::from_millis(501)
    );
    assert!(unpause(&on, &clocks(1)).is_none(), "not paused");
    // Another boot: paused still, the whole probation again.
    let other = Clocks {
        boot_id: "b2".into(),
        ..clocks(5)
    };
    let again = resume(&paused, &other);
    assert!(self::paused(&again));
    assert_eq!(probation_left(&again, &other), Duration::from_secs(2));
    // No pause outside a probation.
    assert!(pause(&at("1.0.0"), &clocks(1)).is_none());
}

/// Issue 21, item 2: the crash histories of a watched version are kept in its record,
/// for this boot only, and a probation's end forgets them.
#[test]
fn a_probation_keeps_its_crash_histories() {
    use crate::time::Mono;
    let p = begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &facts()).expect("up");
    let mut h = History::default();
    h.recent.push_back(Mono(5));
    h.streak = 1;
    let n = note_history(&p, "agent", &h, &clocks(1200)).expect("noted");
    assert_eq!(n.histories.get("agent"), Some(&h));
    assert!(
        note_history(&n, "agent", &h, &clocks(1200)).is_none(),
        "unchanged"
    );
    assert_eq!(resume(&n, &clocks(1300)).histories.get("agent"), Some(&h));
    let other = Clocks {
        boot_id: "b2".into(),
        ..clocks(5)
    };
    assert!(resume(&n, &other).histories.is_empty(), "another boot");
    assert!(probation_failed(&n, "x", 1).0.histories.is_empty());
    assert!(probation_passed(&n, Duration::ZERO, &clocks(3000))
        .histories
        .is_empty());
    // Not watched: nothing kept.
    assert!(note_history(&at("1.0.0"), "agent", &h, &clocks(1)).is_none());
}

/// Issue 21, item 9: after a commit the regression window watches; a failure in it
/// rolls back and marks the version bad as in probation; irreversible stays.
#[test]
fn a_regression_window_rolls_back_as_a_probation() {
    let p = begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &facts()).expect("up");
    let c = probation_passed(&p, Duration::from_secs(30), &clocks(3000));
    assert_eq!(
        window_left(&c, &clocks(3000)),
        Some(Duration::from_millis(30_001))
    );
    assert!(watched(&c, &clocks(10_000)));
    assert!(!watched(&c, &clocks(40_000)), "over");
    assert_eq!(
        window_left(
            &probation_passed(&p, Duration::ZERO, &clocks(3000)),
            &clocks(3000)
        ),
        None
    );
    let (r, out) = regressed(&c, "crash loop", 9000);
    assert_eq!(out, Outcome::RollBack("1.0.0".into()));
    assert_eq!(
        (r.phase, r.current.as_deref(), r.rolled_back_from.as_deref()),
        (Phase::RolledBack, Some("1.0.0"), Some("2.0.0"))
    );
    assert!(r.bad["2.0.0"]
        .reason
        .contains("regression after its commit: crash loop"));
    assert_eq!(window_left(&r, &clocks(9000)), None);
    // Irreversible: stays, failed, marked bad? no: as in probation, not marked.
    let mut irr = c.clone();
    irr.irreversible.insert("2.0.0".into());
    let (f, out) = regressed(&irr, "crash loop", 9000);
    assert_eq!(
        (f.phase, out, f.current.as_deref()),
        (Phase::Failed, Outcome::Stay, Some("2.0.0"))
    );
    let over = window_over(&c);
    assert_eq!(window_left(&over, &clocks(4000)), None);
    // A new boot: the window whole again.
    let other = Clocks {
        boot_id: "b2".into(),
        ..clocks(5)
    };
    assert_eq!(
        window_left(&resume(&c, &other), &other),
        Some(Duration::from_millis(30_001))
    );
    let _ = bad_mark();
}

/// Issue 21: the time after a probation was last written does not count for it in a
/// supd started again (it may have been down for all of it, nothing of the version
/// watched); in another boot it begins again whole, as before.
#[test]
fn a_probation_goes_on_from_its_last_write() {
    // facts(): 2 s from 1000 ms; last written at 1000 ms.
    let p = noted(
        &begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &facts()).expect("up"),
        &clocks(1000),
    );
    assert_eq!(p.boot_noted_ms, Some(1000));
    // Written again at 1500 (a crash noted), supd down from then to 4000: 1.5 s left.
    let w = noted(&p, &clocks(1500));
    let r = resume(&w, &clocks(4000));
    assert_eq!(
        probation_left(&r, &clocks(4000)),
        Duration::from_millis(1501)
    );
    assert_eq!(r.deadline_ms, Some(5500));
    // Resumed at once: what it had.
    assert_eq!(
        probation_left(&resume(&w, &clocks(1500)), &clocks(1500)),
        Duration::from_millis(1501)
    );
    // A record of an older supd (nothing noted): its deadline as it was.
    let mut old = w.clone();
    old.boot_noted_ms = None;
    assert_eq!(
        probation_left(&resume(&old, &clocks(2500)), &clocks(2500)),
        Duration::from_millis(501)
    );
    // Paused, or not a probation: nothing noted.
    assert_eq!(noted(&at("1.0.0"), &clocks(9)), at("1.0.0"));
    let paused = pause(&p, &clocks(1200)).expect("paused");
    assert_eq!(noted(&paused, &clocks(1300)), paused);
}

/// A record whose window ends past its recorded length (garbage): never more than the
/// length is left, and none at all without a length.
#[test]
fn a_regression_window_is_never_longer_than_its_length() {
    let p = begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &facts()).expect("up");
    let mut c = probation_passed(&p, Duration::from_secs(1), &clocks(3000));
    c.window_boot_deadline_ms = Some(1 << 50);
    assert_eq!(
        window_left(&c, &clocks(3000)),
        Some(Duration::from_millis(1001))
    );
    c.window_ms = None;
    assert_eq!(window_left(&c, &clocks(3000)), None);
}

/// Issue 21, item 7 (an adversary's cases): once a service started on the version a
/// change named, the change was carried out: a link moved after it, even back to the
/// version rolled back from or to the probation's `from`, is not undone after a crash.
#[test]
fn a_change_seen_carried_out_is_not_redone_after_a_crash() {
    let intent = begin_upgrade("agent", &at("1.0.0"), &req("2.0.0"), &facts()).expect("up");
    assert!(!intent.link_seen);
    // Not seen: the switch was not made; made now.
    assert_eq!(
        reconcile(&intent, Some("1.0.0"), &clocks(1)).1,
        Fix::SwitchTo("2.0.0".into())
    );
    // 2.0.0 started: it was. The tool then pointed current back at 1.0.0: kept.
    let (ran, _) = on_start(&intent, "2.0.0", &sw(false), &clocks(2));
    assert!(ran.link_seen);
    assert_eq!(reconcile(&ran, Some("1.0.0"), &clocks(3)).1, Fix::Nothing);
    // An operator's rollback, carried out and seen: a link back on 2.0.0 is kept.
    let committed = probation_passed(&ran, Duration::ZERO, &clocks(5));
    let (rb, _) = begin_rollback("agent", &committed, None, false, |_| true).expect("rb");
    assert_eq!(
        reconcile(&rb, Some("2.0.0"), &clocks(6)).1,
        Fix::SwitchTo("1.0.0".into()),
        "not seen yet: carried out"
    );
    let (seen, _) = on_start(&rb, "1.0.0", &sw(false), &clocks(7));
    assert_eq!(reconcile(&seen, Some("2.0.0"), &clocks(8)).1, Fix::Nothing);
    // A probation's rollback likewise.
    let (failed, _) = probation_failed(&ran, "crash loop", 9);
    assert!(!failed.link_seen);
}

/// Found by the combination test: a tool in probation that switches back to the
/// version before it ends that probation (nothing marked bad); it is not a probation of
/// that version "from itself", whose failure rolled back to itself, marked bad.
#[test]
fn a_self_switch_back_to_from_ends_the_probation() {
    let p = begin_upgrade("agent", &at("1.1.0"), &req("1.0.0"), &facts()).expect("up");
    let (n, c) = on_start(&p, "1.1.0", &sw(false), &clocks(1500));
    assert_eq!(c, StartCheck::SwitchedBack);
    assert_eq!(
        (n.phase, n.current.as_deref(), n.from.as_deref()),
        (Phase::RolledBack, Some("1.1.0"), None)
    );
    assert!(n.bad.is_empty() && n.link_seen);
    assert_eq!(
        on_start(&n, "1.1.0", &sw(false), &clocks(1600)).1,
        StartCheck::Expected
    );
}
