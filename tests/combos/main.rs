//! The model-based combination test of issue 21: random sequences of installs, upgrades
//! (perhaps `--force`, `--irreversible`), self-switches, crashes, kill -9 and clean
//! restarts of supd, reexec, reloads and lease grants and releases (a third of them with
//! supd's stderr a pipe read only now and then, a third with the services' file broken
//! on disk but for each reload, each with a `kill_mode` drawn), against a real supd
//! with one versioned tool `agent`; after each settled step the invariants of
//! `model.rs` (no commit without a probation run, rollback to the last committed
//! version, irreversible never rolled back, bad marks kept, `current` agrees with the
//! record) and of the harness (at most one instance, supd exits on SIGTERM within its
//! bound, sessions kept or ended as `kill_mode` says, a broken file's copy run by every
//! new supd, a reexec refused only as busy). Run it with
//!
//! ```sh
//! cargo test --release --test combos -- --ignored --nocapture --test-threads=1
//! ```
//!
//! Each sequence has a seed of its own, drawn from a master seed, and everything it
//! does is drawn from that seed before it runs. `SUP_COMBO_SEED=N` replays the one
//! sequence N; `SUP_COMBO_RUNS=N` sets how many sequences (240 by default),
//! `SUP_COMBO_THREADS=N` how many run at once (each in its own sandbox; 8 by default);
//! `SUP_COMBO_VERBOSE=1` prints what each sequence did, failed or not.
//! A failure names the seed, the steps, what happened, the invariant broken (and the
//! item of issue 21 it looks like), and the versions record; supd's log is kept in
//! `target/tmp/combos/SEED.supd.log`.

#[path = "../common/mod.rs"]
mod common;
mod model;
mod node;
mod rng;
mod steps;

use node::Node;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use steps::{Action, Kind, Sequence, Step, Then, Version};

/// What one sequence came to.
struct Report {
    seed: u64,
    text: String,
    failures: Vec<(usize, &'static str, String, Option<&'static str>)>,
    figures: BTreeMap<&'static str, usize>,
}

/// Runs one sequence in a thread of its own: a panic of the harness (supd not answering,
/// a wait past its deadline) is a failure of the sequence, with its seed.
fn run(seq: Sequence) -> Report {
    let seed = seq.seed;
    let listing = seq.to_string();
    let log: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let shared = log.clone();
    let handle = std::thread::Builder::new()
        .name(format!("combo-{seed}"))
        .spawn(move || {
            let mut n = Node::new(seq);
            let mut go = n.prologue();
            for i in 0..n.seq.steps.len() {
                if !go {
                    break;
                }
                go = n.run_step(i);
                *shared.lock().expect("log") = n.log.clone();
            }
            if go {
                n.epilogue();
            }
            *shared.lock().expect("log") = n.log.clone();
            let failures: Vec<_> = n
                .found
                .iter()
                .map(|(s, v)| (*s, v.invariant, v.text.clone(), v.hint))
                .collect();
            let mut figures = n.figures.clone();
            figures.extend(n.model.figures.clone());
            let history = n.model.history.join("\n    ");
            let record = n.final_versions();
            if !failures.is_empty() {
                keep_log(seed, &n.sb.supd_log());
            }
            (failures, figures, history, record)
        })
        .expect("spawn a sequence");
    let (failures, figures, history, record) = match handle.join() {
        Ok(r) => r,
        Err(p) => {
            let why = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "?".into());
            (
                vec![(0, "HARNESS", format!("the sequence panicked: {why}"), None)],
                BTreeMap::new(),
                String::new(),
                String::new(),
            )
        }
    };
    let steps_log = log.lock().expect("log").join("\n    ");
    let text = format!(
        "{listing}  what happened:\n    {steps_log}\n  outcomes:\n    {history}\n  the record at the end: {record}"
    );
    Report {
        seed,
        text,
        failures,
        figures,
    }
}

fn keep_log(seed: u64, log: &str) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("combos");
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("{seed}.supd.log")), log);
}

fn describe(r: &Report) -> String {
    let mut s = format!(
        "combo: FAIL seed {} (replay: SUP_COMBO_SEED={} cargo test --release --test combos -- --ignored --nocapture)\n",
        r.seed, r.seed
    );
    for (step, inv, text, hint) in &r.failures {
        s += &format!(
            "  [{inv}] at step {step}: {text}{}\n",
            hint.map_or(String::new(), |h| match h.strip_prefix("none: ") {
                Some(new) => format!("  (matches no item of issue 21: {new})"),
                None => format!("  (looks like issue 21 {h})"),
            })
        );
    }
    s += &r.text;
    s += &format!(
        "\n  supd's log: {}/combos/{}.supd.log\n",
        env!("CARGO_TARGET_TMPDIR"),
        r.seed
    );
    s
}

/// Runs `seqs` on `threads` threads; prints each failure as it comes and the figures;
/// panics if any sequence failed.
fn run_all(name: &'static str, seqs: Vec<Sequence>, threads: usize) {
    let started = std::time::Instant::now();
    let total = seqs.len();
    let queue = Arc::new(Mutex::new(seqs));
    let done = Arc::new(AtomicUsize::new(0));
    let reports: Arc<Mutex<Vec<Report>>> = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..threads.min(total).max(1))
        .map(|_| {
            let (queue, done, reports) = (queue.clone(), done.clone(), reports.clone());
            std::thread::spawn(move || loop {
                let Some(seq) = queue.lock().expect("queue").pop() else {
                    break;
                };
                let r = run(seq);
                let n = done.fetch_add(1, Ordering::SeqCst) + 1;
                if r.failures.is_empty() {
                    eprintln!("combo {name} {n}/{total}: seed {} ok", r.seed);
                    if std::env::var_os("SUP_COMBO_VERBOSE").is_some() {
                        eprintln!("{}", r.text);
                    }
                } else {
                    eprintln!("combo {name} {n}/{total}: {}", describe(&r));
                }
                reports.lock().expect("reports").push(r);
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let reports = std::mem::take(&mut *reports.lock().expect("reports"));
    let mut figures: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut by_invariant: BTreeMap<(&'static str, Option<&'static str>), Vec<u64>> =
        BTreeMap::new();
    for r in &reports {
        for (k, v) in &r.figures {
            *figures.entry(k).or_default() += v;
        }
        for (_, inv, _, hint) in &r.failures {
            let seeds = by_invariant.entry((inv, *hint)).or_default();
            if !seeds.contains(&r.seed) {
                seeds.push(r.seed);
            }
        }
    }
    let failed: Vec<u64> = reports
        .iter()
        .filter(|r| !r.failures.is_empty())
        .map(|r| r.seed)
        .collect();
    let figs: String = figures.iter().map(|(k, v)| format!(", {v} {k}")).collect();
    eprintln!(
        "combo {name}: {} sequences in {:.0?}, {} failed{figs}",
        reports.len(),
        started.elapsed(),
        failed.len()
    );
    for ((inv, hint), seeds) in &by_invariant {
        eprintln!(
            "combo {name}: [{inv}]{} in {} sequence(s): seeds {:?}",
            hint.map_or(String::new(), |h| match h.strip_prefix("none: ") {
                Some(new) => format!(" ({new})"),
                None => format!(" (issue 21 {h}?)"),
            }),
            seeds.len(),
            &seeds[..seeds.len().min(12)]
        );
    }
    assert!(
        failed.is_empty(),
        "{} of {} sequences broke the contract (seeds {:?}); each is printed above with its steps; \
         replay one with SUP_COMBO_SEED=N cargo test --release --test combos -- --ignored --nocapture",
        failed.len(),
        reports.len(),
        &failed[..failed.len().min(20)]
    );
}

/// Random sequences: a few hundred in release mode in a few minutes (`.ci/run`).
#[test]
#[ignore = "combination test: cargo test --release --test combos -- --ignored --nocapture --test-threads=1"]
fn random_sequences() {
    if !common::is_root() {
        eprintln!("combos: not root; flock and the signals work without it, going on");
    }
    let seqs: Vec<Sequence> = match rng::replay_seed() {
        Some(seed) => {
            eprintln!("combo: replaying sequence {seed}");
            vec![steps::generate(seed, 5, 10, true)]
        }
        None => {
            let master = rng::master_seed();
            let n = rng::runs(240);
            eprintln!("combo: master seed {master}, {n} sequences");
            (0..n)
                .map(|i| steps::generate(rng::sequence_seed(master, i), 5, 10, true))
                .collect()
        }
    };
    for s in &seqs {
        if seqs.len() == 1 {
            eprintln!("{s}");
        }
    }
    run_all("random", seqs, rng::threads(8));
}

fn step(action: Action, then: Then) -> Step {
    Step { action, then }
}

fn version(name: &str, kind: Kind, irreversible: bool) -> Version {
    Version {
        name: name.into(),
        kind,
        manifest_irreversible: irreversible,
    }
}

/// Two fixed short sequences, so that `cargo test` runs the harness and the model on
/// paths the contract is known to keep: a good upgrade, a crashing one rolled back, an
/// irreversible one that stays, a kill -9 and a clean restart of supd between settled
/// states, a reexec, reloads and a self-switch to a good version.
#[test]
fn fixed_sequences() {
    let good = |v: &str| version(v, Kind::Good, false);
    let a = Sequence {
        seed: 1,
        // Long enough that a run's end seen a second late (supd reaps orphans by a scan
        // owed within a second) does not eat 40% of it.
        probation_ms: 3000,
        ready_timeout_ms: 200,
        stop_timeout_ms: 1000,
        lease: false,
        stalled_stderr: false,
        kill_mode: "cgroup",
        broken_file: false,
        steps: vec![
            step(Action::Install(good("1.1.0")), Then::Wait(0)),
            step(
                Action::Upgrade {
                    version: "1.1.0".into(),
                    force: false,
                    irreversible: false,
                },
                Then::Settle,
            ),
            step(
                Action::Install(version("1.2.0", Kind::Flaky, false)),
                Then::Wait(0),
            ),
            step(
                Action::Upgrade {
                    version: "1.2.0".into(),
                    force: false,
                    irreversible: false,
                },
                Then::Settle,
            ),
            step(Action::KillSupd, Then::Settle),
            step(
                Action::Install(version("1.3.0", Kind::Hang, true)),
                Then::Wait(0),
            ),
            step(
                Action::Upgrade {
                    version: "1.3.0".into(),
                    force: false,
                    irreversible: false,
                },
                Then::Settle,
            ),
            step(Action::RestartSupd, Then::Settle),
        ],
    };
    let b = Sequence {
        seed: 2,
        // Long enough that a run's end seen a second late (supd reaps orphans by a scan
        // owed within a second) does not eat 40% of it.
        probation_ms: 3000,
        ready_timeout_ms: 200,
        stop_timeout_ms: 1000,
        lease: false,
        // Its supd's stderr stalls: a reexec, a reload and a self-switch beside it.
        stalled_stderr: true,
        kill_mode: "group",
        // Its services' file broken on disk: the kill -9 and the restarts of supd run
        // its last good copy.
        broken_file: true,
        steps: vec![
            step(Action::Install(good("1.1.0")), Then::Wait(0)),
            step(
                Action::Install(version("1.2.0", Kind::Crash, false)),
                Then::Wait(0),
            ),
            step(Action::SelfSwitch("1.1.0".into()), Then::Settle),
            step(Action::Reexec, Then::Settle),
            step(Action::Reload { changed: true }, Then::Settle),
            step(
                Action::Upgrade {
                    version: "1.2.0".into(),
                    force: false,
                    irreversible: false,
                },
                Then::Settle,
            ),
            step(Action::Crash, Then::Settle),
            step(Action::Reload { changed: false }, Then::Settle),
        ],
    };
    run_all("fixed", vec![a, b], rng::threads(2));
}
