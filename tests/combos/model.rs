//! The model of the contract (SPEC "Upgrades, probation and rollback"), kept apart from
//! the processes: it is fed what was observed (watch events, the moments supd went down
//! and came back, the `versions` record once supd has settled) and says which promise
//! was broken. What it remembers:
//! - the kind of every installed version (how its program behaves) and its manifest;
//! - the versions committed (passed a probation) and the last good version, the one a
//!   rollback must return to: the last committed version (or one that stayed after a
//!   failed irreversible probation);
//! - the versions marked bad (a mark is never lost, except by our own `--force`);
//! - the probation under way, and when each run of each version was ready.
//!
//! The invariants:
//! - P: no version is committed without having run (ready) for its probation: a version
//!   that is never ready (crash, hang) is never committed, and a committed one was ready
//!   at least `READY_SHARE` of its probation in every service of the tool (the time supd
//!   was down counts as ready: nothing was seen then);
//! - R: a rollback returns to the last good version;
//! - I: a version that is irreversible (manifest, or `--irreversible`) is never rolled back;
//! - B: bad marks are never lost, a rolled-back version is marked bad, `current` is never
//!   a bad version, and a version marked bad never starts again;
//! - C: `current`, `versions` and the record on disk agree, and once settled `current`
//!   is the last good version.
//!   (At most one instance and the bound on SIGTERM are checked by the harness.)

use crate::steps::Kind;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// A committed version was ready at least this share of its probation.
pub const READY_SHARE: f64 = 0.6;
/// The config's `crash_loop = { restarts = 3, window = "1m" }`.
pub const CRASH_LOOP_RESTARTS: usize = 3;

#[derive(Clone, Debug)]
pub struct Info {
    pub kind: Kind,
    pub manifest_irreversible: bool,
}

#[derive(Clone, Debug)]
pub struct Probation {
    pub version: String,
    pub from: Option<String>,
    pub start_ms: Option<u64>,
    pub irreversible: bool,
    /// The tool switched itself into it.
    pub self_switch: bool,
    /// It began while another probation was under way.
    pub over: Option<String>,
    /// supd went down (kill -9, SIGTERM) or re-executed during it.
    pub disturbed: Vec<&'static str>,
    /// When the version first started in it.
    pub first_start_ms: Option<u64>,
    /// Its runs that ended in it (each a restart for the crash-loop rule).
    pub failures: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct Violation {
    /// P, R, I, B or C (the harness adds ONE for duplicates, TERM for the bound on
    /// SIGTERM, SETTLE for a probation that never ended, LEASE, START).
    pub invariant: &'static str,
    pub text: String,
    /// The issue item it looks like, when it looks like one.
    pub hint: Option<&'static str>,
}

pub struct Model {
    probation_ms: u64,
    /// The tool's services (`agent`, and `engine` when leader-only).
    services: Vec<String>,
    info: BTreeMap<String, Info>,
    pub committed: BTreeSet<String>,
    pub last_good: Option<String>,
    pub bad: BTreeSet<String>,
    pub probation: Option<Probation>,
    /// Our last accepted upgrade request: (version, --irreversible).
    requested: Option<(String, bool)>,
    /// Per service: the version running (ready) and since when.
    open: BTreeMap<String, (String, u64)>,
    /// (service, version, from, to): the runs seen ready.
    ready: Vec<(String, String, u64, u64)>,
    /// Spans nothing was seen: supd down, or re-executing.
    blind: Vec<(u64, u64)>,
    down_since: Option<u64>,
    /// Irreversible versions that have started.
    irreversible_ran: BTreeSet<String>,
    pub violations: Vec<Violation>,
    /// What happened, for the report: probations, commits, rollbacks.
    pub history: Vec<String>,
    pub figures: BTreeMap<&'static str, usize>,
}

impl Model {
    pub fn new(probation_ms: u64, services: &[&str]) -> Model {
        Model {
            probation_ms,
            services: services.iter().map(|s| s.to_string()).collect(),
            info: BTreeMap::new(),
            committed: BTreeSet::new(),
            last_good: None,
            bad: BTreeSet::new(),
            probation: None,
            requested: None,
            open: BTreeMap::new(),
            ready: Vec::new(),
            blind: Vec::new(),
            down_since: None,
            irreversible_ran: BTreeSet::new(),
            violations: Vec::new(),
            history: Vec::new(),
            figures: BTreeMap::new(),
        }
    }

    fn violate(&mut self, invariant: &'static str, text: String, hint: Option<&'static str>) {
        self.violations.push(Violation {
            invariant,
            text,
            hint,
        });
    }

    fn count(&mut self, what: &'static str) {
        *self.figures.entry(what).or_default() += 1;
    }

    pub fn installed(&mut self, version: &str, info: Info) {
        self.info.insert(version.to_string(), info);
    }

    fn kind(&self, v: &str) -> Option<Kind> {
        self.info.get(v).map(|i| i.kind)
    }

    fn manifest_irreversible(&self, v: &str) -> bool {
        self.info.get(v).is_some_and(|i| i.manifest_irreversible)
    }

    /// supd accepted our `upgrade VERSION`: `--force` cleared the mark.
    pub fn upgrade_accepted(&mut self, version: &str, force: bool, irreversible: bool) {
        if force {
            self.bad.remove(version);
        }
        self.requested = Some((version.to_string(), irreversible));
    }

    /// supd went down (kill -9 or SIGTERM) at `t`: what ran is no longer seen.
    pub fn down(&mut self, t: u64, how: &'static str) {
        for (svc, (v, since)) in std::mem::take(&mut self.open) {
            self.ready.push((svc, v, since, t));
        }
        self.down_since = Some(t);
        if let Some(p) = &mut self.probation {
            if !p.disturbed.contains(&how) {
                p.disturbed.push(how);
            }
        }
    }

    /// supd is told to stop (SIGTERM): what it does from now on until it exits happens
    /// during a disturbance of the probation.
    pub fn disturb(&mut self, how: &'static str) {
        if let Some(p) = &mut self.probation {
            p.disturbed.push(how);
        }
    }

    /// A new supd serves (and is watched) from `t`.
    pub fn up(&mut self, t: u64) {
        if let Some(d) = self.down_since.take() {
            self.blind.push((d, t));
        }
    }

    /// Nothing was seen from `a` to `b` (a reexec), though runs went on.
    pub fn blind(&mut self, a: u64, b: u64, how: &'static str) {
        self.blind.push((a, b));
        if let Some(p) = &mut self.probation {
            p.disturbed.push(how);
        }
    }

    /// At a new watch: `service` runs `version`, ready, as of `t`.
    pub fn seen_running(&mut self, service: &str, version: &str, t: u64) {
        if self.services.iter().any(|s| s == service) && !self.open.contains_key(service) {
            self.open
                .insert(service.to_string(), (version.to_string(), t));
        }
    }

    /// One watch event.
    pub fn event(&mut self, e: &Value) {
        let t = e["time"].as_u64().unwrap_or(0);
        match e["event"].as_str() {
            Some("state") => self.state_event(e, t),
            Some("upgrade") => {
                let v = e["version"].as_str().unwrap_or("").to_string();
                match e["phase"].as_str() {
                    Some("probation") => {
                        let from = e["from"].as_str().map(str::to_string);
                        let reason = e["reason"].as_str().unwrap_or("");
                        self.begin(&v, from, Some(t), reason.contains("switched itself"));
                    }
                    Some("committed") => self.commit(&v, t, true),
                    Some("failed") => self.failed(&v),
                    // The rollback event says where to; this one only ends the
                    // probation if that event was not seen. A tool that switched itself
                    // back to the version before the probation ended it with no
                    // rollback: nothing is marked bad.
                    Some("rolled-back")
                        if e["reason"]
                            .as_str()
                            .unwrap_or("")
                            .contains("switched itself back") =>
                    {
                        self.switched_back(&v)
                    }
                    _ => {}
                }
            }
            Some("rollback") => {
                let from = e["from"].as_str().unwrap_or("").to_string();
                let to = e["to"].as_str().unwrap_or("").to_string();
                let why = e["reason"].as_str().unwrap_or("").to_string();
                self.rolled_back(&from, &to, &why);
            }
            _ => {}
        }
    }

    fn state_event(&mut self, e: &Value, t: u64) {
        let Some(svc) = e["service"].as_str() else {
            return;
        };
        if !self.services.iter().any(|s| s == svc) {
            return;
        }
        let to = e["to"].as_str().unwrap_or("");
        let version = e["version"].as_str().unwrap_or("").to_string();
        if let Some((v, since)) = self.open.remove(svc) {
            self.ready.push((svc.to_string(), v, since, t));
        }
        if to == "starting" {
            if let Some(p) = self.probation.as_mut().filter(|p| p.version == version) {
                p.first_start_ms.get_or_insert(t);
            }
            if self.bad.contains(&version) {
                self.violate(
                    "B",
                    format!("{svc} started on {version}, which is marked bad"),
                    None,
                );
            }
            if self.manifest_irreversible(&version)
                || self
                    .probation
                    .as_ref()
                    .is_some_and(|p| p.irreversible && p.version == version)
            {
                self.irreversible_ran.insert(version.clone());
            }
        }
        if to == "running" {
            self.open.insert(svc.to_string(), (version.clone(), t));
        }
        if ["backoff", "cooldown", "failed"].contains(&to) {
            if let Some(p) = self.probation.as_mut().filter(|p| p.version == version) {
                p.failures
                    .push(format!("{svc}: {}", e["reason"].as_str().unwrap_or("?")));
            }
        }
    }

    fn begin(&mut self, v: &str, from: Option<String>, start: Option<u64>, self_switch: bool) {
        let requested = self
            .requested
            .take()
            .is_some_and(|(r, irr)| r == v && irr && !self_switch);
        let over = self
            .probation
            .as_ref()
            .filter(|p| p.version != v)
            .map(|p| p.version.clone());
        self.history.push(format!(
            "probation of {v} from {}{}{}",
            from.as_deref().unwrap_or("-"),
            if self_switch { " (self-switch)" } else { "" },
            over.as_ref()
                .map_or(String::new(), |o| format!(", during {o}'s")),
        ));
        self.count(if self_switch {
            "self-switch probations"
        } else {
            "upgrade probations"
        });
        self.probation = Some(Probation {
            version: v.to_string(),
            from,
            start_ms: start,
            irreversible: requested || self.manifest_irreversible(v),
            self_switch,
            over,
            disturbed: Vec::new(),
            first_start_ms: None,
            failures: Vec::new(),
        });
    }

    /// How long `service` was ready on `version` (or unseen) within `a..b`.
    fn ready_within(&self, service: &str, version: &str, a: u64, b: u64, now: u64) -> u64 {
        let mut spans: Vec<(u64, u64)> = self
            .ready
            .iter()
            .filter(|(s, v, _, _)| s == service && v == version)
            .map(|(_, _, x, y)| (*x, *y))
            .chain(
                self.open
                    .get(service)
                    .filter(|(v, _)| v == version)
                    .map(|(_, since)| (*since, now)),
            )
            .chain(self.blind.iter().copied())
            .map(|(x, y)| (x.max(a), y.min(b)))
            .filter(|(x, y)| x < y)
            .collect();
        spans.sort();
        let mut total = 0;
        let mut end = 0;
        for (x, y) in spans {
            let x = x.max(end);
            if y > x {
                total += y - x;
                end = y;
            }
        }
        total
    }

    fn commit(&mut self, v: &str, t: u64, seen: bool) {
        let p = self.probation.take().filter(|p| p.version == v);
        let disturbed = p.as_ref().map_or(Vec::new(), |p| p.disturbed.clone());
        let hint_restart = (!disturbed.is_empty()).then_some("item 2");
        if let Some(k @ (Kind::Crash | Kind::Hang)) = self.kind(v) {
            self.violate(
                "P",
                format!(
                    "{v} ({}) was committed: it is never ready, so it never ran its probation{}",
                    k.name(),
                    if disturbed.is_empty() {
                        String::new()
                    } else {
                        format!(" (supd was disturbed in it: {})", disturbed.join(", "))
                    }
                ),
                hint_restart,
            );
        }
        // The crash-loop rule (3 restarts in a minute): a 4th end of a run in the
        // probation is a crash loop, whatever happened to supd meanwhile.
        let looped = p.as_ref().and_then(|p| {
            self.services.iter().find_map(|svc| {
                let f: Vec<String> = p
                    .failures
                    .iter()
                    .filter(|x| x.starts_with(&format!("{svc}: ")))
                    .cloned()
                    .collect();
                (f.len() > CRASH_LOOP_RESTARTS).then(|| (svc.clone(), f))
            })
        });
        if let Some((svc, f)) = looped {
            self.violate(
                "P",
                format!(
                    "{v} ({}) was committed after {} runs of {svc} on it ended in its probation (a crash loop is {CRASH_LOOP_RESTARTS} restarts in 1m){}: {}",
                    self.kind(v).map_or("?", |k| k.name()),
                    f.len(),
                    if disturbed.is_empty() {
                        String::new()
                    } else {
                        format!("; supd was disturbed in it: {}", disturbed.join(", "))
                    },
                    f.join(" | ")
                ),
                hint_restart,
            );
        }
        if let Some(start) = p.as_ref().and_then(|p| p.start_ms) {
            let need = (self.probation_ms as f64 * READY_SHARE) as u64;
            for svc in self.services.clone() {
                let got = self.ready_within(&svc, v, start, t, t);
                if got < need {
                    let leader_only = svc != "agent";
                    // The probation's clock ran while the old version was still
                    // stopping (supd may see a run's end up to a second late).
                    let late_start = p
                        .as_ref()
                        .and_then(|p| p.first_start_ms)
                        .map(|s1| s1.saturating_sub(start))
                        .filter(|d| *d * 10 > self.probation_ms * 3);
                    self.violate(
                        "P",
                        format!(
                            "{v} ({}) was committed {}ms after its probation began, but {svc} was ready on it only {got}ms of the {}ms probation (time supd was down counted as ready){}{}",
                            self.kind(v).map_or("?", |k| k.name()),
                            t.saturating_sub(start),
                            self.probation_ms,
                            if disturbed.is_empty() {
                                String::new()
                            } else {
                                format!("; supd was disturbed in it: {}", disturbed.join(", "))
                            },
                            match p.as_ref().map(|p| p.first_start_ms) {
                                Some(None) => format!("; {v} never started in its probation"),
                                _ => late_start.map_or(String::new(), |d| format!(
                                    "; {v} first started {d}ms after the probation began (the version before was still stopping)"
                                )),
                            },
                        ),
                        if leader_only {
                            Some("item 1")
                        } else if matches!(self.kind(v), Some(Kind::Flaky | Kind::Slow))
                            && !disturbed.is_empty()
                        {
                            Some("item 2")
                        } else if p.as_ref().is_some_and(|p| p.first_start_ms.is_none()) {
                            Some("none: NEW, committed though it never started (its deadline passed while the run before was still stopping, or while supd shut down)")
                        } else if late_start.is_some() {
                            Some("none: NEW, the probation counts from the switch, not from the version's start")
                        } else {
                            hint_restart
                        },
                    );
                }
            }
        } else {
            self.count("commits whose probation's start was not seen");
        }
        self.history.push(format!(
            "{v} committed{}",
            if seen { "" } else { " (seen in the record)" }
        ));
        self.count("commits");
        self.committed.insert(v.to_string());
        self.last_good = Some(v.to_string());
    }

    fn failed(&mut self, v: &str) {
        let p = self.probation.take();
        self.history
            .push(format!("{v}'s probation failed; it stays (not revertible)"));
        self.count("failed irreversible probations");
        if !p.as_ref().is_some_and(|p| p.irreversible) && !self.manifest_irreversible(v) {
            // Not a broken promise as such (nothing to roll back to is one reason), but
            // worth seeing.
            self.history
                .push(format!("  (note: {v} was not known to be irreversible)"));
        }
        self.last_good = Some(v.to_string());
    }

    /// The tool switched itself back to the version before `v`'s probation: the
    /// probation is over, as by an operator's rollback; nothing is marked bad.
    fn switched_back(&mut self, v: &str) {
        if self.probation.as_ref().is_some_and(|p| p.version == v) {
            self.history.push(format!(
                "the tool switched back from {v}: its probation is over"
            ));
            self.probation = None;
        }
    }

    fn rolled_back(&mut self, from: &str, to: &str, why: &str) {
        let p = self.probation.take();
        self.history
            .push(format!("rolled back from {from} to {to} ({why})"));
        self.count("rollbacks");
        let expected = self.last_good.clone();
        let in_p = p.as_ref().filter(|p| p.version == from);
        if expected.as_deref() != Some(to) {
            let accepted = self.irreversible_ran.contains(to);
            if accepted {
                self.history.push(format!(
                    "  (note: {to} is not the last committed version {expected:?} but an irreversible one that ran since)"
                ));
            } else {
                let hint =
                    in_p.and_then(|p| (p.self_switch && p.over.is_some()).then_some("item 3"));
                self.violate(
                    "R",
                    format!(
                        "{from} was rolled back to {to}, but the last committed version is {}{}",
                        expected.as_deref().unwrap_or("none"),
                        in_p.map_or(String::new(), |p| format!(
                            " ({from}'s probation: from {}{}{})",
                            p.from.as_deref().unwrap_or("-"),
                            if p.self_switch { ", a self-switch" } else { "" },
                            p.over
                                .as_ref()
                                .map_or(String::new(), |o| format!(" during {o}'s probation"))
                        )),
                    ),
                    hint,
                );
            }
        }
        let irreversible = self.manifest_irreversible(from) || in_p.is_some_and(|p| p.irreversible);
        if irreversible {
            let hint = in_p.and_then(|p| p.self_switch.then_some("item 4"));
            self.violate(
                "I",
                format!(
                    "{from} is irreversible ({}), yet it was rolled back to {to}",
                    if self.manifest_irreversible(from) {
                        "revertible = false"
                    } else {
                        "--irreversible"
                    }
                ),
                hint,
            );
        }
        self.bad.insert(from.to_string());
    }

    /// supd has settled (no probation pending): `versions` data, what the `current`
    /// link names and what the record on disk says; `now` in unix ms.
    /// `agent` is the agent's state: in cooldown or failed, nothing starts it, so a
    /// switch of `current` by the tool is seen only at its next start (the link may name
    /// another version then).
    pub fn settled(
        &mut self,
        versions: &Value,
        link: Option<&str>,
        record: Option<&str>,
        agent: &str,
        now: u64,
    ) {
        self.count("settled states checked");
        let current = versions["current"].as_str();
        let phase = versions["phase"].as_str().unwrap_or("");
        // An outcome whose event was not seen (supd restarted before the watch came).
        if let Some(p) = self.probation.clone() {
            match (phase, current) {
                ("committed", Some(c)) if c == p.version => self.commit(c, now, false),
                ("rolled-back", _)
                    if versions["reason"]
                        .as_str()
                        .unwrap_or("")
                        .contains("switched itself back") =>
                {
                    self.switched_back(&p.version)
                }
                ("rolled-back", Some(c)) if versions["proposed"] == p.version.as_str() => {
                    self.history
                        .push("  (the rollback below was seen in the record)".into());
                    self.rolled_back(&p.version, c, "seen in the record")
                }
                ("failed", Some(c)) if c == p.version => self.failed(c),
                _ => {}
            }
        }
        let idle = agent == "cooldown" || agent == "failed";
        if link != current && record == current && idle {
            self.history.push(format!(
                "  (current names {link:?} while the agent is in {agent} on {current:?}: a self-switch not seen yet)"
            ));
        } else if link != current || record != current {
            self.violate(
                "C",
                format!(
                    "current names {link:?}, versions says {current:?}, the record {record:?} (phase {phase})"
                ),
                None,
            );
        }
        let bad_now: BTreeSet<String> = versions["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|x| x["bad"] == true)
            .filter_map(|x| x["version"].as_str().map(str::to_string))
            .collect();
        for b in self.bad.clone() {
            if !bad_now.contains(&b) {
                self.violate(
                    "B",
                    format!("{b} was marked bad (or rolled back), and is no longer"),
                    None,
                );
            }
        }
        self.bad.extend(bad_now.iter().cloned());
        if let Some(c) = current {
            if bad_now.contains(c) {
                self.violate("B", format!("current is {c}, which is marked bad"), None);
            }
            if self.last_good.as_deref() != Some(c) {
                self.violate(
                    "C",
                    format!(
                        "settled on {c} (phase {phase}), but the last good version is {}",
                        self.last_good.as_deref().unwrap_or("none")
                    ),
                    None,
                );
                // Once said, go on from what is.
                self.last_good = Some(c.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn model() -> Model {
        let mut m = Model::new(500, &["agent"]);
        for (v, k, irr) in [
            ("1.0.0", Kind::Good, false),
            ("2.0.0", Kind::Good, false),
            ("2.1.0", Kind::Crash, false),
            ("3.0.0", Kind::Crash, true),
        ] {
            m.installed(
                v,
                Info {
                    kind: k,
                    manifest_irreversible: irr,
                },
            );
        }
        m.event(&json!({"event": "upgrade", "phase": "probation", "version": "1.0.0", "time": 0}));
        m.event(&json!({"event": "state", "service": "agent", "to": "running", "version": "1.0.0", "time": 10}));
        m.event(
            &json!({"event": "upgrade", "phase": "committed", "version": "1.0.0", "time": 500}),
        );
        m
    }

    #[test]
    fn a_self_switch_in_probation_rolled_back_to_the_version_in_probation_breaks_r() {
        let mut m = model();
        assert!(m.violations.is_empty(), "{:?}", m.violations);
        m.event(&json!({"event": "upgrade", "phase": "probation", "version": "2.0.0", "from": "1.0.0", "time": 600}));
        m.event(
            &json!({"event": "upgrade", "phase": "probation", "version": "2.1.0", "from": "2.0.0",
                        "reason": "the tool switched itself from 2.0.0 to 2.1.0", "time": 700}),
        );
        m.event(&json!({"event": "rollback", "from": "2.1.0", "to": "2.0.0", "time": 800}));
        assert_eq!(m.violations.len(), 1, "{:?}", m.violations);
        assert_eq!(
            (m.violations[0].invariant, m.violations[0].hint),
            ("R", Some("item 3"))
        );
    }

    #[test]
    fn a_crash_version_committed_breaks_p_and_a_short_run_too() {
        let mut m = model();
        m.event(&json!({"event": "upgrade", "phase": "probation", "version": "2.1.0", "from": "1.0.0", "time": 600}));
        m.down(650, "kill -9");
        m.up(700);
        m.event(
            &json!({"event": "upgrade", "phase": "committed", "version": "2.1.0", "time": 1100}),
        );
        assert!(m
            .violations
            .iter()
            .any(|v| v.invariant == "P" && v.hint == Some("item 2")));
        let mut m = model();
        m.event(&json!({"event": "upgrade", "phase": "probation", "version": "2.0.0", "from": "1.0.0", "time": 600}));
        m.event(&json!({"event": "state", "service": "agent", "to": "running", "version": "2.0.0", "time": 1000}));
        m.event(
            &json!({"event": "upgrade", "phase": "committed", "version": "2.0.0", "time": 1100}),
        );
        assert_eq!(m.violations.len(), 1, "{:?}", m.violations);
        // Ready the whole probation: fine.
        let mut m = model();
        m.event(&json!({"event": "upgrade", "phase": "probation", "version": "2.0.0", "from": "1.0.0", "time": 600}));
        m.event(&json!({"event": "state", "service": "agent", "to": "running", "version": "2.0.0", "time": 620}));
        m.event(
            &json!({"event": "upgrade", "phase": "committed", "version": "2.0.0", "time": 1100}),
        );
        assert!(m.violations.is_empty(), "{:?}", m.violations);
    }

    #[test]
    fn an_irreversible_rollback_breaks_i_and_lost_marks_break_b() {
        let mut m = model();
        m.event(&json!({"event": "upgrade", "phase": "probation", "version": "3.0.0", "from": "1.0.0", "time": 600}));
        m.event(&json!({"event": "rollback", "from": "3.0.0", "to": "1.0.0", "time": 800}));
        assert_eq!(m.violations.len(), 1);
        assert_eq!(m.violations[0].invariant, "I");
        let v = json!({"current": "1.0.0", "phase": "rolled-back", "versions": [{"version": "3.0.0", "bad": false}]});
        m.settled(&v, Some("1.0.0"), Some("1.0.0"), "running", 900);
        assert_eq!(m.violations.len(), 2);
        assert_eq!(m.violations[1].invariant, "B");
    }
}
