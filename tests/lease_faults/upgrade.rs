//! Upgrades of the leader-only engine in the middle of the faults (issue 21): a roll of a
//! new version over the nodes, one at a time as a fleet roll goes, each node waited for
//! until its probation ends (committed, or rolled back) or a bound passes; a version that
//! does not commit halts the roll. Each step is timed, and the engine's downtime around
//! it is measured on the witness's intervals (from the upgrade's request until an engine
//! serves again after its outcome).

use crate::native::{boot, Mode};
use crate::node::Node;
use crate::witness::{Run, Witness};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Committed,
    RolledBack,
    /// Still in probation when the bound passed.
    Probation,
    /// Anything else: a refused request, a probation that failed without a rollback,
    /// a supd that did not answer.
    Other(String),
}

impl Outcome {
    fn show(&self) -> String {
        match self {
            Outcome::Committed => "committed".into(),
            Outcome::RolledBack => "rolled back".into(),
            Outcome::Probation => "still in probation at the bound".into(),
            Outcome::Other(s) => s.clone(),
        }
    }
}

/// One node's upgrade.
pub struct Step {
    pub node: String,
    pub issued: f64,
    /// When the outcome was seen.
    pub settled: Option<f64>,
    pub outcome: Outcome,
    /// When an engine served again after the outcome (or the wait for one ran out).
    pub back: f64,
    /// `versions engine` on that node at the end of the run: current, phase, whether the
    /// version is marked bad.
    pub last: Option<(String, String, bool)>,
}

/// One roll.
pub struct Upgrade {
    pub round: usize,
    pub mode: Mode,
    pub version: String,
    pub leader_first: bool,
    pub steps: Vec<Step>,
}

/// Rolls `version` (a build of `mode` at `binary`) over `order` (indexes into `nodes`):
/// installs and upgrades each node in turn and waits for its outcome (up to `bound`
/// from the request), then for an engine that serves (up to `wait`). Halts at the first
/// outcome that is not a commit.
#[allow(clippy::too_many_arguments)]
pub fn roll(
    round: usize,
    nodes: &[Node],
    order: &[usize],
    witness: &Witness,
    mode: Mode,
    binary: &Path,
    version: &str,
    leader_first: bool,
    bound: Duration,
    wait: Duration,
) -> Upgrade {
    let mut steps = Vec::new();
    for &i in order {
        let n = &nodes[i];
        let issued = boot();
        let asked = n
            .install_engine(version, binary)
            .and_then(|_| n.upgrade_engine(version));
        let (outcome, settled) = match asked {
            Err(e) => (Outcome::Other(format!("upgrade refused: {e}")), None),
            Ok(_) => settle(n, version, issued, bound),
        };
        let back = serving_again(witness, wait);
        eprintln!(
            "  upgrade of {} to {version} ({}): {} after {:.2} s; an engine serves again {:.2} s after the request",
            n.name,
            mode.name(),
            outcome.show(),
            settled.unwrap_or(boot()) - issued,
            back - issued
        );
        let halt = outcome != Outcome::Committed;
        steps.push(Step {
            node: n.name.clone(),
            issued,
            settled,
            outcome,
            back,
            last: None,
        });
        if halt {
            break;
        }
    }
    Upgrade {
        round,
        mode,
        version: version.to_string(),
        leader_first,
        steps,
    }
}

/// Waits for the node's probation of `version` to end, or `bound` after `issued`: its
/// `versions engine` is looked at once, then again at each `upgrade` event of the node's
/// supd (a watch on its socket).
fn settle(n: &Node, version: &str, issued: f64, bound: Duration) -> (Outcome, Option<f64>) {
    let end = issued + bound.as_secs_f64();
    let mut watch = watch(n);
    loop {
        if let Ok(v) = n.engine_versions() {
            let now = boot();
            let phase = v["phase"].as_str().unwrap_or("");
            let current = v["current"].as_str().unwrap_or("");
            match phase {
                "probation" => {}
                "committed" | "idle" if current == version => {
                    return (Outcome::Committed, Some(now))
                }
                "rolled-back" if current != version => return (Outcome::RolledBack, Some(now)),
                _ => {
                    return (
                        Outcome::Other(format!("phase {phase}, current {current}")),
                        Some(now),
                    )
                }
            }
        }
        // The next upgrade event, or the bound; a watch that broke is opened again.
        loop {
            let left = end - boot();
            if left <= 0.0 {
                return (Outcome::Probation, None);
            }
            let Some(r) = watch.as_mut() else {
                // A quiet round: supd answers. One that does not is said, not waited on.
                watch = self::watch(n);
                if watch.is_none() {
                    return (
                        Outcome::Other("supd's watch could not be opened".into()),
                        Some(boot()),
                    );
                }
                break;
            };
            let mut line = String::new();
            let _ = r
                .get_ref()
                .set_read_timeout(Some(crate::ms(left.max(0.001))));
            match r.read_line(&mut line) {
                Ok(n) if n > 0 => {
                    if line.contains("\"upgrade\"") {
                        break;
                    }
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                _ => watch = None,
            }
        }
    }
}

/// A `watch` stream of the node's supd, if it answers.
fn watch(n: &Node) -> Option<BufReader<UnixStream>> {
    let mut s = UnixStream::connect(&n.sb.socket).ok()?;
    s.write_all(b"{\"cmd\": \"watch\"}\n").ok()?;
    let mut r = BufReader::new(s);
    let mut first = String::new();
    r.read_line(&mut first).ok()?;
    first.contains("\"ok\":true").then_some(r)
}

/// Waits (up to `wait`) until some engine serves; when.
pub fn serving_again(w: &Witness, wait: Duration) -> f64 {
    w.wait_for(wait, |runs| {
        runs.iter().any(|r| r.end.is_none() && r.ready.is_some())
    });
    boot()
}

/// Reads, at the end, where each node an upgrade was tried on stands.
pub fn look_back(u: &mut Upgrade, nodes: &[Node]) {
    for s in &mut u.steps {
        let Some(n) = nodes.iter().find(|n| n.name == s.node) else {
            continue;
        };
        s.last = n.engine_versions().ok().map(|v| {
            let bad = v["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["version"] == u.version.as_str() && e["bad"] == true);
            (
                v["current"].as_str().unwrap_or("-").to_string(),
                v["phase"].as_str().unwrap_or("-").to_string(),
                bad,
            )
        });
    }
}

/// Time within [a, b] when no engine served (none alive and ready), and its longest gap.
pub fn downtime(runs: &[Run], a: f64, b: f64) -> (f64, f64) {
    let mut iv: Vec<(f64, f64)> = runs
        .iter()
        .filter_map(|r| Some((r.ready?.max(a), r.end?.min(b))))
        .filter(|(x, y)| x < y)
        .collect();
    iv.sort_by(|x, y| x.0.total_cmp(&y.0));
    let (mut down, mut longest, mut cursor) = (0.0, 0.0f64, a);
    for (x, y) in iv {
        if x > cursor {
            down += x - cursor;
            longest = longest.max(x - cursor);
        }
        cursor = cursor.max(y);
    }
    if b > cursor {
        down += b - cursor;
        longest = longest.max(b - cursor);
    }
    (down, longest)
}

/// The figures of the upgrades, for the test's report.
pub fn figures(ups: &[Upgrade], runs: &[Run], t: f64, bound: Duration) -> String {
    let mut fig = String::new();
    if ups.is_empty() {
        return fig;
    }
    let _ = writeln!(
        fig,
        "  upgrades of the engine (each node waited for up to {:.1} s, probation + 10 T):",
        bound.as_secs_f64()
    );
    for u in ups {
        let (total, _) = u.steps.iter().fold((0.0, 0.0), |(d, l), s| {
            let (x, y) = downtime(runs, s.issued, s.back);
            (d + x, f64::max(l, y))
        });
        let _ = writeln!(
            fig,
            "    round {:2}: {} {} ({}), {} first; no engine served for {total:.2} s ({:.2} T) in all",
            u.round,
            u.mode.name(),
            u.version,
            if u.mode == Mode::Good { "should commit" } else { "should roll back" },
            if u.leader_first { "the leader" } else { "a follower" },
            total / t
        );
        for s in &u.steps {
            let (down, longest) = downtime(runs, s.issued, s.back);
            let took = s
                .settled
                .map(|e| format!("after {:.2} s", e - s.issued))
                .unwrap_or_default();
            let last = match &s.last {
                Some((cur, phase, bad)) => format!(
                    "at the end {cur} {phase}{}",
                    if *bad {
                        format!(", {} marked bad", u.version)
                    } else {
                        String::new()
                    }
                ),
                None => "at the end: no answer".into(),
            };
            let _ = writeln!(
                fig,
                "      {}: {} {took}; engine down {down:.2} s ({:.2} T), longest gap {longest:.2} s; {last}",
                s.node,
                s.outcome.show(),
                down / t
            );
        }
    }
    fig
}

/// What the upgrades must show: a good version commits on each node of its roll within
/// the bound; a bad one rolls back on the node it was tried on, is marked bad there, and
/// is never committed anywhere. Each failure names its round.
pub fn failures(ups: &[Upgrade]) -> Vec<String> {
    let mut out = Vec::new();
    for u in ups {
        let r = u.round;
        let v = &u.version;
        match u.mode {
            Mode::Good => {
                for s in &u.steps {
                    if s.outcome != Outcome::Committed {
                        out.push(format!(
                            "round {r}: good {v} did not commit on {} within the bound: {}",
                            s.node,
                            s.outcome.show()
                        ));
                    }
                }
            }
            Mode::Crash | Mode::Hang => {
                let name = u.mode.name();
                for s in &u.steps {
                    if s.outcome != Outcome::RolledBack {
                        out.push(format!(
                            "round {r}: {name} {v} was not rolled back on {} within the bound: {}",
                            s.node,
                            s.outcome.show()
                        ));
                    }
                    match &s.last {
                        Some((cur, phase, _)) if cur == v => out.push(format!(
                            "round {r}: {name} {v} is current ({phase}) on {} at the end",
                            s.node
                        )),
                        Some((cur, phase, false)) => out.push(format!(
                            "round {r}: {name} {v} is not marked bad on {} at the end ({cur} {phase})",
                            s.node
                        )),
                        _ => {}
                    }
                }
            }
        }
    }
    out
}

/// Nodes whose current version of the engine is marked bad at the end (a bad version
/// never ends up current, committed or not).
pub fn bad_current(nodes: &[Node]) -> Vec<String> {
    let mut out = Vec::new();
    for n in nodes {
        let Ok(v) = n.engine_versions() else {
            continue;
        };
        for e in v["versions"].as_array().into_iter().flatten() {
            if e["current"] == true && e["bad"] == true {
                out.push(format!(
                    "{}: the current version {} is marked bad ({}), phase {}",
                    n.name, e["version"], e["bad_reason"], v["phase"]
                ));
            }
        }
    }
    out
}
