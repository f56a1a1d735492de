//! Metrics (issue 28): `supctl metrics` read by Prometheus' own text parser (python3's
//! prometheus_client), `[supd] metrics_file` read by Debian's node_exporter through its
//! textfile collector, and the file written after a change, at most once per 10 s, with
//! an idle supd never woken for it.

mod common;
use common::metrics_file::{assert_idle_past, stamp, wait_text};
use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// Reads exposition text with prometheus_client's parser and prints every sample as
/// JSON: [name, labels, value, family's type].
const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.append([s.name, s.labels, s.value, fam.type])
print(json.dumps(out))
"#;

/// A python3 that has prometheus_client (Debian's python3-prometheus-client goes to
/// /usr/bin/python3's path, which a pyenv `python3` first in PATH does not see).
fn python_with_client() -> Option<&'static str> {
    ["python3", "/usr/bin/python3"].into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import prometheus_client"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// A tool this test needs is missing: fails in CI (.ci/run installs it), else skips.
fn missing(what: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{what} is missing: .ci/run installs it"
    );
    eprintln!("skipped: {what} is not installed");
}

/// One parsed sample.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
    kind: String,
}

/// `text` through prometheus_client's parser (which fails on what the format forbids).
fn parse(py: &str, text: &str) -> Vec<Sample> {
    let mut child = Command::new(py)
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to the parser");
    let out = child.wait_with_output().expect("the parser");
    assert!(
        out.status.success(),
        "prometheus_client refused the text: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("the parser's JSON");
    (v.as_array().expect("a list").iter())
        .map(|s| Sample {
            name: s[0].as_str().expect("name").to_string(),
            labels: serde_json::from_value(s[1].clone()).expect("labels"),
            value: s[2].as_f64().expect("value"),
            kind: s[3].as_str().expect("type").to_string(),
        })
        .collect()
}

/// The value of the sample `name` whose labels include `labels`.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
}

fn metrics(sb: &Sandbox) -> String {
    let out = sb.supctl(&["metrics"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "supctl metrics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn supctl_metrics_reads_with_prometheus_client_and_says_what_is_so() {
    let Some(py) = python_with_client() else {
        return missing("python3's prometheus_client (python3-prometheus-client)");
    };
    // Held open: the health check's connects succeed (the backlog takes them).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    // With limits where this host has the controllers (as root): its cgroups then give
    // memory, CPU and tasks (a hybrid host's v1 hierarchies are joined for a limit).
    use sup::cgroup::limits::{have_for_check, Controller};
    let have = have_for_check(true);
    let limited = is_root()
        && [Controller::Memory, Controller::Pids]
            .into_iter()
            .all(|c| have.place(c).is_some());
    let limits = if limited {
        "memory_max = \"256MiB\"\npids_max = 64\n"
    } else {
        ""
    };
    let mut sb = Sandbox::new();
    sb.config(&format!(
        r#"
[service.web]
command = ["/bin/sleep", "3600"]
health = {{ tcp = "{addr}", interval = "100ms", timeout = "1s" }}
{limits}
[service.crash]
command = ["/bin/sh", "-c", "exit 3"]
restart_delay = "10ms"
restart_delay_max = "50ms"
crash_loop = {{ restarts = 1000, window = "1s" }}

[service.off]
command = ["/bin/sleep", "3600"]
autostart = false

[service.agent]
tool = "agent"
command = ["bin/agent"]
restart_delay = "10ms"
crash_loop = {{ restarts = 3, window = "1m" }}
on_crash_loop = "cooldown"
cooldown = "1h"
probation = "300ms"
stop_timeout = "2s"
"#
    ));
    sb.start();
    sb.install_version("1.0.0", "exec /bin/sleep 3600");
    sb.upgrade_wait("1.0.0", true);
    sb.install_version("1.1.0", "exec /bin/sleep 3600");
    sb.upgrade_wait("1.1.0", true);
    // A version that crash-loops: rolled back to 1.1.0 and marked bad.
    sb.install_version("2.0.0", "exit 3");
    sb.upgrade_wait("2.0.0", false);
    sb.wait_state("agent", "running");
    sb.wait_state("web", "running");
    // web's check has given its verdict, crash has been restarted a few times.
    let mut w = sb.watch();
    if sb.status("web")["health"] != "healthy" {
        w.until(&sb, |e| e["event"] == "health" && e["service"] == "web");
    }
    while sb.status("crash")["restarts_total"].as_u64().unwrap_or(0) < 3 {
        w.until(&sb, |e| e["event"] == "state" && e["service"] == "crash");
    }

    let text = metrics(&sb);
    let s = parse(py, &text);
    let v = |name: &str, labels: &[(&str, &str)]| value(&s, name, labels);
    let svc = |name: &str, service: &str| v(name, &[("service", service)]);
    // States, as labels, one sample per service.
    assert_eq!(
        v(
            "sup_service_state",
            &[("service", "web"), ("state", "running")]
        ),
        Some(1.0)
    );
    assert_eq!(
        v(
            "sup_service_state",
            &[("service", "off"), ("state", "stopped")]
        ),
        Some(1.0)
    );
    let crash_states: Vec<&Sample> = (s.iter())
        .filter(|x| x.name == "sup_service_state" && x.labels["service"] == "crash")
        .collect();
    assert_eq!(crash_states.len(), 1, "{crash_states:?}");
    assert_eq!(svc("sup_service_up", "web"), Some(1.0));
    assert_eq!(svc("sup_service_up", "off"), Some(0.0));
    // The crash-looping one: restarted, its last exit said.
    assert!(
        svc("sup_service_restarts_total", "crash").is_some_and(|n| n >= 3.0),
        "{text}"
    );
    assert_eq!(svc("sup_service_last_exit_code", "crash"), Some(3.0));
    assert_eq!(svc("sup_service_restarts_total", "off"), Some(0.0));
    // Health: only the service with a check.
    assert_eq!(svc("sup_service_healthy", "web"), Some(1.0));
    assert_eq!(svc("sup_service_healthy", "off"), None);
    assert!(svc("sup_service_uptime_seconds", "web").is_some_and(|u| u >= 0.0));
    assert_eq!(svc("sup_service_uptime_seconds", "off"), None);
    assert_eq!(svc("sup_service_oom_kills_total", "web"), Some(0.0));
    // What its cgroups use, where they exist; none for a service without a run.
    if limited {
        assert!(
            svc("sup_service_memory_bytes", "web").is_some_and(|b| b > 0.0),
            "{text}"
        );
        assert!(
            svc("sup_service_tasks", "web").is_some_and(|n| n >= 1.0),
            "{text}"
        );
    } else {
        eprintln!(
            "(memory and tasks not looked at: no memory or pids hierarchy here, or not root)"
        );
    }
    assert_eq!(svc("sup_service_memory_bytes", "off"), None);
    // The tool: its version and phase as labels, its probations and rollbacks counted.
    assert_eq!(
        v(
            "sup_tool_info",
            &[
                ("tool", "agent"),
                ("version", "1.1.0"),
                ("phase", "rolled-back")
            ]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        v("sup_tool_probations_total", &[("tool", "agent")]),
        Some(3.0)
    );
    assert_eq!(
        v("sup_tool_rollbacks_total", &[("tool", "agent")]),
        Some(1.0)
    );
    assert_eq!(v("sup_tool_bad_versions", &[("tool", "agent")]), Some(1.0));
    // supd's own.
    let restarts = v("sup_supd_service_restarts_total", &[]).expect("restarts");
    assert!(restarts >= 3.0, "{text}");
    assert!(v("sup_supd_loop_stalls_total", &[]).is_some());
    let start = v("sup_supd_start_time_seconds", &[]).expect("start time");
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    assert!(start <= now && start > now - 600.0, "{start} vs {now}");
    // Counters are typed so, and named so.
    for x in &s {
        if x.kind == "counter" {
            assert!(x.name.ends_with("_total"), "{x:?}");
        }
    }
    assert!(s
        .iter()
        .any(|x| x.name == "sup_service_restarts_total" && x.kind == "counter"));

    // Across a reexec, supd's counts go on from where they were.
    let out = sb.supctl(&["stop", "crash"]);
    assert_eq!(out.status.code(), Some(0));
    let before = value(
        &parse(py, &metrics(&sb)),
        "sup_supd_service_restarts_total",
        &[],
    )
    .expect("restarts");
    sb.reexec();
    let after = value(
        &parse(py, &metrics(&sb)),
        "sup_supd_service_restarts_total",
        &[],
    )
    .expect("restarts");
    assert_eq!(after, before, "carried across reexec");
    drop(listener);
}

/// A GET of `path` on 127.0.0.1:`port`: the body, or `None` while nothing listens.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    c.set_read_timeout(Some(DEADLINE)).ok()?;
    write!(
        c,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    c.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200 "),
        "{head}"
    );
    Some(body.to_string())
}

#[test]
fn node_exporter_finds_the_metrics_in_metrics_file() {
    const NODE_EXPORTER: &str = "/usr/bin/prometheus-node-exporter";
    if !Path::new(NODE_EXPORTER).exists() {
        return missing("prometheus-node-exporter");
    }
    let mut sb = Sandbox::new();
    std::fs::create_dir(sb.path("textfile")).expect("mkdir");
    sb.config_with(
        "metrics_file = \"textfile/sup.prom\"",
        "[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\n\
         [service.off]\ncommand = [\"/bin/sleep\", \"3600\"]\nautostart = false\n",
    );
    sb.start();
    let file = sb.path("textfile/sup.prom");
    wait_text(
        &file,
        "sup_service_state{service=\"web\",state=\"running\"} 1",
        DEADLINE,
    );
    // A free port: the kernel's, let go just before node_exporter takes it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut exporter = Command::new(NODE_EXPORTER)
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--collector.disable-defaults")
        .arg("--collector.textfile")
        .arg(format!(
            "--collector.textfile.directory={}",
            sb.path("textfile").display()
        ))
        .arg("--web.disable-exporter-metrics")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start node_exporter");
    let pid = exporter.id() as i32;
    // It serves once it listens: asked until then, with the deadline.
    let end = Instant::now() + DEADLINE;
    let body = loop {
        if let Some(b) = http_get(port, "/metrics") {
            break Some(b);
        }
        if Instant::now() > end || !alive(pid) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    );
    if wait_exit(pid, DEADLINE).is_none() {
        let _ = exporter.kill();
    }
    let out = exporter.wait_with_output().expect("node_exporter's end");
    let body = body.unwrap_or_else(|| {
        panic!(
            "node_exporter did not serve on 127.0.0.1:{port}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    for want in [
        "sup_service_state{service=\"web\",state=\"running\"} 1",
        "sup_service_up{service=\"off\"} 0",
        "# TYPE sup_service_restarts_total counter",
        "sup_supd_loop_stalls_total",
    ] {
        assert!(
            body.contains(want),
            "no {want:?} in node_exporter's:\n{body}"
        );
    }
    // It read the file without complaint.
    assert!(
        body.contains("node_textfile_scrape_error 0"),
        "node_exporter's textfile collector failed:\n{body}"
    );
}

#[test]
fn metrics_file_follows_changes_at_most_every_10s_and_an_idle_supd_never_wakes_for_it() {
    let mut sb = Sandbox::new();
    sb.config_with(
        "metrics_file = \"sup.prom\"",
        "[service.a]\ncommand = [\"/bin/sleep\", \"3600\"]\n\
         [service.b]\ncommand = [\"/bin/sleep\", \"3600\"]\nautostart = false\n",
    );
    sb.start();
    let file = sb.path("sup.prom");
    let mut writes: Vec<(u64, SystemTime)> = Vec::new();
    let note = |writes: &mut Vec<(u64, SystemTime)>| {
        if let Some(s) = stamp(&file) {
            if writes.last() != Some(&s) {
                writes.push(s);
            }
        }
    };
    // Notes each write of the file (inotify on its directory: a write renames a file
    // into place) until it holds `needle`.
    let ino = files::watch_dir_of(&file);
    let until = |writes: &mut Vec<(u64, SystemTime)>, needle: &str| {
        let end = Instant::now() + DEADLINE;
        loop {
            note(writes);
            if std::fs::read_to_string(&file).is_ok_and(|t| t.contains(needle)) {
                note(writes);
                return;
            }
            let left = end.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "metrics_file never held {needle:?}\n{}",
                sb.supd_log()
            );
            files::next_events(&ino, left);
        }
    };
    until(
        &mut writes,
        "sup_service_state{service=\"a\",state=\"running\"} 1",
    );
    // A change: b started. The file follows, but not sooner than 10 s after its last
    // write.
    let out = sb.supctl(&["start", "b"]);
    assert_eq!(out.status.code(), Some(0));
    until(
        &mut writes,
        "sup_service_state{service=\"b\",state=\"running\"} 1",
    );
    for pair in writes.windows(2) {
        let apart = pair[1].1.duration_since(pair[0].1).unwrap_or_default();
        assert!(
            apart >= Duration::from_millis(9_900),
            "written {apart:?} after the write before: {writes:?}"
        );
    }
    let last = *writes.last().expect("a write");
    // Idle: nothing changes now. Past the last write + 10 s, the file is the same file
    // and supd has not woken once. The uptime in it is as of its write.
    assert_idle_past(&sb, &file, last);
}
