//! One scenario's world: a sandbox, its services (rendered into the config with the
//! current supd generation), supd started and SIGKILLed, and the checkers. A failure is
//! recorded (and printed at once) and the scenario goes on, so the closing figures count
//! every duplicate, survivor and failed start; `finish` fails the test if there was any.

use crate::common::*;
use crate::procs::{self, Tagged};
use crate::rng::{self, Rng};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The test service. It holds an exclusive lock on `locks/$SUP_SERVICE` for its whole
/// life, in every process it forks (a child that keeps fd 9 outlives the leader while
/// the group dies, so a too-early respawn shows), and appends a line to `dups` when it
/// cannot take it: another instance of the service is alive. Ready (fd 3) only once it
/// holds the lock. `SUPF_INST` names the instance in every process it forks.
const SERVICE_SH: &str = r#"#!/bin/sh
# MODE: hold (runs until stopped) | storm LIFE (exits after LIFE seconds) | daemon (hold,
# and leaves a copy of itself in a session of its own: fork, setsid, fork) | crash (exit 3)
d=$SUPF_DIR
exec 9>>"$d/locks/$SUP_SERVICE"
if ! flock -n 9; then
  echo "$SUP_SERVICE: pid $$ of gen $SUPF_GEN${SUP_VERSION:+ version $SUP_VERSION} found the lock taken at $(date +%s.%N); last holder: $(cat "$d/locks/$SUP_SERVICE.holder" 2>/dev/null)" >>"$d/dups"
  exit 1
fi
export SUPF_INST=$$
echo "pid $$ of gen $SUPF_GEN${SUP_VERSION:+ version $SUP_VERSION}" >"$d/locks/$SUP_SERVICE.holder"
[ "$1" = crash ] && exit 3
[ "$1" = daemon ] && ( exec 3>&-; setsid sh -c 'sleep 100000 & exit 0' )
sleep 100000 3>&- &
echo >&3
exec 3>&-
[ "$1" = storm ] && exec sleep "$2"
exec sleep 100000
"#;

/// Keys of a service that runs until stopped and comes back quickly after a failure.
pub const HOLD_KEYS: &str = "restart_delay = \"50ms\"\nrestart_delay_max = \"200ms\"\n\
     crash_loop = { restarts = 100000, window = \"1s\" }\n";
/// Keys of a service restarted at once, forever.
pub const STORM_KEYS: &str =
    "restart_delay = \"0s\"\ncrash_loop = { restarts = 100000, window = \"1s\" }\n";

#[derive(Clone, Debug, PartialEq)]
pub enum Mode {
    Hold,
    /// Exits after this many seconds (a decimal string for sleep).
    Storm(String),
    Daemon,
    /// A versioned service of the tool `agent`, whose versions exec the script.
    Tool,
}

/// One service of the config.
#[derive(Clone, Debug)]
pub struct Svc {
    pub name: String,
    pub mode: Mode,
    /// The config's variant: changing it changes the service (a reload restarts it).
    pub var: u32,
    /// Further keys of its table.
    pub keys: String,
}

impl Svc {
    pub fn new(name: &str, mode: Mode, keys: &str) -> Svc {
        Svc {
            name: name.to_string(),
            mode,
            var: 0,
            keys: keys.to_string(),
        }
    }
}

/// The closing figures.
#[derive(Default, Debug)]
pub struct Figures {
    pub kills: usize,
    /// Starts of supd checked at READY: nothing of an older generation alive.
    pub restarts_checked: usize,
    /// Settled states checked: one instance per service, of this generation.
    pub instance_checks: usize,
    pub dups: usize,
    pub survivors: usize,
    pub failed_starts: usize,
    /// Per scenario: what else was counted.
    pub extra: BTreeMap<&'static str, usize>,
}

pub struct World {
    pub sb: Sandbox,
    pub rng: Rng,
    pub seed: u64,
    pub name: &'static str,
    /// The how-many-th supd this is (1 for the first).
    pub gen: u64,
    pub services: Vec<Svc>,
    pub fig: Figures,
    failures: Vec<String>,
    dups_read: usize,
    ready: Option<(UnixDatagram, PathBuf)>,
    /// supd's stderr, when not `supd.stderr` (a pipe the scenario reads or not).
    pub stderr: Option<std::os::fd::OwnedFd>,
}

impl World {
    pub fn new(name: &'static str, services: Vec<Svc>) -> World {
        let sb = Sandbox::new();
        let seed = rng::seed();
        fs::create_dir_all(sb.path("locks")).expect("mkdir locks");
        sb.file("svc.sh", SERVICE_SH);
        eprintln!(
            "fault {name}: seed {seed} (replay: SUP_FAULT_SEED={seed}), sandbox {}",
            sb.dir.display()
        );
        World {
            rng: Rng::for_scenario(seed, name),
            sb,
            seed,
            name,
            gen: 0,
            services,
            fig: Figures::default(),
            failures: Vec::new(),
            dups_read: 0,
            ready: None,
            stderr: None,
        }
    }

    /// Records a failure, printed at once with the seed.
    pub fn fail(&mut self, msg: String) {
        self.fail_printed(msg, false);
    }

    /// A failure printed even past the first twenty (a rare kind: a failed start).
    fn fail_printed(&mut self, msg: String, always: bool) {
        const PRINTED: usize = 20;
        if self.failures.len() < PRINTED || always {
            eprintln!(
                "fault {}: FAIL (seed {}, gen {}): {msg}",
                self.name, self.seed, self.gen
            );
        } else if self.failures.len() == PRINTED {
            eprintln!(
                "fault {}: further failures are counted, not printed",
                self.name
            );
        }
        self.failures.push(msg);
    }

    pub fn count(&mut self, what: &'static str) {
        *self.fig.extra.entry(what).or_default() += 1;
    }

    /// Writes the config: every service with the current generation in its environment.
    pub fn write_config(&self) {
        let script = self.sb.path("svc.sh");
        let mut text = String::new();
        for s in &self.services {
            let command = match &s.mode {
                Mode::Hold => format!("command = [\"{}\", \"hold\"]", script.display()),
                Mode::Storm(life) => {
                    format!(
                        "command = [\"{}\", \"storm\", \"{life}\"]",
                        script.display()
                    )
                }
                Mode::Daemon => format!("command = [\"{}\", \"daemon\"]", script.display()),
                Mode::Tool => "tool = \"agent\"\ncommand = [\"bin/agent\"]".to_string(),
            };
            text += &format!(
                "[service.\"{}\"]\n{command}\nready = \"fd:3\"\nstop_timeout = \"1s\"\nlog = \"null\"\n\
                 env = {{ SUPF_TAG = \"{}\", SUPF_GEN = \"{}\", SUPF_DIR = \"{}\", SUPF_VAR = \"{}\" }}\n{}\n",
                s.name,
                self.sb.tag,
                self.gen,
                self.sb.dir.display(),
                s.var,
                s.keys
            );
        }
        self.sb.config(&text);
    }

    /// Starts the next generation of supd, without waiting for it.
    pub fn spawn(&mut self) {
        assert!(self.sb.supd.is_none(), "a supd is still running");
        self.gen += 1;
        self.write_config();
        let path = self.sb.path(&format!("ready-{}.sock", self.gen));
        let sock = UnixDatagram::bind(&path).expect("bind the ready socket");
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.sb.path("supd.stderr"))
            .expect("supd log");
        let _ = writeln!(log, "=== fault suite: supd generation {} ===", self.gen);
        let stderr = match &self.stderr {
            Some(fd) => Stdio::from(fd.try_clone().expect("dup stderr")),
            None => Stdio::from(log.try_clone().expect("dup log")),
        };
        let child = Command::new(SUPD)
            .arg("-c")
            .arg(self.sb.path("sup.toml"))
            .env("NOTIFY_SOCKET", &path)
            .env("SUP_LOG", "debug")
            .env("SUPF_TAG", self.sb.tag.to_string())
            .env("SUPF_GEN", self.gen.to_string())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .expect("spawn supd");
        self.sb.supd = Some(child);
        self.ready = Some((sock, path));
    }

    /// kill -9 of supd, and its exit collected. A supd that had already exited by itself
    /// (one started and not awaited) is a failed start, not a kill.
    pub fn kill9(&mut self) {
        let mut child = self.sb.supd.take().expect("supd running");
        if let Ok(Some(status)) = child.try_wait() {
            self.fig.failed_starts += 1;
            let why = format!(
                "supd gen {} exited by itself ({status}) before its kill; its last words:\n{}",
                self.gen,
                self.log_tail(4)
            );
            self.fail_printed(why, true);
        } else {
            let _ = child.kill();
            let _ = child.wait();
            self.fig.kills += 1;
        }
        if let Some((_, path)) = self.ready.take() {
            let _ = fs::remove_file(path);
        }
    }

    /// SIGTERM to supd: it stops every service and exits; then nothing may carry the tag.
    pub fn shutdown(&mut self) {
        let mut child = self.sb.supd.take().expect("supd running");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        if wait_exit(child.id() as i32, DEADLINE).is_none() {
            self.fail(format!(
                "supd gen {} did not exit within {DEADLINE:?} of SIGTERM",
                self.gen
            ));
            let _ = child.kill();
        }
        let status = child.wait().expect("wait supd");
        if !status.success() {
            self.fail(format!(
                "supd gen {} ended its shutdown with {status}",
                self.gen
            ));
        }
        let left = procs::tagged(self.sb.tag);
        if !left.is_empty() {
            self.fig.survivors += left.len();
            self.fail(format!(
                "supd gen {} has shut down, yet these live:\n  {}",
                self.gen,
                list(&left)
            ));
            self.sweep(&left);
        }
    }

    /// Starts the next generation and waits for its READY=1; a supd that exits first (or
    /// is not ready in time) is a failed start, and another one is started, three times
    /// at most.
    pub fn start(&mut self) {
        for _ in 0..3 {
            self.spawn();
            if self.await_ready() {
                return;
            }
        }
        self.finish_with("three starts of supd in a row failed");
    }

    /// Waits for the spawned supd's READY=1 (or its exit) and for the end of what older
    /// generations left (supd starts nothing before), then checks that nothing of
    /// theirs is alive.
    pub fn await_ready(&mut self) -> bool {
        let (sock, path) = self.ready.take().expect("a spawned supd");
        let pid = self.sb.supd_pid();
        let pidfd = sup::sys::pidfd_open(pid).expect("pidfd of supd");
        let end = Instant::now() + DEADLINE;
        let ready = loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(format!("supd (pid {pid}) not ready within {DEADLINE:?}"));
            }
            let mut fds = [
                nix::poll::PollFd::new(sock.as_fd(), nix::poll::PollFlags::POLLIN),
                nix::poll::PollFd::new(pidfd.as_fd(), nix::poll::PollFlags::POLLIN),
            ];
            let ms = nix::poll::PollTimeout::try_from(left.as_millis() as i32 + 1)
                .unwrap_or(nix::poll::PollTimeout::MAX);
            let _ = nix::poll::poll(&mut fds, ms);
            let got = fds[0].revents().is_some_and(|r| !r.is_empty());
            let died = fds[1].revents().is_some_and(|r| !r.is_empty());
            if got {
                let mut buf = [0u8; 256];
                sock.set_nonblocking(true).expect("nonblocking");
                if let Ok(n) = sock.recv(&mut buf) {
                    if String::from_utf8_lossy(&buf[..n]).contains("READY=1") {
                        break Ok(());
                    }
                }
            } else if died {
                let status = self.sb.supd.take().expect("supd").wait().expect("wait");
                break Err(format!(
                    "supd exited before it was ready ({status}); its last words:\n{}",
                    self.log_tail(4)
                ));
            }
        };
        let _ = fs::remove_file(path);
        match ready {
            Ok(()) => {
                self.await_cleanup();
                self.check_leftovers();
                true
            }
            Err(why) => {
                if let Some(mut c) = self.sb.supd.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                self.fig.failed_starts += 1;
                self.fail_printed(format!("start of supd gen {}: {why}", self.gen), true);
                false
            }
        }
    }

    /// supd serves at once and ends what older generations left meanwhile (no service
    /// starts until that is over): waits until `status` no longer shows a cleanup.
    fn await_cleanup(&mut self) {
        let end = Instant::now() + DEADLINE;
        while Instant::now() < end {
            let v = self.sb.request(serde_json::json!({"cmd": "status"}));
            if v["ok"] != true || v["data"]["cleanup"].is_null() {
                return;
            }
        }
        self.fail(format!(
            "supd gen {} did not end what older generations left within {DEADLINE:?}",
            self.gen
        ));
    }

    /// The last `n` lines of this generation's log.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.sb.supd_log();
        let marker = format!("=== fault suite: supd generation {} ===", self.gen);
        let mine = log.rsplit_once(&marker).map_or(log.as_str(), |(_, m)| m);
        let lines: Vec<&str> = mine.lines().filter(|l| !l.is_empty()).collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// At READY: nothing of an older generation may be alive. A fork of a killed supd
    /// that never exec'd (no service yet, its pre-exec step perhaps waiting on the dead
    /// parent) is given `FORK_GRACE` to go away on its own; if it execs instead, it is a
    /// service instance nobody ended.
    fn check_leftovers(&mut self) {
        const FORK_GRACE: Duration = Duration::from_secs(2);
        let supd = self.sb.supd_pid();
        let (services, forks): (Vec<Tagged>, Vec<Tagged>) = procs::tagged(self.sb.tag)
            .into_iter()
            .filter(|p| p.pid != supd && p.gen < self.gen)
            .partition(|p| p.service.is_some());
        let end = Instant::now() + FORK_GRACE;
        let forks: Vec<Tagged> = forks
            .into_iter()
            .filter(|p| wait_exit(p.pid, end.saturating_duration_since(Instant::now())).is_none())
            .collect();
        self.fig.restarts_checked += 1;
        let old: Vec<Tagged> = services.into_iter().chain(forks).collect();
        if !old.is_empty() {
            self.fig.survivors += old.len();
            self.fail(format!(
                "supd gen {} is ready, yet {} process(es) of older generations live:\n  {}",
                self.gen,
                old.len(),
                list(&old)
            ));
            self.sweep(&old);
        }
    }

    /// Ends processes by pid (after a failure was recorded: the scenario goes on).
    pub fn sweep(&mut self, who: &[Tagged]) {
        let pids: Vec<i32> = who.iter().map(|p| p.pid).collect();
        let stuck = procs::kill_and_wait(&pids, DEADLINE);
        assert!(stuck.is_empty(), "SIGKILLed, these did not exit: {stuck:?}");
    }

    /// Ends every process of an older generation (what a duplicate's holder may be).
    pub fn sweep_old(&mut self) {
        let supd = self.sb.supd.as_ref().map(|c| c.id() as i32);
        let old: Vec<Tagged> = procs::tagged(self.sb.tag)
            .into_iter()
            .filter(|p| Some(p.pid) != supd && p.gen < self.gen)
            .collect();
        self.sweep(&old);
    }

    /// New lines in the dups file: each a duplicate, a failure.
    pub fn check_dups(&mut self, context: &str) -> usize {
        let text = fs::read_to_string(self.sb.path("dups")).unwrap_or_default();
        let new: Vec<String> = text[self.dups_read.min(text.len())..]
            .lines()
            .map(str::to_string)
            .collect();
        self.dups_read = text.len();
        for line in &new {
            self.fig.dups += 1;
            self.fail(format!("duplicate ({context}): {line}"));
        }
        new.len()
    }

    /// Every service's state, from `status`.
    pub fn states(&self) -> BTreeMap<String, (String, Option<i32>)> {
        self.sb.ok(json!({"cmd": "status"}))["services"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                (
                    s["name"].as_str().unwrap_or("").to_string(),
                    (
                        s["state"].as_str().unwrap_or("").to_string(),
                        s["pid"].as_i64().map(|p| p as i32),
                    ),
                )
            })
            .collect()
    }

    /// The services of the config, by the names supd gives them.
    pub fn wanted(&self) -> BTreeSet<String> {
        self.services.iter().map(|s| s.name.clone()).collect()
    }

    /// Waits (on the watch stream, with the deadline) until every service of the config
    /// runs and every other one is down. A duplicate seen meanwhile is recorded, what
    /// older generations left is ended, and the wait goes on.
    pub fn settle(&mut self) -> bool {
        let wanted = self.wanted();
        let mut w = self.sb.watch();
        let mut states: BTreeMap<String, String> = self
            .states()
            .into_iter()
            .map(|(k, (s, _))| (k, s))
            .collect();
        let end = Instant::now() + DEADLINE;
        loop {
            let done = wanted
                .iter()
                .all(|n| states.get(n).is_some_and(|s| s == "running"))
                && states.iter().all(|(n, s)| {
                    wanted.contains(n) || ["stopped", "exited", "failed"].contains(&s.as_str())
                });
            if done {
                return true;
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let not: Vec<String> = states
                    .iter()
                    .filter(|(n, s)| wanted.contains(*n) != (*s == "running"))
                    .map(|(n, s)| format!("{n} {s}"))
                    .collect();
                self.fail(format!(
                    "supd gen {} did not settle within {DEADLINE:?}: {}",
                    self.gen,
                    not.join(", ")
                ));
                return false;
            }
            let Some(e) = w.next_within(left) else {
                continue;
            };
            if e["event"] == "state" {
                if let (Some(n), Some(to)) = (e["service"].as_str(), e["to"].as_str()) {
                    states.insert(n.to_string(), to.to_string());
                }
                if self.check_dups(&format!("while gen {} settles", self.gen)) > 0 {
                    self.sweep_old();
                }
            }
        }
    }

    /// The settled state: each service of the config has exactly one instance, the one
    /// supd names, of this generation (and of the config's variant, and of `version` for
    /// the tool's services); nothing else carries the tag.
    pub fn check_instances(&mut self, version: Option<&str>) {
        self.fig.instance_checks += 1;
        let (mut bad, mut strays) = self.instances(version);
        if !bad.is_empty() && strays.is_empty() {
            // Nothing extra, but an instance not seen where supd names one: looked at
            // again once, so that a read of /proc that raced with something cannot fail
            // the suite (a second instance cannot hide: it records itself in `dups`).
            self.count("second looks at a settled state");
            (bad, strays) = self.instances(version);
        }
        for b in bad {
            self.fail(format!("settled gen {}: {b}", self.gen));
        }
        if !strays.is_empty() {
            self.sweep(&strays);
        }
    }

    /// What is wrong with the settled state, and the processes that must not be there.
    fn instances(&mut self, version: Option<&str>) -> (Vec<String>, Vec<Tagged>) {
        let states = self.states();
        let supd = self.sb.supd_pid();
        // supd's own helpers (a reload's reader, a lease's guard) carry its environment
        // and name themselves apart.
        let all: Vec<Tagged> = procs::tagged(self.sb.tag)
            .into_iter()
            .filter(|p| p.pid != supd && !p.comm.starts_with("supd-"))
            .collect();
        let mut bad: Vec<String> = Vec::new();
        let mut strays: Vec<Tagged> = Vec::new();
        let vars: BTreeMap<String, u32> = self
            .services
            .iter()
            .map(|s| (s.name.clone(), s.var))
            .collect();
        for p in &all {
            let wanted = p.service.as_ref().is_some_and(|s| vars.contains_key(s));
            if p.gen != self.gen || !wanted {
                strays.push(p.clone());
            }
        }
        if !strays.is_empty() {
            self.fig.survivors += strays.len();
            bad.push(format!(
                "processes of older generations, of removed services or not exec'd:\n  {}",
                list(&strays)
            ));
        }
        for (name, var) in &vars {
            let mine: Vec<&Tagged> = all
                .iter()
                .filter(|p| p.service.as_deref() == Some(name.as_str()))
                .collect();
            // A fork not yet exec'd has the environment its shell started with: no
            // SUPF_INST yet, but its group names the instance.
            let insts: BTreeSet<i32> = mine.iter().map(|p| p.inst.unwrap_or(p.pgrp)).collect();
            let (state, pid) = states.get(name).cloned().unwrap_or_default();
            if state != "running"
                || pid.is_none()
                || insts.len() != 1
                || insts.first() != pid.as_ref()
            {
                bad.push(format!(
                    "service {name}: supd says {state} pid {pid:?} ({}); instances alive {insts:?}:\n  {}",
                    pid.map_or("-".into(), procs::describe),
                    list(&mine.into_iter().cloned().collect::<Vec<_>>())
                ));
                continue;
            }
            for p in &mine {
                if p.var.as_deref() != Some(var.to_string().as_str()) {
                    bad.push(format!(
                        "service {name}: runs variant {:?}, the config says {var}: {p}",
                        p.var
                    ));
                }
                if version.is_some() && p.version.is_some() && p.version.as_deref() != version {
                    bad.push(format!(
                        "service {name}: runs version {:?}, current is {version:?}: {p}",
                        p.version
                    ));
                }
            }
        }
        (bad, strays)
    }

    /// Prints the figures; fails the test if anything failed.
    pub fn finish(mut self) {
        self.finish_with("");
    }

    fn finish_with(&mut self, why: &str) {
        let f = &self.fig;
        let extra: String = f.extra.iter().map(|(k, v)| format!(", {v} {k}")).collect();
        eprintln!(
            "fault {}: seed {}: {} kills survived, {} restarts checked, {} settled states checked, \
             {} duplicates seen, {} survivors seen, {} failed starts{extra}",
            self.name,
            self.seed,
            f.kills,
            f.restarts_checked,
            f.instance_checks,
            f.dups,
            f.survivors,
            f.failed_starts
        );
        if !self.failures.is_empty() || !why.is_empty() {
            let shown: Vec<&String> = self.failures.iter().take(12).collect();
            panic!(
                "{} {}failures in {} (seed {}; replay: SUP_FAULT_SEED={} cargo test --release --test fault -- --ignored --nocapture {}); \
                 the first:\n{}\nsupd's log is kept in {}",
                self.failures.len(),
                if why.is_empty() { String::new() } else { format!("({why}) ") },
                self.name,
                self.seed,
                self.seed,
                self.name,
                shown
                    .iter()
                    .map(|s| format!("- {s}"))
                    .collect::<Vec<_>>()
                    .join("\n"),
                self.sb.path("supd.stderr").display()
            );
        }
    }

    /// A supctl command run in the background (to be cut off by a kill).
    pub fn supctl_bg(&self, args: &[&str]) -> std::process::Child {
        Command::new(SUPCTL)
            .arg("-s")
            .arg(&self.sb.socket)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn supctl")
    }

    /// The tool `agent`'s `versions`.
    pub fn versions(&self) -> Value {
        self.sb.ok(json!({"cmd": "versions", "tool": "agent"}))
    }
}

impl Drop for World {
    /// Ends supd and then everything carrying the tag, by pid (escaped daemons and the
    /// remnants of killed generations included).
    fn drop(&mut self) {
        if let Some(mut c) = self.sb.supd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for _ in 0..5 {
            let left = procs::tagged(self.sb.tag);
            if left.is_empty() {
                break;
            }
            let pids: Vec<i32> = left.iter().map(|p| p.pid).collect();
            let _ = procs::kill_and_wait(&pids, Duration::from_secs(5));
        }
    }
}

/// Processes, one a line.
pub fn list(ps: &[Tagged]) -> String {
    ps.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n  ")
}
