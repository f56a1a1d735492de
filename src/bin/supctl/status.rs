//! `status`: its data, the table, the notes on the broken files and config errors, and
//! its exit code (3 a service not up, 5 config errors).

use super::{emit, note, status_outcome, Failure};
use serde_json::Value;
use sup::protocol::ServiceStatus;
use sup::time::Human;

/// `status`'s data.
#[derive(serde::Deserialize, Default)]
pub(crate) struct StatusData {
    #[serde(default)]
    services: Vec<ServiceStatus>,
    #[serde(default)]
    config_errors: Vec<String>,
    /// The files that do not load (a newer supd): counted as config errors.
    #[serde(default)]
    broken_files: Vec<Value>,
    #[serde(default)]
    left_running: Vec<Value>,
    #[serde(default)]
    tools: std::collections::BTreeMap<String, Value>,
    #[serde(default)]
    down_error: Option<String>,
}

/// `status` without `--json`: the table, notes on stderr, exit 3 if one is not up, 5 if
/// supd runs with config errors.
pub(crate) fn show_status(d: &StatusData) -> Result<(), Failure> {
    let (mut o, mut err) = (String::new(), String::new());
    status_text(&mut o, &mut err, d);
    emit(&o)?;
    if !err.is_empty() {
        note(err.trim_end());
    }
    show_status_outcome(d)
}

/// [`status_outcome`] of `status`'s data.
pub(crate) fn show_status_outcome(d: &StatusData) -> Result<(), Failure> {
    let down: Vec<String> = (d.services.iter())
        // Up as supd says; from a supd too old to say, running.
        .filter(|s| !s.up && s.state != "running")
        .map(|s| s.name.clone())
        .collect();
    status_outcome(
        down,
        !d.config_errors.is_empty() || !d.broken_files.is_empty(),
    )
}

/// The table of `status`, and its notes for stderr.
pub(crate) fn status_text(o: &mut String, err: &mut String, d: &StatusData) {
    print_status(o, &d.services);
    broken_text(err, d);
    if !d.config_errors.is_empty() {
        outln!(
            err,
            "\nthe config has errors; until a reload succeeds, supd runs without what is broken:"
        );
        for e in &d.config_errors {
            outln!(err, "  {e}");
        }
    }
    // What supd decided but could not write yet (nothing of it is done).
    for (tool, t) in &d.tools {
        if let Some(e) = t["write_error"].as_str() {
            outln!(
                err,
                "\n{tool}: {} waits: {e}; supd retries",
                t["pending"].as_str().unwrap_or("a change")
            );
        }
    }
    if let Some(e) = &d.down_error {
        outln!(err, "\nstop/start marks: {e}; supd retries");
    }
}

/// The config files that do not load, what stands for each, and the runs kept of
/// services of theirs.
fn broken_text(err: &mut String, d: &StatusData) {
    for b in &d.broken_files {
        let stands = match b["using"].as_str() {
            Some("last good copy") => "its last good copy runs",
            _ => "nothing of it runs",
        };
        outln!(
            err,
            "\n{} does not load: {stands}",
            b["file"].as_str().unwrap_or("?")
        );
        // Its errors, each, follow with the config's (not said twice).
        if d.config_errors.is_empty() {
            outln!(err, "  {}", b["error"].as_str().unwrap_or("?"));
        }
    }
    for k in &d.left_running {
        outln!(
            err,
            "\nkept running, unsupervised, from a previous supd: {} (pid {})",
            k["service"].as_str().unwrap_or("?"),
            k["pid"]
        );
    }
}

/// `status -l`: the table has a MEMORY column (current, and peak, from the service's
/// cgroups).
pub(crate) static LONG: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A number of bytes for people: "512B", "12.5MiB".
fn human_bytes(n: u64) -> String {
    let units = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in units {
        if n >= size {
            return format!("{:.1}{unit}", n as f64 / size as f64);
        }
    }
    format!("{n}B")
}

/// The MEMORY cell of `status -l`: "12.5MiB (peak 30.0MiB)", or "-" without a run or
/// a memory controller.
fn memory_cell(s: &ServiceStatus) -> String {
    let r = s.resources.as_ref();
    match (
        r.and_then(|r| r.memory_bytes),
        r.and_then(|r| r.memory_peak_bytes),
    ) {
        (Some(now), Some(peak)) => format!("{} (peak {})", human_bytes(now), human_bytes(peak)),
        (Some(now), None) => human_bytes(now),
        _ => "-".into(),
    }
}

/// The aligned table of `status`.
fn print_status(o: &mut String, list: &[ServiceStatus]) {
    let long = LONG.load(std::sync::atomic::Ordering::Relaxed);
    // A HEALTH column only where some service has a check or a watchdog (a service
    // that does not run has no health, but its check still counts its failures).
    let checked = list
        .iter()
        .any(|s| s.health.is_some() || s.health_failures.is_some());
    let mut rows = vec![[
        "NAME",
        "STATE",
        "HEALTH",
        "PID",
        "UPTIME",
        "VERSION",
        "RESTARTS",
        "LAST EXIT",
        "MEMORY",
        "REASON",
    ]
    .map(String::from)
    .to_vec()];
    for s in list {
        let last = match &s.last_exit {
            Some(sup::protocol::LastExit::Code(c)) => format!("code {c}"),
            Some(sup::protocol::LastExit::Signal(sig)) => format!("signal {sig}"),
            None => "-".into(),
        };
        let mut reason = s.reason.clone().unwrap_or_default();
        if s.want == "down" && s.state == "stopped" {
            reason = if reason.is_empty() {
                "admin down".into()
            } else {
                format!("admin down; {reason}")
            };
        }
        if let Some(st) = &s.status {
            reason = if reason.is_empty() {
                st.clone()
            } else {
                format!("{reason}; {st}")
            };
        }
        if s.log_dropped > 0 {
            reason = format!("{reason} [{} log lines dropped]", s.log_dropped);
        }
        if let Some(f) = s.health_last_failure.as_ref().filter(|_| {
            // Not mended yet: no passing check since (such as the one it was restarted for).
            s.health.as_deref() != Some("healthy") || s.health_failures.unwrap_or(0) > 0
        }) {
            let when = sup::time::utc_stamp(
                std::time::UNIX_EPOCH + std::time::Duration::from_millis(f.time_ms),
            );
            let h = format!("last health failure at {when}: {}", f.reason);
            reason = if reason.is_empty() {
                h
            } else {
                format!("{reason}; {h}")
            };
        }
        rows.push(vec![
            s.name.clone(),
            s.state.clone(),
            s.health.clone().unwrap_or_else(|| "-".into()),
            s.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into()),
            s.uptime_ms
                .map(|ms| Human(std::time::Duration::from_secs(ms / 1000)).to_string())
                .unwrap_or_else(|| "-".into()),
            s.version.clone().unwrap_or_else(|| "-".into()),
            s.restarts.to_string(),
            last,
            memory_cell(s),
            reason,
        ]);
    }
    for r in rows.iter_mut() {
        if !long {
            r.remove(8);
        }
        if !checked {
            r.remove(2);
        }
    }
    let last = rows[0].len() - 1;
    let widths: Vec<usize> = (0..=last)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for r in rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            if i == last {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        outln!(o, "{}", line.trim_end());
    }
    // `-l`: what supd holds for each service between its runs.
    for s in list.iter().filter(|_| long) {
        if !s.listening.is_empty() {
            outln!(o, "{}: listening on {}", s.name, s.listening.join(", "));
        }
        for f in &s.stored_fds {
            outln!(o, "{}: stored fd {}: {}", s.name, f.name, f.what);
        }
    }
}
