//! One sequence against a real supd: the sandbox, the versions' programs, supd started,
//! killed and stopped, a watch stream read by a thread of its own (reconnected after
//! each new supd and each reexec), settling, and the checks that need processes (at
//! most one instance, the bound on SIGTERM). What the contract says is the model's.

use crate::common::lossless::free_port;
use crate::common::*;
use crate::model::{Info, Model, Violation};
use crate::steps::{Action, Kind, Sequence, Then, Version};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use sup::cgroup::limits::Controller;

/// supd's `shutdown_timeout` here; SIGTERM must end supd within it and `TERM_MARGIN`.
const SHUTDOWN_TIMEOUT_MS: u64 = 2000;
const TERM_MARGIN_MS: u64 = 2000;
/// The longest a settle may take (the longest probation and a crash loop of hangs fit
/// many times over).
const SETTLE: Duration = Duration::from_secs(15);

/// Milliseconds since the epoch (supd's events carry the same clock).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The prologue of every version's program: an exclusive lock per service, held by the
/// main process and a good version's worker (`sleep` inherits fd 9), or a line in `dups`
/// and exit: two runs of one service alive at once. Passing commands (`date`, `mv`,
/// the flaky ones' `sleep`) do not hold it: under `kill_mode = "main"` a stop leaves
/// them, by design, and they are no run of the service.
const PROLOGUE: &str = r#"d="$COMBO_DIR"
exec 9>>"$d/lock.$SUP_SERVICE"
if ! flock -n 9; then
  echo "$SUP_SERVICE: pid $$ of $SUP_VERSION found the lock taken at $(date +%s.%N); holder: $(cat "$d/holder.$SUP_SERVICE" 2>/dev/null)" >>"$d/dups"
  exit 1
fi
echo "pid $$ of $SUP_VERSION since $(date +%s.%N 9>&-)" >"$d/holder.$SUP_SERVICE"
echo "$SUP_SERVICE $PPID $(readlink /proc/$$/fd/3 9>&-) $(date +%s%3N 9>&-)" >>"$d/sockets"
"#;

/// A good version: ready (a newline on fd 4; fd 3 is its `listen` socket), runs until
/// stopped; on SIGUSR1 with
/// `switch-to` present, it points `current` at the version named there and exits 0 (a
/// tool updating itself).
///
/// Its worker (the `sleep` it waits on) holds the lock, as any process of its run, but
/// under `kill_mode = "main"` that is left at the end of a run, so there it does not
/// (and is noted in `workers`, for the test to end). Its "session" (`setsid`: its own
/// session and process group, as an sshd session) notes itself in `sessions` once it
/// is in its session: a stop of the run before that ends it with the run's group.
const GOOD: &str = r#"trap 'true' USR1
if [ "$COMBO_KILL_MODE" = main ]; then
  sleep 100000 3>&- 4>&- 9>&- &
  s=$!
  echo "$s" >>"$d/workers"
else
  sleep 100000 3>&- 4>&- &
  s=$!
fi
setsid sh -c 'echo $$ >>"$0/sessions"; exec sleep 100000' "$d" 3>&- 4>&- 9>&- </dev/null >/dev/null 2>&1 &
echo >&4
exec 4>&-
while :; do
  wait $s
  if [ -e "$d/switch-to" ]; then
    t=$(cat "$d/switch-to" 9>&-)
    rm -f "$d/switch-to" 9>&-
    ln -sfn "$t" ../.switch 9>&- && mv -T ../.switch ../current 9>&-
    echo "$(date +%s.%N 9>&-) $SUP_SERVICE $SUP_VERSION switched current to $t" >>"$d/switches"
    exit 0
  fi
  kill -0 $s 2>/dev/null || exit 4
done"#;

fn body(kind: Kind) -> String {
    let tail = match kind {
        Kind::Good => GOOD,
        Kind::Crash => "exit 3",
        Kind::Hang => "exec sleep 100000",
        Kind::Flaky => "echo >&4\nexec 4>&-\nsleep 0.02 3>&- 9>&-\nexit 3",
        Kind::Slow => "echo >&4\nexec 4>&-\nsleep 0.15 3>&- 9>&-\nexit 3",
    };
    format!("{PROLOGUE}{tail}")
}

/// The events of one watch connection, read by a thread.
struct Collector {
    stream: UnixStream,
    retired: Arc<AtomicBool>,
}

type Events = Arc<(Mutex<Vec<Value>>, Condvar)>;

pub struct Node {
    pub sb: Sandbox,
    pub seq: Sequence,
    pub model: Model,
    /// What happened, step by step, for the report.
    pub log: Vec<String>,
    events: Events,
    processed: usize,
    collector: Option<Collector>,
    var: u32,
    /// services.d/agent.toml is broken on disk now (`broken_file`).
    broken_on_disk: std::cell::Cell<bool>,
    term: u64,
    lease_held: bool,
    /// The step under way (1-based; 0: the prologue), for the violations' report.
    pub step: usize,
    /// Violations found by the harness, and the model's so far, each with its step.
    pub found: Vec<(usize, Violation)>,
    model_seen: usize,
    pub figures: std::collections::BTreeMap<&'static str, usize>,
    ready: Option<UnixDatagram>,
    gen: u64,
    /// The ports the agent and the engine listen on (`listen`).
    ports: (u16, u16),
}

impl Node {
    pub fn new(seq: Sequence) -> Node {
        let sb = Sandbox::new();
        let services: &[&str] = if seq.lease {
            &["agent", "engine"]
        } else {
            &["agent"]
        };
        let model = Model::new(seq.probation_ms, services);
        let n = Node {
            sb,
            seq,
            model,
            log: Vec::new(),
            events: Arc::new((Mutex::new(Vec::new()), Condvar::new())),
            processed: 0,
            collector: None,
            var: 0,
            broken_on_disk: std::cell::Cell::new(false),
            term: 0,
            lease_held: false,
            step: 0,
            found: Vec::new(),
            model_seen: 0,
            figures: Default::default(),
            ready: None,
            gen: 0,
            ports: (free_port(), free_port()),
        };
        n.write_config();
        n
    }

    fn note(&mut self, s: String) {
        self.log.push(format!("{:>2}| {s}", self.step));
    }

    fn violate(&mut self, invariant: &'static str, text: String, hint: Option<&'static str>) {
        self.found.push((
            self.step,
            Violation {
                invariant,
                text,
                hint,
            },
        ));
    }

    fn count(&mut self, what: &'static str) {
        *self.figures.entry(what).or_default() += 1;
    }

    /// A service's keys; it listens on `port` (issue 29: the socket supd holds must be
    /// the one every run of one supd gets, across upgrades, rollbacks, restarts,
    /// reloads and reexec).
    fn service_keys(&self, port: u16) -> String {
        format!(
            "tool = \"agent\"\ncommand = [\"bin/agent\"]\nready = \"fd:4\"\nlisten = [\"tcp:127.0.0.1:{port}\"]\nready_timeout = \"{}ms\"\n\
             restart_delay = \"10ms\"\ncrash_loop = {{ restarts = 3, window = \"1m\" }}\ncooldown = \"1h\"\n\
             probation = \"{}ms\"\nstop_timeout = \"{}ms\"\nlog = \"null\"\n\
             env = {{ COMBO_DIR = \"{}\", COMBO_VAR = \"{}\", COMBO_KILL_MODE = \"{}\" }}\n\
             kill_mode = \"{}\"\n{}",
            self.seq.ready_timeout_ms,
            self.seq.probation_ms,
            self.seq.stop_timeout_ms,
            self.sb.dir.display(),
            self.var,
            self.seq.kill_mode,
            self.seq.kill_mode,
            // A limit that changes with each changed reload (issue 28): the run's cgroup
            // must hold what supd says it holds, across reexec, kill -9 and upgrades.
            if pids_limited() {
                format!("pids_max = {}\n", 1000 + self.var)
            } else {
                String::new()
            }
        )
    }

    /// With limits: the running agent's cgroup holds the `pids_max` that `show` says
    /// supd has (not one an older config, a previous supd or image wrote).
    fn check_limits(&mut self, st: &Value) {
        let Some(pid) = st["pid"].as_i64().filter(|_| pids_limited()) else {
            return;
        };
        let shown = self.sb.request(json!({"cmd": "show", "service": "agent"}));
        let said = (shown["data"]["settings"].as_array().into_iter().flatten())
            .find(|s| s["key"] == "pids_max")
            .and_then(|s| s["value"].as_str())
            .map(|v| v.trim_matches('"').to_string());
        // (The run may have ended meanwhile: its /proc entry gone, nothing to compare.)
        let held = cgroups::cgroup_dir(pid as i32, Controller::Pids)
            .and_then(|d| fs::read_to_string(d.join("pids.max")).ok());
        let Some(held) = held.map(|t| t.trim().to_string()) else {
            return;
        };
        self.count("limits checked");
        if said.as_deref() != Some(held.as_str()) {
            self.violate(
                "LIMITS",
                format!("agent (pid {pid}) runs under pids.max {held}; supd says {said:?}"),
                None,
            );
        }
    }

    /// Issue 29: every run a supd started (by its pid, the same across `reexec`) got the
    /// same `listen` socket; a running agent's is held (status lists it, and the port
    /// takes a connection into its backlog).
    fn check_socket(&mut self, st: &Value) {
        // A service let go of its sockets when it went down for good (failed, exited,
        // or held down for its lease: a node that does not lead refuses its clients):
        // the next run of that supd is given one bound anew.
        let let_go: Vec<(String, u64)> = {
            let (m, _) = &*self.events;
            let all = m.lock().expect("events");
            all.iter()
                .filter(|e| e["event"] == "state")
                .filter(|e| {
                    matches!(e["to"].as_str(), Some("failed" | "exited"))
                        || (e["to"] == "stopped"
                            && e["reason"].as_str().is_some_and(|r| r.contains("lease")))
                })
                .filter_map(|e| Some((e["service"].as_str()?.to_string(), e["time"].as_u64()?)))
                .collect()
        };
        let text = fs::read_to_string(self.sb.path("sockets")).unwrap_or_default();
        let mut seen: BTreeMap<(String, String), (String, u64)> = BTreeMap::new();
        for line in text.lines() {
            let mut it = line.split_whitespace();
            let (Some(svc), Some(supd), Some(sock), Some(at)) =
                (it.next(), it.next(), it.next(), it.next())
            else {
                continue;
            };
            let at: u64 = at.parse().unwrap_or(0);
            let key = (svc.to_string(), supd.to_string());
            if let Some((first, since)) = seen.get(&key) {
                let released = let_go
                    .iter()
                    .any(|(n, t)| n == svc && *since <= *t && *t <= at);
                if first != sock && !released {
                    self.violate(
                        "SOCKET",
                        format!("{svc}: runs of supd {supd} got {first}, then {sock}"),
                        None,
                    );
                    return;
                }
            }
            seen.insert(key, (sock.to_string(), at));
        }
        self.count("sockets checked");
        let addr = format!("tcp:127.0.0.1:{}", self.ports.0);
        if st["listening"] != json!([addr]) {
            self.violate(
                "SOCKET",
                format!(
                    "the running agent's socket is not held: listening {}",
                    st["listening"]
                ),
                None,
            );
        } else if std::net::TcpStream::connect(("127.0.0.1", self.ports.0)).is_err() {
            self.violate("SOCKET", format!("{addr} refused a connection"), None);
        }
    }

    /// sup.toml (supd's table, the lease) and services.d/agent.toml (the services).
    fn write_config(&self) {
        let mut main = format!(
            "[supd]\nsocket = \"sup.sock\"\nstate_dir = \"state\"\nlog_dir = \"log\"\ntools_dir = \"tools\"\n\
             shutdown_timeout = \"{SHUTDOWN_TIMEOUT_MS}ms\"\ninclude = [\"services.d/*.toml\"]\n"
        );
        let mut services = format!("[service.agent]\n{}", self.service_keys(self.ports.0));
        if self.seq.lease {
            main += "\n[lease.engine]\ntool = \"agent\"\n";
            services += &format!(
                "\n[service.engine]\n{}leader_only = \"engine\"\n",
                self.service_keys(self.ports.1)
            );
        }
        fs::create_dir_all(self.sb.path("services.d")).expect("mkdir services.d");
        self.broken_on_disk.set(false);
        fs::write(self.sb.path("services.d/agent.toml"), services).expect("write services");
        fs::write(self.sb.path("sup.toml"), main).expect("write config");
    }

    /// With `broken_file`: the services' file broken on disk (a typo, as an operator's
    /// edit not yet reloaded), once supd has read it.
    fn break_file(&self) {
        if self.seq.broken_file {
            fs::write(self.sb.path("services.d/agent.toml"), "[service.agent\n")
                .expect("break the services' file");
            self.broken_on_disk.set(true);
        }
    }

    /// With `broken_file`, after a start: the services run from the file's last good
    /// copy, and status says the file is broken.
    fn check_broken_file(&mut self) {
        if !self.broken_on_disk.get() {
            return;
        }
        let st = self.sb.request(json!({"cmd": "status"}));
        let d = &st["data"];
        let file = self.sb.path("services.d/agent.toml");
        let named = (d["broken_files"].as_array().into_iter().flatten()).any(|b| {
            b["file"] == file.to_string_lossy().as_ref() && b["using"] == "last good copy"
        });
        let has_agent =
            (d["services"].as_array().into_iter().flatten()).any(|s| s["name"] == "agent");
        self.count("starts with a broken file checked");
        if !named || !has_agent {
            self.violate(
                "BROKEN",
                format!("a new supd with services.d/agent.toml broken: its last good copy must run and status say so: {st}"),
                None,
            );
        }
    }

    // ---- supd ----

    /// Starts supd and waits for READY=1 (or its exit); then watches it.
    pub fn start(&mut self) -> bool {
        assert!(self.sb.supd.is_none(), "a supd is still running");
        // A new supd holds no grant (sup-lease grants it again within T/3; here the
        // next settle does, as for a trial).
        self.lease_held = false;
        self.gen += 1;
        let path = self.sb.path(&format!("ready-{}.sock", self.gen));
        let sock = UnixDatagram::bind(&path).expect("bind the ready socket");
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.sb.path("supd.stderr"))
            .expect("supd log");
        let _ = writeln!(
            log,
            "=== combos: supd {} (step {}) ===",
            self.gen, self.step
        );
        let stdout = log.try_clone().expect("dup log");
        let stderr = if self.seq.stalled_stderr {
            Stdio::from(stalled_pipe(log, self.seq.seed ^ self.gen))
        } else {
            Stdio::from(log)
        };
        let child = Command::new(SUPD)
            .arg("-c")
            .arg(self.sb.path("sup.toml"))
            .env("NOTIFY_SOCKET", &path)
            .env("SUP_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("spawn supd");
        let pid = child.id() as i32;
        self.sb.supd = Some(child);
        self.ready = Some(sock);
        let ok = self.await_ready(pid);
        let _ = fs::remove_file(path);
        if !ok {
            return false;
        }
        self.watch();
        self.model.up(unix_ms());
        self.check_broken_file();
        true
    }

    fn await_ready(&mut self, pid: i32) -> bool {
        let sock = self.ready.take().expect("a ready socket");
        let pidfd = sup::sys::pidfd_open(pid).expect("pidfd of supd");
        let end = Instant::now() + DEADLINE;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.violate(
                    "START",
                    format!("supd {} not ready within {DEADLINE:?}", self.gen),
                    None,
                );
                self.kill_child();
                return false;
            }
            let mut fds = [
                nix::poll::PollFd::new(sock.as_fd(), nix::poll::PollFlags::POLLIN),
                nix::poll::PollFd::new(pidfd.as_fd(), nix::poll::PollFlags::POLLIN),
            ];
            let ms = nix::poll::PollTimeout::try_from(left.as_millis() as i32 + 1)
                .unwrap_or(nix::poll::PollTimeout::MAX);
            let _ = nix::poll::poll(&mut fds, ms);
            if fds[0].revents().is_some_and(|r| !r.is_empty()) {
                let mut buf = [0u8; 256];
                sock.set_nonblocking(true).expect("nonblocking");
                if let Ok(n) = sock.recv(&mut buf) {
                    if String::from_utf8_lossy(&buf[..n]).contains("READY=1") {
                        return true;
                    }
                }
            } else if fds[1].revents().is_some_and(|r| !r.is_empty()) {
                let status = self.sb.supd.take().map(|mut c| c.wait());
                let tail = tail(&self.sb.supd_log(), 6);
                self.violate(
                    "START",
                    format!(
                        "supd {} exited before it was ready ({status:?}):\n{tail}",
                        self.gen
                    ),
                    None,
                );
                return false;
            }
        }
    }

    fn kill_child(&mut self) {
        if let Some(mut c) = self.sb.supd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// kill -9 of supd.
    pub fn kill9(&mut self) {
        let t = unix_ms();
        self.kill_child();
        self.retire();
        self.model.down(t, "kill -9");
    }

    /// SIGTERM to supd: it must exit, with success, within shutdown_timeout + margin.
    pub fn term(&mut self) -> bool {
        let Some(mut child) = self.sb.supd.take() else {
            return false;
        };
        self.pump();
        self.model.disturb("SIGTERM");
        let t = unix_ms();
        let started = Instant::now();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let bound = Duration::from_millis(SHUTDOWN_TIMEOUT_MS + TERM_MARGIN_MS);
        let ok = wait_exit(child.id() as i32, bound).is_some();
        if !ok {
            let status = self.sb.status_text();
            self.violate(
                "TERM",
                format!(
                    "supd did not exit within {bound:?} of SIGTERM (shutdown_timeout {SHUTDOWN_TIMEOUT_MS}ms); it was killed. Its status then: {status}\n{}",
                    tail(&self.sb.supd_log(), 8)
                ),
                None,
            );
            let _ = child.kill();
        }
        let status = child.wait().expect("wait supd");
        if ok && !status.success() {
            self.violate(
                "TERM",
                format!("supd ended its shutdown with {status}"),
                None,
            );
        }
        self.figures
            .entry("clean stops of supd")
            .and_modify(|n| *n += 1)
            .or_insert(1);
        self.note(format!("supd exited {:?} after SIGTERM", started.elapsed()));
        self.retire();
        self.model.down(t, "SIGTERM");
        true
    }

    // ---- the watch stream ----

    fn watch(&mut self) {
        let s = UnixStream::connect(&self.sb.socket).expect("connect for watch");
        let mut w = s.try_clone().expect("dup");
        w.write_all(b"{\"id\":1,\"cmd\":\"watch\"}\n")
            .expect("watch");
        let mut r = BufReader::new(s.try_clone().expect("dup"));
        let mut first = String::new();
        r.read_line(&mut first).expect("watch answer");
        let a: Value = serde_json::from_str(&first).expect("watch answer JSON");
        assert_eq!(a["ok"], true, "watch refused: {a}");
        let retired = Arc::new(AtomicBool::new(false));
        let (ev, flag) = (self.events.clone(), retired.clone());
        std::thread::spawn(move || loop {
            let mut line = String::new();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if flag.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(e) = serde_json::from_str::<Value>(&line) {
                        let (m, c) = &*ev;
                        m.lock().expect("events").push(e);
                        c.notify_all();
                    }
                }
            }
        });
        self.collector = Some(Collector { stream: s, retired });
        // What already runs is not told by an event.
        let now = unix_ms();
        for svc in self.tool_services() {
            let st = self.sb.status(svc);
            if st["state"] == "running" {
                if let Some(v) = st["version"].as_str() {
                    self.model.seen_running(svc, v, now);
                }
            }
        }
        let v = self.versions();
        if v["phase"] == "probation" && self.model.probation.is_none() {
            self.note(format!("a probation not seen begin: {}", v["proposed"]));
        }
    }

    fn retire(&mut self) {
        self.pump();
        if let Some(c) = self.collector.take() {
            c.retired.store(true, Ordering::SeqCst);
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
    }

    fn tool_services(&self) -> Vec<&'static str> {
        if self.seq.lease {
            vec!["agent", "engine"]
        } else {
            vec!["agent"]
        }
    }

    /// Feeds the events seen so far to the model, and collects what it found.
    pub fn pump(&mut self) {
        let new: Vec<Value> = {
            let (m, _) = &*self.events;
            let all = m.lock().expect("events");
            all[self.processed..].to_vec()
        };
        self.processed += new.len();
        for e in &new {
            match e["event"].as_str() {
                Some("upgrade") => {
                    let s = format!(
                        "event: upgrade {} {} (from {}) at {}{}",
                        e["phase"].as_str().unwrap_or("?"),
                        e["version"].as_str().unwrap_or("-"),
                        e["from"].as_str().unwrap_or("-"),
                        e["time"].as_u64().unwrap_or(0) % 100_000,
                        e["reason"]
                            .as_str()
                            .map_or(String::new(), |r| format!(": {r}"))
                    );
                    self.note(s)
                }
                Some("rollback") => self.note(format!(
                    "event: rollback {} -> {}: {}",
                    e["from"].as_str().unwrap_or("?"),
                    e["to"].as_str().unwrap_or("?"),
                    e["reason"].as_str().unwrap_or("")
                )),
                Some("lease") => {
                    let what = e["what"].as_str().unwrap_or("");
                    if what == "expired" || what == "released" {
                        self.lease_held = false;
                    }
                    self.note(format!("event: lease {what} term {}", e["term"]))
                }
                Some("state") => self.note(format!(
                    "event: {} {} -> {} on {} (pid {}) at {}{}",
                    e["service"].as_str().unwrap_or("?"),
                    e["from"].as_str().unwrap_or("?"),
                    e["to"].as_str().unwrap_or("?"),
                    e["version"].as_str().unwrap_or("-"),
                    e["pid"],
                    e["time"].as_u64().unwrap_or(0) % 100_000,
                    e["reason"]
                        .as_str()
                        .map_or(String::new(), |r| format!(": {r}"))
                )),
                _ => {}
            }
            self.model.event(e);
        }
        self.collect_model();
    }

    fn collect_model(&mut self) {
        let vs: Vec<Violation> = self.model.violations[self.model_seen..].to_vec();
        self.model_seen = self.model.violations.len();
        for v in vs {
            self.found.push((self.step, v));
        }
    }

    /// Waits (3 s at most) until an event says the agent's run that was running ended:
    /// after a self-switch or a KILL, so that a settle does not take the state before it
    /// for the state after.
    fn await_agent_left_running(&mut self, from: usize) {
        let end = Instant::now() + Duration::from_secs(3);
        loop {
            let seen = {
                let (m, _) = &*self.events;
                let all = m.lock().expect("events");
                all[from.min(all.len())..].iter().any(|e| {
                    e["event"] == "state" && e["service"] == "agent" && e["from"] == "running"
                })
            };
            if seen {
                return;
            }
            if Instant::now() >= end {
                self.note("the agent's run did not end within 3 s".into());
                return;
            }
            self.wait_events(Duration::from_millis(100));
            self.pump();
        }
    }

    /// Waits for new events (or `max`).
    fn wait_events(&self, max: Duration) {
        let (m, c) = &*self.events;
        let all = m.lock().expect("events");
        if all.len() > self.processed {
            return;
        }
        let _ = c.wait_timeout(all, max);
    }

    // ---- requests ----

    pub fn versions(&self) -> Value {
        self.sb.ok(json!({"cmd": "versions", "tool": "agent"}))
    }

    /// Waits until supd has settled: no probation, nothing waiting for the record, the
    /// agent running or given up (cooldown, failed). With the lease, a probation waits
    /// for a grant as sup-lease offers a trial: it is granted.
    pub fn settle(&mut self) -> bool {
        let end = Instant::now() + SETTLE;
        let mut granted = false;
        // When the record says the probation is over before its event came: the event
        // is waited for this long, then the record is believed (the event was lost with
        // a supd killed before the watch came).
        let mut record_done: Option<Instant> = None;
        loop {
            self.pump();
            let v = self.versions();
            let st = self.sb.status("agent");
            let state = st["state"].as_str().unwrap_or("").to_string();
            if self.seq.lease && v["phase"] == "probation" && !self.lease_held && !granted {
                granted = true;
                self.note("settle: the probation waits; lease-grant for 1h (a trial, as sup-lease offers)".into());
                self.grant(3_600_000);
            }
            let done = v["phase"] != "probation"
                && v["pending"].is_null()
                && ["running", "cooldown", "failed"].contains(&state.as_str());
            let seen = self.model.probation.is_none()
                || record_done.is_some_and(|t| t.elapsed() > Duration::from_secs(2));
            if done && record_done.is_none() {
                record_done = Some(Instant::now());
            }
            if done && seen {
                self.count("settles");
                let link = fs::read_link(self.sb.path("tools/agent/current"))
                    .map(|p| p.to_string_lossy().into_owned())
                    .ok();
                let record: Value = fs::read(self.sb.path("state/tool-records/agent.json"))
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok())
                    .unwrap_or(Value::Null);
                let recorded = record["current"].as_str().map(str::to_string);
                self.note(format!(
                    "settled: current {} phase {}, agent {state} on {}; bad {:?}",
                    v["current"].as_str().unwrap_or("-"),
                    v["phase"].as_str().unwrap_or("-"),
                    st["version"].as_str().unwrap_or("-"),
                    bad_list(&v)
                ));
                if state == "running" {
                    self.check_limits(&st);
                    self.check_socket(&st);
                }
                self.model
                    .settled(&v, link.as_deref(), recorded.as_deref(), &state, unix_ms());
                self.collect_model();
                self.check_dups();
                return true;
            }
            if Instant::now() >= end {
                self.violate(
                    "SETTLE",
                    format!(
                        "not settled within {SETTLE:?}: phase {} ({} in probation), agent {state} ({}), pending {}",
                        v["phase"], v["proposed"], st["reason"], v["pending"]
                    ),
                    None,
                );
                return false;
            }
            self.wait_events(Duration::from_millis(100));
        }
    }

    pub fn check_dups(&mut self) {
        let text = fs::read_to_string(self.sb.path("dups")).unwrap_or_default();
        if !text.is_empty() {
            self.violate(
                "ONE",
                format!("two runs of a service at once:\n{text}"),
                None,
            );
            let _ = fs::remove_file(self.sb.path("dups"));
        }
    }

    fn grant(&mut self, valid_ms: u64) {
        self.term += 1;
        let a = self.sb.request(
            json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1",
                                       "term": self.term, "valid_for": format!("{valid_ms}ms")}),
        );
        if a["ok"] == true {
            self.lease_held = true;
        }
        self.note(format!("lease-grant term {}: {}", self.term, answer(&a)));
    }

    // ---- the sequence ----

    /// The prologue: supd, 1.0.0 installed and committed.
    pub fn prologue(&mut self) -> bool {
        if !self.start() {
            return false;
        }
        self.install(&Version {
            name: "1.0.0".into(),
            kind: Kind::Good,
            manifest_irreversible: false,
        });
        self.upgrade("1.0.0", false, false);
        let ok = self.settle();
        self.break_file();
        ok
    }

    fn install(&mut self, v: &Version) {
        let src = self.sb.stage_version(&v.name, &body(v.kind));
        if v.manifest_irreversible {
            fs::write(src.join("sup-tool.toml"), "revertible = false\n").expect("manifest");
        }
        let out = self
            .sb
            .supctl(&["install", "agent", &v.name, &src.to_string_lossy()]);
        if !out.status.success() {
            self.violate(
                "START",
                format!(
                    "install {} failed: {}",
                    v.name,
                    String::from_utf8_lossy(&out.stderr)
                ),
                None,
            );
        }
        self.model.installed(
            &v.name,
            Info {
                kind: v.kind,
                manifest_irreversible: v.manifest_irreversible,
            },
        );
    }

    fn upgrade(&mut self, version: &str, force: bool, irreversible: bool) {
        self.pump();
        let a = self.sb.request(
            json!({"cmd": "upgrade", "tool": "agent", "version": version,
                                       "force": force, "irreversible": irreversible}),
        );
        if a["ok"] == true {
            self.model.upgrade_accepted(version, force, irreversible);
            self.count("upgrades accepted");
        } else {
            self.count("upgrades refused");
        }
        self.note(format!("upgrade {version}: {}", answer(&a)));
    }

    /// Runs one step; false when the sequence cannot go on (supd would not start).
    pub fn run_step(&mut self, i: usize) -> bool {
        self.step = i + 1;
        let step = self.seq.steps[i].clone();
        self.note(format!("step: {step}"));
        self.pump();
        match &step.action {
            Action::Install(v) => self.install(v),
            Action::Upgrade {
                version,
                force,
                irreversible,
            } => self.upgrade(version, *force, *irreversible),
            Action::SelfSwitch(to) => {
                let st = self.sb.status("agent");
                let runs = st["version"].as_str().unwrap_or("").to_string();
                let good = self
                    .seq
                    .steps
                    .iter()
                    .any(|s| matches!(&s.action, Action::Install(v) if v.name == runs && v.kind == Kind::Good))
                    || runs == "1.0.0";
                if st["state"] != "running" || !good {
                    self.note(format!("skipped: the agent is {} on {runs}", st["state"]));
                    self.count("self-switches skipped");
                } else {
                    let tmp = self.sb.path("switch-to.tmp");
                    fs::write(&tmp, to).expect("trigger");
                    fs::rename(&tmp, self.sb.path("switch-to")).expect("trigger");
                    let mark = self.events.0.lock().expect("events").len();
                    let a = self
                        .sb
                        .request(json!({"cmd": "signal", "service": "agent", "signal": "USR1"}));
                    self.note(format!("{runs} told to switch to {to}: {}", answer(&a)));
                    self.count("self-switches");
                    if a["ok"] == true {
                        self.await_agent_left_running(mark);
                    }
                }
            }
            Action::Crash => {
                let mark = self.events.0.lock().expect("events").len();
                let a = self
                    .sb
                    .request(json!({"cmd": "signal", "service": "agent", "signal": "KILL"}));
                self.note(format!("KILL: {}", answer(&a)));
                if a["ok"] == true {
                    self.await_agent_left_running(mark);
                }
            }
            Action::KillSupd => {
                self.kill9();
                self.count("kill -9 of supd");
                if !self.start() {
                    return false;
                }
            }
            Action::RestartSupd => {
                self.term();
                if !self.start() {
                    return false;
                }
            }
            Action::Reexec => {
                self.pump();
                let t0 = unix_ms();
                let out = self.sb.supctl(&["reexec"]);
                let t1 = unix_ms();
                self.note(format!(
                    "reexec: {} {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
                self.count("reexecs");
                // Refused only while something cannot be carried (busy: try again),
                // never for the services' file broken on disk (its copy runs).
                let err = String::from_utf8_lossy(&out.stderr).into_owned();
                if !out.status.success() && !err.contains("try again") {
                    self.violate(
                        "REEXEC",
                        format!(
                            "reexec refused{}: {err}",
                            if self.broken_on_disk.get() {
                                " with services.d/agent.toml broken on disk"
                            } else {
                                ""
                            }
                        ),
                        None,
                    );
                }
                self.retire();
                self.model.blind(t0, t1, "reexec");
                self.watch();
            }
            Action::Reload { changed } => {
                if *changed {
                    self.var += 1;
                }
                self.write_config();
                let a = self.sb.request(json!({"cmd": "reload"}));
                self.note(format!("reload: {}", answer(&a)));
                self.break_file();
            }
            Action::LeaseGrant { valid_ms } => self.grant(*valid_ms),
            Action::LeaseRelease => {
                let a = self
                    .sb
                    .request(json!({"cmd": "lease-release", "lease": "engine"}));
                self.lease_held = false;
                self.note(format!("lease-release: {}", answer(&a)));
                if a["ok"] == true {
                    let st = self.sb.status("engine");
                    if !st["pid"].is_null() {
                        self.violate(
                            "LEASE",
                            format!("lease-release answered, yet engine runs: {st}"),
                            None,
                        );
                    }
                }
            }
        }
        match step.then {
            Then::Settle => {
                if !self.settle() {
                    return false;
                }
            }
            Then::Wait(ms) => {
                std::thread::sleep(Duration::from_millis(ms)); // the next step's moment
                self.pump();
            }
        }
        self.check_dups();
        true
    }

    /// After the steps: settle, then a clean stop within its bound.
    pub fn epilogue(&mut self) {
        self.step = self.seq.steps.len() + 1;
        self.note("epilogue: settle, then SIGTERM".into());
        self.settle();
        self.term();
        self.check_dups();
        self.check_sessions();
    }

    /// The pids noted in `file` (sessions or workers) that are still alive sleeps.
    fn noted_alive(&self, file: &str) -> (Vec<i32>, Vec<i32>) {
        let text = fs::read_to_string(self.sb.path(file)).unwrap_or_default();
        let pids: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        pids.into_iter().partition(|&p| {
            sup::proc::stat(p).is_some_and(|st| st.state != 'Z')
                && fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep")
        })
    }

    /// After supd's exit: under "group" and "main" every session a good version started
    /// is alive (supd never ended one: not at a stop, a restart, a crash, a kill -9 of
    /// supd and a new one, a reexec, a rollback); under "cgroup" (with cgroups: as root)
    /// none is, within a bound.
    fn check_sessions(&mut self) {
        let (alive, gone) = self.noted_alive("sessions");
        match self.seq.kill_mode {
            "group" | "main" if !gone.is_empty() => self.violate(
                "SESSIONS",
                format!(
                    "sessions {gone:?} were ended under kill_mode = \"{}\" ({} of them live)",
                    self.seq.kill_mode,
                    alive.len()
                ),
                None,
            ),
            "cgroup" if nix::unistd::geteuid().is_root() => {
                // Killed by supd, perhaps not dead yet: each one's pidfd is readable once
                // it has exited.
                let end = std::time::Instant::now() + Duration::from_secs(3);
                for &pid in &alive {
                    if let Ok(fd) = sup::sys::pidfd_open(pid) {
                        use std::os::fd::AsFd;
                        let left = end.saturating_duration_since(std::time::Instant::now());
                        let ms = nix::poll::PollTimeout::try_from(left.as_millis() as i32)
                            .unwrap_or(nix::poll::PollTimeout::ZERO);
                        let mut p = [nix::poll::PollFd::new(
                            fd.as_fd(),
                            nix::poll::PollFlags::POLLIN,
                        )];
                        let _ = nix::poll::poll(&mut p, ms);
                    }
                }
                let left = self.noted_alive("sessions").0;
                if !left.is_empty() {
                    self.violate(
                        "SESSIONS",
                        format!("sessions {left:?} outlived supd under kill_mode = \"cgroup\""),
                        None,
                    );
                }
            }
            _ => {}
        }
    }

    pub fn final_versions(&self) -> String {
        fs::read_to_string(self.sb.path("state/tool-records/agent.json")).unwrap_or_default()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(c) = self.collector.take() {
            c.retired.store(true, Ordering::SeqCst);
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
        // supd by its pid (TERM, then KILL), then what its records name: Sandbox's drop.
        // What a killed supd left and no new one ended: by the lock files' holders.
        self.kill_child();
        // What kill_mode left by design: the sessions and "main"'s workers, by pid.
        for file in ["sessions", "workers"] {
            for pid in self.noted_alive(file).0 {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        for svc in ["agent", "engine"] {
            let holder =
                fs::read_to_string(self.sb.path(&format!("holder.{svc}"))).unwrap_or_default();
            if let Some(pid) = holder
                .split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<i32>().ok())
            {
                if let Some(st) = sup::proc::stat(pid) {
                    if st.pgrp == pid {
                        let _ = nix::sys::signal::killpg(
                            nix::unistd::Pid::from_raw(pid),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                }
            }
        }
    }
}

trait StatusText {
    fn status_text(&self) -> String;
}

impl StatusText for Sandbox {
    /// A short look at supd for a failure message (it may not answer).
    fn status_text(&self) -> String {
        match UnixStream::connect(&self.socket) {
            Ok(s) => {
                let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                let mut w = s.try_clone().expect("dup");
                let _ = w.write_all(b"{\"id\":1,\"cmd\":\"status\"}\n");
                let mut line = String::new();
                let _ = BufReader::new(s).read_line(&mut line);
                line.trim().to_string()
            }
            Err(e) => format!("(no answer: {e})"),
        }
    }
}

/// Whether the agent gets a `pids_max`: as root, where a hierarchy has the pids
/// controller.
fn pids_limited() -> bool {
    use sup::cgroup::limits::have_for_check;
    static LIMITED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LIMITED.get_or_init(|| is_root() && have_for_check(true).place(Controller::Pids).is_some())
}

fn answer(a: &Value) -> String {
    if a["ok"] == true {
        "ok".into()
    } else {
        format!("refused: {}", a["error"]["message"].as_str().unwrap_or("?"))
    }
}

fn bad_list(v: &Value) -> Vec<String> {
    v["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["bad"] == true)
        .filter_map(|x| x["version"].as_str().map(str::to_string))
        .collect()
}

pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A one-page pipe for supd's stderr, whose reader copies it into `log` but pauses for
/// 0.2–1.5 s after each read (the pace of a stalled reader: the fault, not a wait), so
/// that supd, logging at debug, finds it full most of the time. The reader ends at
/// end-of-file, once this supd (and its log writer) are gone.
fn stalled_pipe(mut log: fs::File, seed: u64) -> std::os::fd::OwnedFd {
    use std::io::Read;
    let (r, w) = nix::unistd::pipe().expect("pipe");
    let _ = nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(4096));
    std::thread::spawn(move || {
        let mut rng = crate::rng::Rng::new(seed);
        let mut r = fs::File::from(r);
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            let _ = log.write_all(&buf[..n]);
            std::thread::sleep(std::time::Duration::from_millis(rng.range(200, 1500)));
        }
    });
    w
}
