//! Metrics: what `supctl metrics` prints and `[supd] metrics_file` holds, in Prometheus'
//! text exposition format 0.0.4 (one `# HELP` and one `# TYPE` line per family, then
//! its samples; names `sup_...` in base units, counters ending in `_total`).
//!
//! [`render`] is pure: the services' statuses as `status` makes them, each tool's record
//! reduced to [`ToolMetrics`], and supd's own counters ([`SupdMetrics`]) in; the text
//! out. A family with no sample is left out whole (a HELP and TYPE with nothing under
//! them is noise to a scraper). The part that keeps supd's own counts and decides when
//! the file is written is [`file::MetricsFile`]; the coordinator
//! (`supervisor/metrics.rs`) gathers the data and writes the file.

pub mod file;
#[cfg(test)]
mod tests;

use crate::protocol::{LastExit, Resources, ServiceStatus};
use std::fmt::Write;

/// A tool, as its metrics show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolMetrics<'a> {
    pub name: &'a str,
    /// The version `current` names (none before the first).
    pub version: Option<&'a str>,
    /// Its upgrade's phase ("idle", "probation", "committed", "rolled-back", "failed").
    pub phase: &'a str,
    /// Probations begun (upgrades, and versions the tool switched to by itself).
    pub probations: u64,
    /// Rollbacks (a failed probation's, an operator's, the tool's own switch back).
    pub rollbacks: u64,
    /// Versions marked bad now.
    pub bad_versions: u64,
}

/// supd's own figures.
#[derive(Clone, Debug, PartialEq)]
pub struct SupdMetrics<'a> {
    pub version: &'a str,
    /// When supd started (its first image: a `reexec` keeps it), Unix seconds.
    pub start_time_s: f64,
    /// Restarts of services by supd (automatic ones, after an exit or a failure).
    pub service_restarts: u64,
    /// Turns of the event loop that took longer than [`file::STALL`].
    pub loop_stalls: u64,
}

/// The exposition text of `services`, `tools` and `supd`.
pub fn render(services: &[ServiceStatus], tools: &[ToolMetrics], supd: &SupdMetrics) -> String {
    let mut out = String::with_capacity(256 + services.len() * 480);
    let o = &mut out;
    family(
        o,
        "sup_service_up",
        "gauge",
        "1 if the service is up (running, or a one-shot exited as it should), else 0.",
        per_service(services, |s| Some(f64::from(u8::from(s.up)))),
    );
    family(
        o,
        "sup_service_state",
        "gauge",
        "The service's state, as a label: 1 for the state it is in (no sample for the others).",
        |o| {
            for s in services {
                o.add(&[("service", &s.name), ("state", &s.state)], 1.0);
            }
        },
    );
    family(
        o,
        "sup_service_restarts_total",
        "counter",
        "Automatic restarts of the service since supd started.",
        per_service(services, |s| Some(f64::from(s.restarts_total))),
    );
    family(
        o,
        "sup_service_last_exit_code",
        "gauge",
        "The exit status of the service's last process, when it exited (not killed by a signal).",
        per_service(services, |s| match &s.last_exit {
            Some(LastExit::Code(c)) => Some(f64::from(*c)),
            _ => None,
        }),
    );
    family(
        o,
        "sup_service_last_exit_signal",
        "gauge",
        "The number of the signal that killed the service's last process, its name as a label.",
        |o| {
            for s in services {
                if let Some(LastExit::Signal(sig)) = &s.last_exit {
                    o.add(&[("service", &s.name), ("signal", sig)], signal_number(sig));
                }
            }
        },
    );
    family(
        o,
        "sup_service_uptime_seconds",
        "gauge",
        "How long the service's current process has run (services with a process only).",
        per_service(services, |s| s.uptime_ms.map(|ms| ms as f64 / 1000.0)),
    );
    family(
        o,
        "sup_service_healthy",
        "gauge",
        "1 if its health check or watchdog says healthy, 0 if unhealthy (services with one, while they run and once it has a verdict).",
        per_service(services, |s| match s.health.as_deref() {
            Some("healthy") => Some(1.0),
            Some("unhealthy") => Some(0.0),
            _ => None,
        }),
    );
    family(
        o,
        "sup_service_oom_kills_total",
        "counter",
        "Processes of the service killed by the kernel for want of memory (memory_max) since supd started.",
        per_service(services, |s| Some(f64::from(s.oom_kills))),
    );
    let res = |f: fn(&Resources) -> Option<u64>| {
        move |s: &ServiceStatus| s.resources.as_ref().and_then(f).map(|v| v as f64)
    };
    family(
        o,
        "sup_service_memory_bytes",
        "gauge",
        "Memory charged to the service's cgroup now.",
        per_service(services, res(|r| r.memory_bytes)),
    );
    family(
        o,
        "sup_service_memory_peak_bytes",
        "gauge",
        "The most memory charged to the service's cgroup.",
        per_service(services, res(|r| r.memory_peak_bytes)),
    );
    family(
        o,
        "sup_service_cpu_seconds_total",
        "counter",
        "CPU time used by the processes of the service's cgroup.",
        per_service(services, |s| {
            (s.resources.as_ref())
                .and_then(|r| r.cpu_usec)
                .map(|us| us as f64 / 1e6)
        }),
    );
    family(
        o,
        "sup_service_tasks",
        "gauge",
        "Processes and threads in the service's cgroup.",
        per_service(services, res(|r| r.tasks)),
    );
    family(
        o,
        "sup_tool_info",
        "gauge",
        "1 for each versioned tool, with the version `current` names and its upgrade's phase as labels.",
        |o| {
            for t in tools {
                let labels = [
                    ("tool", t.name),
                    ("version", t.version.unwrap_or("")),
                    ("phase", t.phase),
                ];
                o.add(&labels, 1.0);
            }
        },
    );
    family(
        o,
        "sup_tool_probations_total",
        "counter",
        "Probations begun: upgrades, and versions the tool switched to by itself.",
        per_tool(tools, |t| t.probations),
    );
    family(
        o,
        "sup_tool_rollbacks_total",
        "counter",
        "Rollbacks: of failed probations, by an operator, by the tool itself.",
        per_tool(tools, |t| t.rollbacks),
    );
    family(
        o,
        "sup_tool_bad_versions",
        "gauge",
        "Versions of the tool marked bad now.",
        per_tool(tools, |t| t.bad_versions),
    );
    family(
        o,
        "sup_supd_info",
        "gauge",
        "1, with supd's version as a label.",
        |o| o.add(&[("version", supd.version)], 1.0),
    );
    family(
        o,
        "sup_supd_start_time_seconds",
        "gauge",
        "When supd started (a reexec keeps it), in seconds since the Unix epoch.",
        |o| o.add(&[], supd.start_time_s),
    );
    family(
        o,
        "sup_supd_service_restarts_total",
        "counter",
        "Automatic restarts of services by supd; rate() of it is restarts per second.",
        |o| o.add(&[], supd.service_restarts as f64),
    );
    family(
        o,
        "sup_supd_loop_stalls_total",
        "counter",
        "Turns of supd's event loop that took longer than 100 ms.",
        |o| o.add(&[], supd.loop_stalls as f64),
    );
    out
}

/// A family's samples: one per service `f` gives a value for.
fn per_service<'a>(
    services: &'a [ServiceStatus],
    f: impl Fn(&ServiceStatus) -> Option<f64> + 'a,
) -> impl FnOnce(&mut Samples) + 'a {
    move |o| {
        for s in services {
            if let Some(v) = f(s) {
                o.add(&[("service", &s.name)], v);
            }
        }
    }
}

/// A family's samples: one per tool.
fn per_tool<'a>(
    tools: &'a [ToolMetrics],
    f: fn(&ToolMetrics) -> u64,
) -> impl FnOnce(&mut Samples) + 'a {
    move |o| {
        for t in tools {
            o.add(&[("tool", t.name)], f(t) as f64);
        }
    }
}

/// The samples of one family being written.
struct Samples<'a> {
    o: &'a mut String,
    name: &'a str,
    count: usize,
}

impl Samples<'_> {
    /// One sample: its labels and value.
    fn add(&mut self, labels: &[(&str, &str)], value: f64) {
        let o = &mut *self.o;
        o.push_str(self.name);
        if !labels.is_empty() {
            o.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    o.push(',');
                }
                o.push_str(k);
                o.push_str("=\"");
                escape_label_into(o, v);
                o.push('"');
            }
            o.push('}');
        }
        o.push(' ');
        push_value(o, value);
        o.push('\n');
        self.count += 1;
    }
}

/// One family: its HELP and TYPE lines, then what `samples` adds; nothing at all when
/// it adds no sample.
fn family(o: &mut String, name: &str, kind: &str, help: &str, samples: impl FnOnce(&mut Samples)) {
    let mark = o.len();
    let _ = writeln!(o, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(o, "# TYPE {name} {kind}");
    let mut w = Samples { o, name, count: 0 };
    samples(&mut w);
    if w.count == 0 {
        o.truncate(mark);
    }
}

/// A value as the format writes it: integers without a fraction, `NaN`, `+Inf`, `-Inf`.
fn push_value(o: &mut String, v: f64) {
    if v.is_nan() {
        o.push_str("NaN");
    } else if v.is_infinite() {
        o.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        let _ = write!(o, "{}", v as i64);
    } else {
        let _ = write!(o, "{v}");
    }
}

/// A label value escaped as the format says: backslash, double quote and line feed.
pub fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    escape_label_into(&mut s, v);
    s
}

fn escape_label_into(o: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
}

/// A HELP text escaped as the format says: backslash and line feed.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// The number of the signal `status` names ("KILL"), or NaN for one it does not know
/// (a real-time signal is named by its number, which is its value).
fn signal_number(name: &str) -> f64 {
    use std::str::FromStr;
    if let Ok(n) = name.parse::<i32>() {
        return f64::from(n);
    }
    nix::sys::signal::Signal::from_str(&format!("SIG{name}"))
        .map(|s| f64::from(s as i32))
        .unwrap_or(f64::NAN)
}
