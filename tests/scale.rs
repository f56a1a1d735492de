//! Scale (issue 15): 2,000 services in one supd. Every one comes up (running, its pid
//! alive), a 50-long `after` chain starts in its order, 200 SIGKILLed by pid are each
//! restarted with a new pid while the others keep theirs, and on SIGTERM supd stops every
//! one of them and exits 0. Correctness only: the timings are bench/scale's.

mod common;
use common::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Idle services (`/bin/sleep`), and the `after` chain beside them: 2,000 in all.
const IDLE: usize = 1950;
const CHAIN: usize = 50;
/// Idle services SIGKILLed at once.
const KILLED: usize = 200;
/// The longest one phase (all up, the restarts, the shutdown) may take: generous for a
/// debug build on two shared cores, where the whole test takes well under a minute.
const PHASE: Duration = Duration::from_secs(120);
/// Open files supd needs: per service its pid record and two captured-output pipes
/// (stdout, stderr kept apart) of two ends each, plus its own.
const NOFILE: u64 = 5 * (IDLE + CHAIN) as u64 + 1024;

fn idle(i: usize) -> String {
    format!("idle{i:04}")
}

/// `chainK` starts after `chain(K+1)`: the chain runs against both the names' order and
/// the order of the config, so a supd that ignored `after` would start it backwards.
fn chain(k: usize) -> String {
    format!("chain{k:02}")
}

/// Raises this process's soft limits of open files and processes (supd inherits them;
/// it raises its own open files to the hard limit too), and the hard ones when they are
/// too low and it may. Panics when a hard limit stays below what 2,000 services need.
fn raise_limits() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    for (res, want) in [
        (Resource::RLIMIT_NOFILE, NOFILE),
        (Resource::RLIMIT_NPROC, 4 * (IDLE + CHAIN) as u64 + 4096),
    ] {
        let (soft, hard) = getrlimit(res).expect("getrlimit");
        if soft >= want {
            continue;
        }
        // Root may raise the hard limit too (CAP_SYS_RESOURCE), a container's root not.
        let hard = if hard >= want || setrlimit(res, want, want).is_err() {
            hard
        } else {
            want
        };
        assert!(
            hard >= want,
            "{res:?}: the hard limit {hard} is below the {want} this test needs \
             (raise it: ulimit -H, LimitNOFILE=/LimitNPROC= in a unit)"
        );
        setrlimit(res, want, hard).expect("setrlimit");
    }
}

/// A `watch` stream read by a thread of its own, so that supd never finds it unread
/// (it disconnects a client that does not read) while the test asks `status`.
fn watch_events(sb: &Sandbox) -> mpsc::Receiver<Value> {
    let mut c = sb.client();
    let a = c.call(json!({"cmd": "watch"}));
    assert_eq!(a["ok"], true, "watch refused: {a}");
    c.reader
        .get_ref()
        .set_read_timeout(None)
        .expect("no timeout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || loop {
        let mut line = String::new();
        match c.reader.read_line(&mut line) {
            Ok(0) | Err(_) => return, // supd closed it (it exited)
            Ok(_) => {
                let e: Value = serde_json::from_str(&line).expect("event JSON");
                if tx.send(e).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// Takes events until `take` has seen all it waits for (it says so by returning true);
/// panics with `what()` after `limit`.
fn until(
    sb: &Sandbox,
    rx: &mpsc::Receiver<Value>,
    limit: Duration,
    what: impl Fn() -> String,
    mut take: impl FnMut(&Value) -> bool,
) {
    let end = Instant::now() + limit;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(e) => {
                if take(&e) {
                    return;
                }
            }
            Err(err) => panic!(
                "{} ({err:?} after {limit:?})\nsupd's log ends:\n{}",
                what(),
                tail(&sb.supd_log())
            ),
        }
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Every service's status, by name.
fn status_all(sb: &Sandbox) -> BTreeMap<String, Value> {
    sb.ok(json!({"cmd": "status"}))["services"]
        .as_array()
        .expect("services")
        .iter()
        .map(|s| (s["name"].as_str().expect("name").to_string(), s.clone()))
        .collect()
}

fn pid_of(s: &Value) -> i32 {
    s["pid"].as_i64().unwrap_or(0) as i32
}

fn cmdline(pid: i32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default()
}

/// Checks every service is running with a live pid (the idle ones running their sleep);
/// returns each one's (pid, start time), the pair that names one process.
fn all_running(sb: &Sandbox, names: &[String], sleep: &[u8]) -> BTreeMap<String, (i32, u64)> {
    let st = status_all(sb);
    let mut procs = BTreeMap::new();
    let mut bad = Vec::new();
    for name in names {
        let s = &st[name];
        let pid = pid_of(s);
        let stat = (pid > 0).then(|| sup::proc::stat(pid)).flatten();
        match stat {
            Some(p)
                if s["state"] == "running"
                    && p.state != 'Z'
                    && (!name.starts_with("idle") || cmdline(pid) == sleep) =>
            {
                procs.insert(name.clone(), (pid, p.start_time));
            }
            _ => bad.push(format!("{name}: {s} (/proc: {stat:?})")),
        }
    }
    assert!(
        bad.is_empty(),
        "{} of {} services are not running with a live process, e.g.:\n{}",
        bad.len(),
        names.len(),
        bad[..bad.len().min(10)].join("\n")
    );
    procs
}

#[test]
fn two_thousand_services_come_up_restart_after_a_kill_and_stop_on_shutdown() {
    raise_limits();
    let mut sb = Sandbox::new();
    let tag = sb.tag.to_string();
    let order = sb.path("order");
    let mut services = String::new();
    for i in 0..IDLE {
        services += &format!(
            "[service.{}]\ncommand = [\"/bin/sleep\", \"{tag}\"]\nrestart_delay = \"10ms\"\n",
            idle(i)
        );
    }
    // Each link says it started (a line in `order`) before it is ready: one that started
    // before the link it comes after was ready would be out of order in the file.
    for k in 0..CHAIN {
        let name = chain(k);
        let run = format!(
            "echo {name} >>{}; echo started; echo >&3; exec /bin/sleep {tag}",
            order.display()
        );
        services += &format!(
            "[service.{name}]\ncommand = [\"/bin/sh\", \"-c\", \"{run}\"]\n\
             ready = \"fd:3\"\nrestart_delay = \"10ms\"\n"
        );
        if k + 1 < CHAIN {
            services += &format!("after = [\"{}\"]\n", chain(k + 1));
        }
    }
    // Output captured (the default, log = "file"): two pipes per service in the loop.
    sb.config(&services);
    let names: Vec<String> = (0..IDLE).map(idle).chain((0..CHAIN).map(chain)).collect();
    let sleep: Vec<u8> = format!("/bin/sleep\0{tag}\0").into_bytes();

    // All up: a watch from right after supd is ready, and one status for those already
    // running when it began.
    let t0 = Instant::now();
    sb.start();
    let rx = watch_events(&sb);
    let mut pending: BTreeSet<String> = status_all(&sb)
        .into_iter()
        .filter(|(_, s)| s["state"] != "running")
        .map(|(n, _)| n)
        .collect();
    let left = std::cell::Cell::new(pending.len());
    until(
        &sb,
        &rx,
        PHASE,
        || format!("{} services never came up", left.get()),
        |e| {
            if e["event"] == "state" && e["to"] == "running" {
                pending.remove(e["service"].as_str().unwrap_or(""));
                left.set(pending.len());
            }
            pending.is_empty()
        },
    );
    let up = t0.elapsed();
    let before = all_running(&sb, &names, &sleep);
    eprintln!("all {} up in {up:?}", names.len());

    // The chain started in its order, each link once.
    let started = std::fs::read_to_string(&order).expect("the chain's order file");
    let want: Vec<String> = (0..CHAIN).rev().map(chain).collect();
    assert_eq!(
        started.lines().collect::<Vec<_>>(),
        want,
        "the `after` chain did not start in its order"
    );

    // Their output is captured: the last link's line is in its log.
    files::wait_file(&sb.path(&format!("log/{}.log", chain(0))), |t| {
        t.contains(" started\n")
    });

    // A sample SIGKILLed at once, by pid: each restarted with a new pid, the others kept.
    let t1 = Instant::now();
    let victims: BTreeSet<String> = (0..KILLED).map(|j| idle(j * IDLE / KILLED)).collect();
    for v in &victims {
        let (pid, start) = before[v];
        assert!(sup::proc::is_same(pid, start), "{v}'s pid {pid} is gone");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill");
    }
    let mut pending = victims.clone();
    left.set(pending.len());
    until(
        &sb,
        &rx,
        PHASE,
        || {
            format!(
                "{} of {KILLED} killed services were not restarted",
                left.get()
            )
        },
        |e| {
            let name = e["service"].as_str().unwrap_or("");
            if e["event"] == "state"
                && e["to"] == "running"
                && before.get(name).is_some_and(|&(pid, _)| pid_of(e) != pid)
            {
                pending.remove(name);
                left.set(pending.len());
            }
            pending.is_empty()
        },
    );
    eprintln!("{KILLED} killed restarted in {:?}", t1.elapsed());
    let after = all_running(&sb, &names, &sleep);
    for name in &names {
        let (old, new) = (before[name], after[name]);
        if victims.contains(name) {
            assert_ne!(old.0, new.0, "{name} was killed but kept its pid");
            assert!(
                !sup::proc::is_same(old.0, old.1),
                "{name}'s killed process {} is still there",
                old.0
            );
        } else {
            assert_eq!(old, new, "{name} was not killed, yet got a new process");
        }
    }

    // Shutdown: SIGTERM, and every process of every service gone (by pid and start time,
    // so that a reused pid is not taken for a survivor) when supd has exited 0.
    let t2 = Instant::now();
    let mut child = sb.supd.take().expect("supd running");
    let pid = child.id() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM to supd");
    if wait_exit(pid, PHASE).is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "supd did not exit within {PHASE:?} of SIGTERM\n{}",
            tail(&sb.supd_log())
        );
    }
    let status = child.wait().expect("wait supd");
    eprintln!("shut down in {:?}", t2.elapsed());
    let left: Vec<(&String, i32)> = after
        .iter()
        .filter(|(_, &(pid, start))| sup::proc::is_same(pid, start))
        .map(|(name, &(pid, _))| (name, pid))
        .collect();
    let strays = processes_with_cmdline(&["/bin/sleep", &tag]);
    for &(_, pid) in &left {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    for &pid in &strays {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(
        left.is_empty() && strays.is_empty(),
        "after supd exited ({status}), {} services' processes were left, e.g. {:?}, \
         and {} sleeps of this test: {:?}",
        left.len(),
        &left[..left.len().min(10)],
        strays.len(),
        &strays[..strays.len().min(10)]
    );
    assert_eq!(
        status.code(),
        Some(0),
        "supd's exit on SIGTERM\n{}",
        tail(&sb.supd_log())
    );
    eprintln!("the whole test: {:?}", t0.elapsed());
}
