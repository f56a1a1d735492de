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
    let ok = probation_passed(&base);
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
    let (n, c) = on_start(&r, "1.0.0", Duration::from_secs(2), &clocks(10));
    assert_eq!((c, n), (StartCheck::Expected, r.clone()));
    let (n, c) = on_start(&r, "1.1.0", Duration::from_secs(2), &clocks(10));
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
        on_start(&bad, "1.1.0", Duration::from_secs(2), &clocks(10)).1,
        StartCheck::SwitchBack("1.0.0".into())
    );
    let (n, c) = on_start(
        &Record::default(),
        "0.9.0",
        Duration::from_secs(2),
        &clocks(10),
    );
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
        assert_eq!(resume(&r, &c), r, "same boot: nothing to rewrite");
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
