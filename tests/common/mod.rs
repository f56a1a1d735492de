//! The integration harness: a temp dir per test with its own config and socket, supd
//! started as a child, a `watch` stream to wait on with a deadline, and cleanup of every
//! process by pid. No test sleeps a guessed time.
#![allow(dead_code)]

pub mod agent;
pub mod certs;
pub mod cgroup_sweep;
pub mod cgroups;
pub mod clock;
pub mod cluster;
pub mod etcd;
pub mod files;
pub mod fleet;
pub mod freezer;
pub mod grants;
pub mod locking;
pub mod lossless;
pub mod metrics_file;
pub mod oldkernel;
pub mod preload;
pub mod proxy;
pub mod scenarios;
pub mod talk;

/// A duration from the tests' TTL strings ("900ms", "1s").
pub fn parse_ttl(s: &str) -> Duration {
    sup::time::parse_duration(s).expect("a duration")
}

use serde_json::{json, Value};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const SUPD: &str = env!("CARGO_BIN_EXE_supd");

/// Whether this kernel lists a thread's children (`/proc/PID/task/TID/children`): where
/// it does, supd finds a run without a cgroup by its session (supd(8)).
pub fn children_file() -> bool {
    let found = Path::new(&format!("/proc/self/task/{}/children", std::process::id())).exists();
    if !found {
        eprintln!("this kernel has no /proc/PID/task/TID/children");
    }
    found
}
pub const SUPCTL: &str = env!("CARGO_BIN_EXE_supctl");
/// The longest any single wait in a test may take before it fails.
pub const DEADLINE: Duration = Duration::from_secs(20);

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// Whether tests run as root (CI does); tests that need it say so and return otherwise.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// One test's directory, config, and supd.
pub struct Sandbox {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub supd: Option<Child>,
    /// A number unique to this sandbox, for marking its processes.
    pub tag: u64,
}

impl Sandbox {
    pub fn new() -> Sandbox {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = PathBuf::from(format!("/tmp/supt-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create sandbox dir");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod sandbox");
        let tag = 700_000 + (std::process::id() as u64 % 1000) * 100 + n as u64;
        Sandbox {
            socket: dir.join("sup.sock"),
            dir,
            supd: None,
            tag,
        }
    }

    /// Writes `sup.toml`: a `[supd]` table with paths inside the sandbox, then `services`.
    pub fn config(&self, services: &str) {
        self.config_with("", services);
    }

    /// Same, with extra `[supd]` keys.
    pub fn config_with(&self, supd_extra: &str, services: &str) {
        let text = format!(
            "[supd]\nsocket = \"sup.sock\"\nstate_dir = \"state\"\nlog_dir = \"log\"\ntools_dir = \"tools\"\nshutdown_timeout = \"5s\"\n{supd_extra}\n{services}"
        );
        fs::write(self.dir.join("sup.toml"), text).expect("write config");
    }

    /// Writes an executable shell script and returns its path.
    pub fn script(&self, name: &str, body: &str) -> String {
        self.file(name, &format!("#!/bin/sh\n{body}\n"))
    }

    /// Writes an executable file (any interpreter line) and returns its path.
    pub fn file(&self, name: &str, text: &str) -> String {
        let p = self.dir.join(name);
        fs::write(&p, text).expect("write script");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).expect("chmod script");
        p.to_string_lossy().into_owned()
    }

    /// A fake version of the tool `agent`: `bin/agent`, a shell script that says which
    /// version it is and then runs `body`, staged in `src-VERSION` outside tools_dir.
    pub fn stage_version(&self, version: &str, body: &str) -> PathBuf {
        let dir = self.path(&format!("src-{version}"));
        fs::create_dir_all(dir.join("bin")).expect("mkdir");
        let script = dir.join("bin/agent");
        fs::write(
            &script,
            format!("#!/bin/sh\necho \"agent $SUP_VERSION up\"\n{body}\n"),
        )
        .expect("write");
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).expect("chmod");
        dir
    }

    /// `supctl upgrade agent VERSION --wait`, which must commit (`ok`) or not.
    pub fn upgrade_wait(&self, version: &str, ok: bool) {
        let out = self.supctl(&["upgrade", "agent", version, "--wait"]);
        assert_eq!(
            out.status.code(),
            Some(if ok { 0 } else { 1 }),
            "upgrade {version}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Places a version of `agent` and its `current` link as a provisioner does, before
    /// supd starts: committed, no probation (a leader-only agent, held down while the
    /// node does not lead, could not pass one).
    pub fn provision_version(&self, version: &str, body: &str) {
        let src = self.stage_version(version, body);
        let tool = self.path("tools/agent");
        fs::create_dir_all(&tool).expect("mkdir tools/agent");
        fs::rename(&src, tool.join(version)).expect("place the version");
        std::os::unix::fs::symlink(version, tool.join("current")).expect("current");
    }

    /// Stages a version and installs it with `supctl install` (which must succeed).
    pub fn install_version(&self, version: &str, body: &str) {
        let src = self.stage_version(version, body);
        let out = self.supctl(&["install", "agent", version, &src.to_string_lossy()]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "install {version}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A second mark unique to this sandbox, never another sandbox's `tag` (tags are
    /// consecutive: `tag + 1` is the next sandbox's, which a test running beside would
    /// count as its own; the offsets 1 to 5 million are health's and health_faults').
    pub fn second_tag(&self) -> u64 {
        self.tag + 9_000_000
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Starts supd on the sandbox's config and waits until it says it is ready. With
    /// `SUP_TEST_LINUX_3_10` set, supd runs under the system calls of Linux 3.10
    /// (`oldkernel::linux_3_10`): `.ci/run` runs the tests of one instance that way.
    pub fn start(&mut self) {
        let mut cmd = Command::new(SUPD);
        if std::env::var_os("SUP_TEST_LINUX_3_10").is_some() && oldkernel::supported() {
            oldkernel::linux_3_10(&mut cmd);
        }
        self.start_with(cmd, &["-c"]);
    }

    /// Starts supd as on a kernel without `/proc/PID/task/TID/children`
    /// (`SUP_NO_PROC_CHILDREN`): a run without a cgroup is then its process group alone.
    pub fn start_group_only(&mut self) {
        let mut cmd = Command::new(SUPD);
        cmd.env("SUP_NO_PROC_CHILDREN", "1");
        self.start_with(cmd, &["-c"]);
    }

    /// Starts `cmd` (which runs supd, perhaps through `unshare`) with `args` then the
    /// config path appended, and waits for supd's READY=1.
    pub fn start_with(&mut self, cmd: Command, args: &[&str]) {
        self.start_with_stderr(cmd, args, None);
    }

    /// `start_with`, supd's stderr going to `stderr` (a pipe the test holds, say) rather
    /// than to `supd.stderr` (stdout still goes there).
    pub fn start_with_stderr(
        &mut self,
        mut cmd: Command,
        args: &[&str],
        stderr: Option<std::os::fd::OwnedFd>,
    ) {
        let ready_path = self.dir.join(format!(
            "ready-{}.sock",
            COUNTER.fetch_add(1, Ordering::SeqCst)
        ));
        let ready = UnixDatagram::bind(&ready_path).expect("bind ready socket");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("supd.stderr"))
            .expect("supd log");
        cmd.args(args)
            .arg(self.dir.join("sup.toml"))
            .env("NOTIFY_SOCKET", &ready_path)
            .env("SUP_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"));
        match stderr {
            Some(fd) => cmd.stderr(fd),
            None => cmd.stderr(log),
        };
        let child = cmd.spawn().expect("spawn supd");
        self.supd = Some(child);
        let end = Instant::now() + DEADLINE;
        let mut buf = [0u8; 256];
        loop {
            let left = end
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            ready.set_read_timeout(Some(left)).expect("timeout");
            match ready.recv(&mut buf) {
                Ok(n) if String::from_utf8_lossy(&buf[..n]).contains("READY=1") => return,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted && Instant::now() < end => {
                    continue
                }
                Err(e) => panic!(
                    "supd did not become ready within {DEADLINE:?}: {e}\n{}",
                    self.supd_log()
                ),
            }
        }
    }

    /// supd's own log so far, for failure messages.
    pub fn supd_log(&self) -> String {
        fs::read_to_string(self.dir.join("supd.stderr")).unwrap_or_default()
    }

    pub fn supd_pid(&self) -> i32 {
        self.supd.as_ref().expect("supd started").id() as i32
    }

    /// Opens a client connection.
    pub fn client(&self) -> Client {
        Client::connect(&self.socket)
    }

    /// One request on a fresh connection; returns the whole answer.
    pub fn request(&self, req: Value) -> Value {
        self.client().call(req)
    }

    /// `data` of a successful answer; panics with the error otherwise.
    pub fn ok(&self, req: Value) -> Value {
        let a = self.request(req.clone());
        assert_eq!(
            a["ok"],
            true,
            "request {req} failed: {a}\n{}",
            self.supd_log()
        );
        a["data"].clone()
    }

    /// The status of one service.
    pub fn status(&self, service: &str) -> Value {
        self.ok(json!({"cmd": "status", "service": service}))["services"][0].clone()
    }

    /// A `watch` stream.
    pub fn watch(&self) -> Watch {
        let mut c = self.client();
        let a = c.call(json!({"cmd": "watch"}));
        assert_eq!(a["ok"], true, "watch refused: {a}");
        Watch {
            client: c,
            seen: Vec::new(),
        }
    }

    /// Waits until `service` is in `state` (already, or by an event) and returns its status.
    pub fn wait_state(&self, service: &str, state: &str) -> Value {
        let mut w = self.watch();
        let now = self.status(service);
        if now["state"] == state {
            return now;
        }
        w.until(self, |e| {
            e["event"] == "state" && e["service"] == service && e["to"] == state
        });
        self.status(service)
    }

    /// `supctl reexec`, which answers once the new image serves: it must succeed.
    pub fn reexec(&self) {
        let out = self.supctl(&["reexec"]);
        assert!(
            out.status.success(),
            "reexec: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.supd_log()
        );
    }

    /// `supctl reexec` started, its answer not awaited (its output dropped).
    pub fn spawn_reexec(&self) -> Child {
        Command::new(SUPCTL)
            .arg("-s")
            .arg(&self.socket)
            .arg("reexec")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("supctl reexec")
    }

    /// Runs supctl against this sandbox, killed after the deadline (a wait that never
    /// ends fails the test instead of hanging it).
    pub fn supctl(&self, args: &[&str]) -> std::process::Output {
        let out = Command::new("timeout")
            .args([
                "--signal=KILL",
                &DEADLINE.as_secs().to_string(),
                SUPCTL,
                "-s",
            ])
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run supctl");
        assert_ne!(
            out.status.code(),
            None,
            "supctl {args:?} did not finish within {DEADLINE:?}\n{}",
            self.supd_log()
        );
        out
    }

    /// Sends `sig` to supd and waits (with the deadline) for it to exit; returns its status.
    pub fn stop_supd(&mut self, sig: nix::sys::signal::Signal) -> std::process::ExitStatus {
        let mut child = self.supd.take().expect("supd running");
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig);
        wait_exit(child.id() as i32, DEADLINE).unwrap_or_else(|| {
            let _ = child.kill();
            panic!("supd did not exit within {DEADLINE:?}\n{}", self.supd_log())
        });
        child.wait().expect("wait supd")
    }

    /// Pid records supd keeps (services' process groups).
    pub fn recorded_groups(&self) -> Vec<i32> {
        self.records().into_iter().map(|(pid, _)| pid).collect()
    }

    /// (pid, start time) of each record.
    fn records(&self) -> Vec<(i32, u64)> {
        sup::records::read_pids(&self.dir.join("state"))
            .into_iter()
            .map(|r| (r.pid, r.start_time))
            .collect()
    }
}

impl Drop for Sandbox {
    /// Ends supd by its pid (TERM, then KILL), and anything its records still name.
    fn drop(&mut self) {
        // Only groups whose leader is still the recorded process: a pid may be reused.
        let groups: Vec<i32> = self
            .records()
            .into_iter()
            .filter(|(pid, start)| sup::proc::stat(*pid).is_some_and(|s| s.start_time == *start))
            .map(|(pid, _)| pid)
            .collect();
        if let Some(mut child) = self.supd.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            if wait_exit(child.id() as i32, Duration::from_secs(10)).is_none() {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        for g in groups {
            if g > 1 {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(g),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        // Its cgroups, once what ran in them is gone (a killed supd leaves them).
        cgroup_sweep::sweep(&self.dir.join("state"));
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// A process's voluntary context switches so far: each is a wait begun, so each is a
/// wake-up (preemptions, which load adds, are not its own).
pub fn voluntary_switches(pid: i32) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches")
}

/// Waits until `pid` (supd) is blocked in its loop's poll (`/proc/PID/syscall` names
/// poll or ppoll), within the deadline. No event tells that a process went to sleep:
/// the state is looked at every millisecond.
pub fn wait_in_poll(pid: i32) {
    assert!(
        in_poll_within(pid, DEADLINE),
        "{pid} never waited in poll: {}",
        fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default()
    );
}

/// Whether `pid` blocks in poll within `limit`: a supd whose loop is woken for ever by a
/// ready fd never does.
pub fn in_poll_within(pid: i32, limit: Duration) -> bool {
    let end = Instant::now() + limit;
    loop {
        let call = fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        // x86_64: 7 poll, 271 ppoll; aarch64 has ppoll alone, 73.
        let nr = call.split_whitespace().next().unwrap_or("");
        if matches!(
            (std::env::consts::ARCH, nr),
            ("x86_64", "7" | "271") | ("aarch64", "73")
        ) {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1)); // a state, not an event: looked at again
    }
}

/// Waits for any process (child or not) to exit, through a pidfd. `None` on timeout.
pub fn wait_exit(pid: i32, timeout: Duration) -> Option<()> {
    let Ok(fd) = sup::sys::pidfd_open(pid) else {
        return Some(());
    }; // already gone
    let mut fds = [nix::poll::PollFd::new(
        fd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    let ms = nix::poll::PollTimeout::try_from(timeout.as_millis() as i32)
        .unwrap_or(nix::poll::PollTimeout::MAX);
    match nix::poll::poll(&mut fds, ms) {
        Ok(n) if n > 0 => Some(()),
        _ => None,
    }
}

/// Whether a process with this pid exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    sup::proc::stat(pid).is_some_and(|s| s.state != 'Z')
}

/// Processes whose command line is exactly `argv`.
pub fn processes_with_cmdline(argv: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| a.bytes().chain(std::iter::once(0)))
        .collect();
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

/// Waits (with the deadline) until some process has exactly `argv`; returns its pid.
/// No event tells that a process appeared, so /proc is looked at every 10 ms.
pub fn wait_present(argv: &[&str], what: &str) -> i32 {
    let end = Instant::now() + DEADLINE;
    loop {
        if let Some(&pid) = processes_with_cmdline(argv).first() {
            return pid;
        }
        assert!(Instant::now() < end, "{what}: no process {argv:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (with the deadline) until no process has exactly `argv`; on the deadline, kills
/// what is left by its pid and panics with `what`.
pub fn wait_gone(argv: &[&str], what: &str) {
    let end = Instant::now() + DEADLINE;
    while let Some(&pid) = processes_with_cmdline(argv).first() {
        if Instant::now() >= end {
            for p in processes_with_cmdline(argv) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            panic!("{what}: {argv:?} (pid {pid}) is still there");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A connection to supd.
pub struct Client {
    pub reader: BufReader<UnixStream>,
    pub writer: UnixStream,
    next_id: u64,
}

impl Client {
    pub fn connect(path: &Path) -> Client {
        let s =
            UnixStream::connect(path).unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
        s.set_read_timeout(Some(DEADLINE)).expect("timeout");
        Client {
            writer: s.try_clone().expect("dup"),
            reader: BufReader::new(s),
            next_id: 1,
        }
    }

    /// Sends raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).expect("send");
    }

    /// Reads one line as JSON; `None` at end of stream.
    pub fn read(&mut self) -> Option<Value> {
        let mut line = String::new();
        loop {
            match self.reader.read_line(&mut line) {
                Ok(0) => return None,
                Ok(_) => {
                    return Some(
                        serde_json::from_str(&line)
                            .unwrap_or_else(|e| panic!("bad JSON from supd: {e}: {line}")),
                    )
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => panic!("no answer from supd within {DEADLINE:?}: {e}"),
            }
        }
    }

    /// Sends a request with a fresh id and returns the answer.
    pub fn call(&mut self, mut req: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        req["id"] = json!(id);
        let mut line = serde_json::to_vec(&req).expect("encode");
        line.push(b'\n');
        self.send_raw(&line);
        let a = self.read().expect("supd closed the connection");
        assert_eq!(a["id"], json!(id), "answer out of order: {a}");
        a
    }
}

/// A `watch` stream, remembering what it saw.
pub struct Watch {
    pub client: Client,
    pub seen: Vec<Value>,
}

impl Watch {
    /// Reads events until one matches; panics with what was seen after the deadline.
    pub fn until(&mut self, sb: &Sandbox, pred: impl Fn(&Value) -> bool) -> Value {
        let end = Instant::now() + DEADLINE;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no matching event within {DEADLINE:?}; saw:\n{:#?}\n{}",
                self.seen,
                sb.supd_log()
            );
            self.client
                .reader
                .get_ref()
                .set_read_timeout(Some(left))
                .expect("timeout");
            let mut line = String::new();
            match self.client.reader.read_line(&mut line) {
                Ok(0) => panic!(
                    "supd closed the watch stream; saw:\n{:#?}\n{}",
                    self.seen,
                    sb.supd_log()
                ),
                Ok(_) => {
                    let e: Value = serde_json::from_str(&line).expect("event JSON");
                    self.seen.push(e.clone());
                    if pred(&e) {
                        return e;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => panic!(
                    "no matching event within {DEADLINE:?} ({e}); saw:\n{:#?}\n{}",
                    self.seen,
                    sb.supd_log()
                ),
            }
        }
    }

    /// The next event if one comes within `timeout`.
    pub fn next_within(&mut self, timeout: Duration) -> Option<Value> {
        self.client
            .reader
            .get_ref()
            .set_read_timeout(Some(timeout))
            .expect("timeout");
        let mut line = String::new();
        match self.client.reader.read_line(&mut line) {
            Ok(n) if n > 0 => {
                let e: Value = serde_json::from_str(&line).expect("event JSON");
                self.seen.push(e.clone());
                Some(e)
            }
            _ => None,
        }
    }

    /// Waits for a state event of `service` into `to`.
    pub fn state(&mut self, sb: &Sandbox, service: &str, to: &str) -> Value {
        self.until(sb, |e| {
            e["event"] == "state" && e["service"] == service && e["to"] == to
        })
    }
}
