//! What a sequence does: its parameters and its steps, all drawn from its seed before it
//! runs (so a seed names the same steps on every machine, and the list is printed with
//! any failure). A step that does not apply when its turn comes (a self-switch while no
//! good version runs) is skipped, and the log says so.

use crate::rng::Rng;
use std::fmt;

/// How a version of `agent` behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Ready at once, runs until stopped; switches `current` itself when told to.
    Good,
    /// Exits with code 3 before it is ready.
    Crash,
    /// Never ready (the ready timeout fails each start).
    Hang,
    /// Ready, then exits with code 3 20 ms later.
    Flaky,
    /// Ready, then exits with code 3 150 ms later: its crash loop takes most of a
    /// probation, so a restart of supd in it matters.
    Slow,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Good => "good",
            Kind::Crash => "crash",
            Kind::Hang => "hang",
            Kind::Flaky => "flaky",
            Kind::Slow => "slow crasher",
        }
    }
}

/// One version the sequence installs.
#[derive(Clone, Debug)]
pub struct Version {
    pub name: String,
    pub kind: Kind,
    /// `sup-tool.toml` says `revertible = false`.
    pub manifest_irreversible: bool,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}", self.name, self.kind.name())?;
        if self.manifest_irreversible {
            write!(f, ", revertible = false")?;
        }
        write!(f, ")")
    }
}

#[derive(Clone, Debug)]
pub enum Action {
    Install(Version),
    /// `upgrade agent VERSION` (without --wait: the sequence waits as it says).
    Upgrade {
        version: String,
        force: bool,
        irreversible: bool,
    },
    /// The running version (if a good one) repoints `current` to this one and exits.
    SelfSwitch(String),
    /// SIGKILL to the agent's run.
    Crash,
    /// kill -9 of supd, then a new supd.
    KillSupd,
    /// SIGTERM to supd (it must exit within shutdown_timeout and a margin), then a new supd.
    RestartSupd,
    Reexec,
    /// `reload`; `changed`: the agent's environment changes, so the reload restarts it.
    Reload {
        changed: bool,
    },
    /// `lease-grant` of the lease `engine` to this node, valid for this long.
    LeaseGrant {
        valid_ms: u64,
    },
    LeaseRelease,
}

/// What the sequence does after a step.
#[derive(Clone, Copy, Debug)]
pub enum Then {
    /// Waits until supd has settled (no probation pending, the agent up or given up),
    /// then checks the state.
    Settle,
    /// Lets this long pass (the next step's moment: perhaps in the middle of a
    /// probation, a crash loop or a rollback).
    Wait(u64),
}

#[derive(Clone, Debug)]
pub struct Step {
    pub action: Action,
    pub then: Then,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.action {
            Action::Install(v) => write!(f, "install {v}")?,
            Action::Upgrade {
                version,
                force,
                irreversible,
            } => {
                write!(f, "upgrade {version}")?;
                if *force {
                    write!(f, " --force")?;
                }
                if *irreversible {
                    write!(f, " --irreversible")?;
                }
            }
            Action::SelfSwitch(to) => write!(f, "self-switch to {to}")?,
            Action::Crash => write!(f, "crash (KILL the agent)")?,
            Action::KillSupd => write!(f, "kill -9 supd, start it again")?,
            Action::RestartSupd => write!(f, "SIGTERM supd, start it again")?,
            Action::Reexec => write!(f, "reexec")?,
            Action::Reload { changed } => write!(
                f,
                "reload ({})",
                if *changed {
                    "agent's env changed"
                } else {
                    "same config"
                }
            )?,
            Action::LeaseGrant { valid_ms } => write!(f, "lease-grant engine for {valid_ms}ms")?,
            Action::LeaseRelease => write!(f, "lease-release engine")?,
        }
        match self.then {
            Then::Settle => write!(f, "; settle"),
            Then::Wait(ms) => write!(f, "; {ms}ms"),
        }
    }
}

/// One sequence: its seed, its parameters and its steps.
#[derive(Clone, Debug)]
pub struct Sequence {
    pub seed: u64,
    pub probation_ms: u64,
    pub ready_timeout_ms: u64,
    /// The agent's `stop_timeout`: how long a stop may take (and, where supd notices a
    /// run's end late, how late).
    pub stop_timeout_ms: u64,
    /// `[lease.engine] tool = "agent"` and a second service of the tool, leader-only.
    pub lease: bool,
    /// supd's stderr is a one-page pipe read only now and then (a stalled journald or
    /// console, issue 23): what supd cannot write waits or is counted, never waited for.
    pub stalled_stderr: bool,
    /// The services' `kill_mode` (issue 24): a good version also starts a "session" (a
    /// `setsid sleep`, as sshd's sessions), which "group" and "main" never end and
    /// "cgroup" always does; under "main" its worker is left at each end of a run.
    pub kill_mode: &'static str,
    /// The services' file (services.d/agent.toml) is broken on disk but for each
    /// reload, which writes it whole, reads it and breaks it again (issue 24): every
    /// new supd and every reexec runs its last good copy, and says so.
    pub broken_file: bool,
    pub steps: Vec<Step>,
}

impl fmt::Display for Sequence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "sequence {} (probation {}ms, ready_timeout {}ms, stop_timeout {}ms{}), after 1.0.0 (good) committed:",
            self.seed,
            self.probation_ms,
            self.ready_timeout_ms,
            self.stop_timeout_ms,
            if self.lease {
                ", leader-only service engine of the tool"
            } else {
                ""
            }
        )?;
        if self.stalled_stderr {
            writeln!(
                f,
                "  (supd's stderr: a one-page pipe read only now and then)"
            )?;
        }
        writeln!(f, "  (kill_mode = \"{}\")", self.kill_mode)?;
        if self.broken_file {
            writeln!(
                f,
                "  (services.d/agent.toml broken on disk but for each reload)"
            )?;
        }
        for (i, s) in self.steps.iter().enumerate() {
            writeln!(f, "  {:>2}. {s}", i + 1)?;
        }
        Ok(())
    }
}

/// Draws a sequence of `lo..=hi` steps from `seed`. `lease`: whether sequences may use
/// the lease (a third of them do).
pub fn generate(seed: u64, lo: u64, hi: u64, lease: bool) -> Sequence {
    let mut rng = Rng::new(seed);
    let probation_ms = rng.range(500, 900);
    // Not much shorter: a good version must be ready within it on a loaded machine.
    let ready_timeout_ms = rng.range(300, 500);
    let stop_timeout_ms = if rng.chance(30) { 1000 } else { 150 };
    let lease = lease && rng.chance(33);
    let n = rng.range(lo, hi + 1);
    let mut installed: Vec<Version> = vec![Version {
        name: "1.0.0".into(),
        kind: Kind::Good,
        manifest_irreversible: false,
    }];
    // The newest installed version not yet upgraded to.
    let mut fresh: Option<String> = None;
    let mut next = 1;
    let mut steps = Vec::new();
    while steps.len() < n as usize {
        // install, upgrade, self-switch, crash, kill -9, SIGTERM, reexec, reload, lease.
        // Right after an upgrade or a self-switch left in flight, the next step is more
        // often one that disturbs its probation.
        let in_flight = matches!(
            steps.last(),
            Some(Step {
                action: Action::Upgrade { .. } | Action::SelfSwitch(_),
                then: Then::Wait(_),
            })
        );
        let weights = if in_flight {
            [4, 4, 22, 10, 20, 16, 10, 6, if lease { 8 } else { 0 }]
        } else {
            [18, 22, 12, 8, 10, 8, 6, 6, if lease { 10 } else { 0 }]
        };
        let action = match rng.weighted(&weights) {
            0 => {
                let kind = match rng.weighted(&[40, 15, 15, 15, 15]) {
                    0 => Kind::Good,
                    1 => Kind::Crash,
                    2 => Kind::Hang,
                    3 => Kind::Flaky,
                    _ => Kind::Slow,
                };
                let v = Version {
                    name: format!("1.{next}.0"),
                    kind,
                    manifest_irreversible: rng.chance(15),
                };
                next += 1;
                fresh = Some(v.name.clone());
                installed.push(v.clone());
                Action::Install(v)
            }
            1 => {
                let version = match fresh.take() {
                    Some(v) if rng.chance(80) => v,
                    _ => rng.pick(&installed).name.clone(),
                };
                Action::Upgrade {
                    version,
                    force: rng.chance(20),
                    irreversible: rng.chance(10),
                }
            }
            2 => {
                // Mostly to a version that fails (what a rollback must undo), else any.
                let failing: Vec<&Version> =
                    installed.iter().filter(|v| v.kind != Kind::Good).collect();
                let to = if !failing.is_empty() && rng.chance(60) {
                    rng.pick(&failing).name.clone()
                } else {
                    rng.pick(&installed).name.clone()
                };
                Action::SelfSwitch(to)
            }
            3 => Action::Crash,
            4 => Action::KillSupd,
            5 => Action::RestartSupd,
            6 => Action::Reexec,
            7 => Action::Reload {
                changed: rng.chance(50),
            },
            _ => {
                if rng.chance(70) {
                    Action::LeaseGrant {
                        valid_ms: if rng.chance(70) {
                            3_600_000
                        } else {
                            rng.range(300, 1500)
                        },
                    }
                } else {
                    Action::LeaseRelease
                }
            }
        };
        // An install is quick and changes nothing that runs: no reason to settle after it.
        let then = if matches!(action, Action::Install(_)) {
            Then::Wait(0)
        } else if rng.chance(45) {
            Then::Wait(rng.range(0, probation_ms))
        } else {
            Then::Settle
        };
        steps.push(Step { action, then });
    }
    // Drawn last, so the steps of a seed are those it drew before this parameter was.
    let stalled_stderr = rng.chance(33);
    let kill_mode = ["cgroup", "cgroup", "group", "main"][rng.range(0, 4) as usize];
    let broken_file = rng.chance(33);
    Sequence {
        seed,
        probation_ms,
        ready_timeout_ms,
        stop_timeout_ms,
        lease,
        stalled_stderr,
        kill_mode,
        broken_file,
        steps,
    }
}
