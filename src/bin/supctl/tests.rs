//! supctl's unit tests: what it sends for each command line, and how it prints.

use super::*;

#[test]
fn install_sends_allow_special_only_when_asked() {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let Ok(plain) = build("install", &args(&["agent", "1.0.0", "/"])) else {
        panic!("install refused")
    };
    assert_eq!(plain["dir"], "/");
    assert!(
        plain.get("allow_special").is_none(),
        "an older supd takes it"
    );
    for a in [
        &["--allow-special", "agent", "1.0.0", "/"][..],
        &["agent", "1.0.0", "/", "--allow-special"][..],
    ] {
        let Ok(r) = build("install", &args(a)) else {
            panic!("install {a:?} refused")
        };
        assert_eq!(r["allow_special"], true);
        assert_eq!(
            (r["tool"].as_str(), r["version"].as_str()),
            (Some("agent"), Some("1.0.0"))
        );
    }
    assert!(build("install", &args(&["--special", "agent", "1.0.0", "/"])).is_err());
    assert!(build("install", &args(&["agent", "1.0.0"])).is_err());
}

#[test]
fn every_event_kind_reads_the_same_way() {
    let t = 1_796_059_201_123u64; // 17:20:01.123 UTC
    let cases = [
        (
            json!({"event": "state", "service": "web", "from": "starting", "to": "running", "pid": 4242, "version": null, "reason": null, "time": t}),
            "17:20:01.123 web running pid 4242 from starting",
        ),
        (
            json!({"event": "state", "service": "web", "from": "running", "to": "backoff", "pid": null, "version": "1.2.0", "reason": "exited with code 1; restarting in 1s", "time": t}),
            "17:20:01.123 web backoff version 1.2.0 from running: exited with code 1; restarting in 1s",
        ),
        (
            json!({"event": "upgrade", "tool": "agent", "phase": "probation", "version": "1.2.0", "current": "1.2.0", "from": "1.1.0", "reason": null, "time": t}),
            "17:20:01.123 agent upgrade phase probation version 1.2.0 from 1.1.0",
        ),
        (
            json!({"event": "rollback", "tool": "agent", "from": "1.2.0", "to": "1.1.0", "reason": "crash loop", "time": t}),
            "17:20:01.123 agent rollback from 1.2.0 to 1.1.0: crash loop",
        ),
        (
            json!({"event": "health", "service": "web", "from": "healthy", "to": "unhealthy", "reason": "health: 3 failures: HTTP 500 from 127.0.0.1:8080/healthz", "time": t}),
            "17:20:01.123 web health unhealthy from healthy: health: 3 failures: HTTP 500 from 127.0.0.1:8080/healthz",
        ),
        (
            json!({"event": "install", "tool": "agent", "version": "1.3.0", "ok": false, "error": "exists", "time": t}),
            "17:20:01.123 agent install version 1.3.0 failed: exists",
        ),
        (
            json!({"event": "lease", "lease": "engine", "what": "granted", "term": 4, "valid_for_ms": 10000, "time": t}),
            "17:20:01.123 engine lease granted term 4 valid for 10s",
        ),
    ];
    for (e, want) in cases {
        assert_eq!(event_line(&e, 0), want);
    }
    assert!(event_line(
        &json!({"event": "state", "service": "a", "to": "running", "time": t}),
        3600
    )
    .starts_with("18:20:01.123 a running"));
}

// see: issue 24, item 6 — `status` exited 3 for "not up" and for "cannot reach", and 0
// while supd ran with config errors.
#[test]
fn status_exits_3_for_a_service_down_over_5_for_config_errors() {
    let code = |r: Result<(), Failure>| match r {
        Ok(()) => 0,
        Err(Failure::NotUp(_)) => 3,
        Err(Failure::ConfigErrors) => 5,
        Err(_) => -1,
    };
    assert_eq!(code(status_outcome(vec![], false)), 0);
    assert_eq!(code(status_outcome(vec![], true)), 5);
    assert_eq!(code(status_outcome(vec!["a".into()], false)), 3);
    assert_eq!(code(status_outcome(vec!["a".into()], true)), 3);
    let d: StatusData =
        serde_json::from_value(json!({"services": [], "broken_files": [{"file": "x"}]}))
            .expect("status data");
    assert_eq!(
        code(show_status_outcome(&d)),
        5,
        "a broken file alone counts"
    );
}
