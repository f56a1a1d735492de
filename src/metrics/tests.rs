//! The renderer's and the file part's tests (their `expect`s are a test's, not supd's).

use super::file::{Failed, MetricsFile, INTERVAL, RETRY_MAX};
use super::*;
use crate::protocol::Resources;
use crate::time::Mono;
use std::collections::BTreeMap;
use std::time::Duration;

fn service(name: &str, state: &str) -> ServiceStatus {
    ServiceStatus {
        health: None,
        health_failures: None,
        health_last_failure: None,
        held_by: None,
        last_exit: None,
        listening: Vec::new(),
        log_dropped: 0,
        name: name.into(),
        next_ms: None,
        oom_kills: 0,
        pid: None,
        reason: None,
        resources: None,
        restarts: 0,
        restarts_total: 0,
        state: state.into(),
        status: None,
        stored_fds: Vec::new(),
        unhealthy_since_ms: None,
        up: false,
        uptime_ms: None,
        version: None,
        want: "up".into(),
    }
}

fn supd() -> SupdMetrics<'static> {
    SupdMetrics {
        version: "1.2.3",
        start_time_s: 1_700_000_000.25,
        service_restarts: 7,
        loop_stalls: 0,
    }
}

/// Each family's lines: its HELP and TYPE lines and samples, in order of appearance.
fn families(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default().to_string();
            out.push((name, vec![line.to_string()]));
        } else if let Some(f) = out.last_mut() {
            f.1.push(line.to_string());
        } else {
            panic!("a line before any family: {line}");
        }
    }
    out
}

#[test]
fn label_values_are_escaped_as_the_format_says() {
    assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
    assert_eq!(escape_label("line\nbreak"), r"line\nbreak");
    assert_eq!(escape_label("plain-é@1"), "plain-é@1");
    // In a rendered sample too: a tool's version is free text from its directory name.
    let tools = [ToolMetrics {
        name: "agent",
        version: Some("1.0\"\n\\x"),
        phase: "committed",
        probations: 1,
        rollbacks: 0,
        bad_versions: 0,
    }];
    let text = render(&[], &tools, &supd());
    assert!(
        text.contains(
            "sup_tool_info{tool=\"agent\",version=\"1.0\\\"\\n\\\\x\",phase=\"committed\"} 1\n"
        ),
        "{text}"
    );
    // The newline did not break the sample's line.
    assert!(text
        .lines()
        .all(|l| l.starts_with('#') || l.starts_with("sup_")));
}

#[test]
fn every_family_has_one_help_one_type_and_its_samples_together() {
    let mut a = service("a", "running");
    a.up = true;
    a.uptime_ms = Some(1500);
    a.health = Some("healthy".into());
    a.resources = Some(Resources {
        cpu_usec: Some(2_500_000),
        memory_bytes: Some(4096),
        memory_peak_bytes: Some(8192),
        tasks: Some(3),
    });
    let mut b = service("b", "backoff");
    b.restarts_total = 4;
    b.last_exit = Some(LastExit::Code(3));
    let mut c = service("c", "stopped");
    c.last_exit = Some(LastExit::Signal("KILL".into()));
    c.health = Some("unhealthy".into());
    let tools = [
        ToolMetrics {
            name: "agent",
            version: Some("1.1.0"),
            phase: "rolled-back",
            probations: 2,
            rollbacks: 1,
            bad_versions: 1,
        },
        ToolMetrics {
            name: "other",
            version: None,
            phase: "idle",
            probations: 0,
            rollbacks: 0,
            bad_versions: 0,
        },
    ];
    let text = render(&[a, b, c], &tools, &supd());
    let fams = families(&text);
    let mut seen = BTreeMap::new();
    for (name, lines) in &fams {
        assert!(
            seen.insert(name.clone(), ()).is_none(),
            "{name} twice:\n{text}"
        );
        assert!(
            lines[0].starts_with(&format!("# HELP {name} ")),
            "{lines:?}"
        );
        let kind = lines[1].strip_prefix(&format!("# TYPE {name} "));
        assert!(matches!(kind, Some("gauge" | "counter")), "{lines:?}");
        assert!(lines.len() > 2, "{name} has no sample:\n{text}");
        for l in &lines[2..] {
            let rest = l
                .strip_prefix(name.as_str())
                .unwrap_or_else(|| panic!("{l}"));
            assert!(rest.starts_with('{') || rest.starts_with(' '), "{l}");
        }
        if kind == Some("counter") {
            assert!(name.ends_with("_total"), "{name}");
        }
    }
    let has = |s: &str| assert!(text.contains(s), "no {s:?} in\n{text}");
    has("sup_service_up{service=\"a\"} 1\n");
    has("sup_service_up{service=\"b\"} 0\n");
    has("sup_service_state{service=\"b\",state=\"backoff\"} 1\n");
    has("sup_service_restarts_total{service=\"b\"} 4\n");
    has("sup_service_last_exit_code{service=\"b\"} 3\n");
    has("sup_service_last_exit_signal{service=\"c\",signal=\"KILL\"} 9\n");
    has("sup_service_uptime_seconds{service=\"a\"} 1.5\n");
    has("sup_service_healthy{service=\"a\"} 1\n");
    has("sup_service_healthy{service=\"c\"} 0\n");
    has("sup_service_cpu_seconds_total{service=\"a\"} 2.5\n");
    has("sup_service_memory_bytes{service=\"a\"} 4096\n");
    has("sup_service_memory_peak_bytes{service=\"a\"} 8192\n");
    has("sup_service_tasks{service=\"a\"} 3\n");
    has("sup_tool_info{tool=\"other\",version=\"\",phase=\"idle\"} 1\n");
    has("sup_tool_rollbacks_total{tool=\"agent\"} 1\n");
    has("sup_tool_probations_total{tool=\"agent\"} 2\n");
    has("sup_tool_bad_versions{tool=\"agent\"} 1\n");
    has("sup_supd_start_time_seconds 1700000000.25\n");
    has("sup_supd_service_restarts_total 7\n");
    has("sup_supd_loop_stalls_total 0\n");
    // Only the services a family has a value for.
    assert!(!text.contains("sup_service_uptime_seconds{service=\"b\"}"));
    assert!(!text.contains("sup_service_memory_bytes{service=\"b\"}"));
    assert!(!text.contains("sup_service_healthy{service=\"b\"}"));
}

#[test]
fn a_family_without_samples_is_left_out_whole() {
    // No services, no tools: supd's own families alone.
    let text = render(&[], &[], &supd());
    assert!(!text.contains("sup_service_"), "{text}");
    assert!(!text.contains("sup_tool_"), "{text}");
    assert!(text.contains("# TYPE sup_supd_loop_stalls_total counter\n"));
    // Services without cgroups, health, or a process: none of those families.
    let text = render(&[service("a", "stopped")], &[], &supd());
    for gone in [
        "sup_service_memory_bytes",
        "sup_service_memory_peak_bytes",
        "sup_service_cpu_seconds_total",
        "sup_service_tasks",
        "sup_service_healthy",
        "sup_service_uptime_seconds",
        "sup_service_last_exit_code",
        "sup_service_last_exit_signal",
    ] {
        assert!(!text.contains(gone), "{gone} in\n{text}");
    }
    assert!(text.contains("# TYPE sup_service_up gauge\nsup_service_up{service=\"a\"} 0\n"));
    // A cgroup hierarchy without the pids controller: memory, no tasks.
    let mut a = service("a", "running");
    a.resources = Some(Resources {
        memory_bytes: Some(1),
        ..Resources::default()
    });
    let text = render(&[a], &[], &supd());
    assert!(text.contains("sup_service_memory_bytes{service=\"a\"} 1\n"));
    assert!(!text.contains("sup_service_tasks"), "{text}");
}

#[test]
fn the_file_is_written_after_a_change_at_most_once_per_interval_and_idle_arms_nothing() {
    let t0 = Mono(1_000_000_000_000);
    let at = |s: u64| t0.plus(Duration::from_millis(s));
    let mut m = MetricsFile::default();
    // Without metrics_file: never due.
    assert_eq!(m.deadline(false), None);
    // The first turn writes (nothing written yet by this image).
    let g = m.due(true, t0).expect("due at once");
    assert!(!m.wrote(g, t0));
    // Nothing changed: no deadline at all (an idle supd does not wake for the file).
    assert_eq!(m.deadline(true), None);
    assert_eq!(m.due(true, at(60_000)), None);
    // A change 1 s later: one deadline at the last write + 10 s.
    m.changed();
    assert_eq!(m.due(true, at(1_000)), None);
    assert_eq!(m.deadline(true), Some(t0.plus(INTERVAL)));
    m.changed();
    m.changed();
    assert_eq!(m.deadline(true), Some(t0.plus(INTERVAL)), "one deadline");
    let g = m
        .due(true, at(10_000))
        .expect("due at the last write + 10 s");
    m.wrote(g, at(10_000));
    assert_eq!(m.deadline(true), None);
    // A change long after the last write: written at once.
    m.changed();
    assert_eq!(m.due(true, at(60_000)), Some(g + 1));
    // A change while a write's text was made is not lost: the generation written is
    // the one asked for, and the newer one is due again.
    m.changed();
    m.wrote(g + 1, at(60_000));
    assert_eq!(m.deadline(true), Some(at(60_000).plus(INTERVAL)));
}

#[test]
fn a_failed_write_is_said_once_per_kind_and_tried_again_later_and_later() {
    use std::io::ErrorKind;
    let t0 = Mono(5_000_000_000);
    let mut m = MetricsFile::default();
    assert_eq!(m.failed(ErrorKind::StorageFull, t0), Failed::Log);
    assert_eq!(m.deadline(true), Some(t0.plus(INTERVAL * 2)));
    let t1 = t0.plus(INTERVAL * 2);
    assert_eq!(m.failed(ErrorKind::StorageFull, t1), Failed::Quiet);
    assert_eq!(m.deadline(true), Some(t1.plus(INTERVAL * 4)));
    assert_eq!(m.failed(ErrorKind::NotFound, t1), Failed::Log);
    for _ in 0..20 {
        m.failed(ErrorKind::NotFound, t1);
    }
    assert_eq!(m.deadline(true), Some(t1.plus(RETRY_MAX)), "bounded");
    // A write that succeeds says so (it was failing), and the wait is back to 10 s.
    assert!(m.wrote(0, t1));
    m.changed();
    assert_eq!(m.deadline(true), Some(t1.plus(INTERVAL)));
    assert_eq!(m.failed(ErrorKind::StorageFull, t1), Failed::Log);
}

#[test]
fn stalls_are_turns_over_100_ms_and_counts_carry() {
    let mut m = MetricsFile::default();
    m.turn(Duration::from_millis(99));
    m.turn(Duration::from_millis(100));
    m.turn(Duration::from_millis(101));
    m.restarted(3);
    assert_eq!(m.counts().loop_stalls, 1);
    let mut n = MetricsFile::default();
    n.adopt(m.counts());
    assert_eq!(n.counts().service_restarts, 3);
}
