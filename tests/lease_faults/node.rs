//! One node: a sandbox with its supd (running an `agent` tool and the leader-only,
//! versioned `engine` tool, whose version is the node's candidacy for the lease) and its
//! sup-lease talking to its own etcd member, both under the clock shim with the node's
//! own clock file.

use crate::common::{Sandbox, SUPD};
use crate::native;
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

/// The engine's first version, placed with its `current` link before supd starts
/// (committed: a held-down leader-only service could not pass a probation).
pub const FIRST: &str = "1.0.0";

/// How the engine's service is configured, beyond what every node shares.
pub struct Engine<'a> {
    /// The good build, placed as [`FIRST`].
    pub binary: &'a Path,
    pub probation: &'a str,
    pub ready_timeout: &'a str,
}

/// The file, in the node's directory, whose presence makes its engine fail (exit 1).
pub const FAIL_FLAG: &str = "engine-fails";

pub const SUP_LEASE: &str = env!("CARGO_BIN_EXE_sup-lease");

pub struct Node {
    pub name: String,
    pub sb: Sandbox,
    pub lease: Option<Child>,
    pub store: String,
    pub clock: PathBuf,
    shim: PathBuf,
    ttl: String,
    lease_starts: usize,
}

impl Node {
    /// Configures, places the engine's first version, starts supd, makes version 0.6.2
    /// of the agent committed, starts sup-lease.
    pub fn new(
        name: &str,
        store: String,
        ttl: &str,
        engine: &Engine,
        witness: &Path,
        lock: &Path,
        shim: &Path,
    ) -> Node {
        let sb = Sandbox::new();
        sb.config(&format!(
            // The lease's candidacy is the engine's version: the newest eligible one is
            // preferred, and a node whose engine waits in its probation is on trial.
            // A crash loop is 3 quick exits; a short cooldown, so that faults that end
            // engines do not keep a node out for long.
            "[lease.engine]\ntool = \"engine\"\n\n\
             [service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\nrestart_delay = \"10ms\"\n\
             probation = \"1s\"\n\n\
             [service.engine]\ntool = \"engine\"\ncommand = [\"bin/engine\"]\nleader_only = \"engine\"\n\
             restart_delay = \"10ms\"\nstop_timeout = \"2s\"\nready = \"notify\"\n\
             ready_timeout = \"{ready_timeout}\"\nprobation = \"{probation}\"\n\
             crash_loop = {{ restarts = 3, window = \"1m\" }}\ncooldown = \"2s\"\n\
             env = {{ NODE = \"{name}\", WITNESS = \"{witness}\", LOCK = \"{lock}\", \
             FAIL = \"{fail}\" }}\n",
            ready_timeout = engine.ready_timeout,
            probation = engine.probation,
            witness = witness.display(),
            lock = lock.display(),
            fail = sb.path(FAIL_FLAG).display(),
        ));
        let first = sb.path(&format!("tools/engine/{FIRST}/bin"));
        std::fs::create_dir_all(&first).expect("mkdir tools/engine");
        std::fs::copy(engine.binary, first.join("engine")).expect("place the engine");
        std::os::unix::fs::symlink(FIRST, sb.path("tools/engine/current")).expect("current");
        let clock = sb.path("clock");
        native::clock_file(&clock);
        let mut n = Node {
            name: name.to_string(),
            sb,
            lease: None,
            store,
            clock,
            shim: shim.to_path_buf(),
            ttl: ttl.to_string(),
            lease_starts: 0,
        };
        n.start_supd();
        n.sb.install_version("0.6.2", "exec /bin/sleep 3600");
        n.sb.upgrade_wait("0.6.2", true);
        n.start_lease();
        n
    }

    pub fn start_supd(&mut self) {
        let mut cmd = Command::new(SUPD);
        cmd.env("LD_PRELOAD", &self.shim)
            .env("SUP_TEST_CLOCK_FILE", &self.clock);
        self.sb.start_with(cmd, &["-c"]);
    }

    pub fn start_lease(&mut self) {
        self.lease_starts += 1;
        let log = std::fs::File::create(self.sb.path(&format!("lease-{}.log", self.lease_starts)))
            .expect("log");
        let child = Command::new(SUP_LEASE)
            .args(["--lease", "engine", "--node", &self.name])
            .args(["--store", &self.store, "--ttl", &self.ttl, "--socket"])
            .arg(&self.sb.socket)
            .env("SUP_LOG", "debug")
            .env("LD_PRELOAD", &self.shim)
            .env("SUP_TEST_CLOCK_FILE", &self.clock)
            .stdout(log.try_clone().expect("dup"))
            .stderr(log)
            .spawn()
            .expect("sup-lease");
        self.lease = Some(child);
    }

    /// One request to supd: its `data`, or why there is none (an error, or no answer
    /// within 5 s).
    pub fn request(&self, req: Value) -> Result<Value, String> {
        let s = UnixStream::connect(&self.sb.socket).map_err(|e| format!("connect: {e}"))?;
        let limit = Some(Duration::from_secs(5));
        s.set_read_timeout(limit).map_err(|e| e.to_string())?;
        s.set_write_timeout(limit).map_err(|e| e.to_string())?;
        let mut line = serde_json::to_vec(&req).map_err(|e| e.to_string())?;
        line.push(b'\n');
        (&s).write_all(&line).map_err(|e| format!("send: {e}"))?;
        let mut answer = String::new();
        BufReader::new(&s)
            .read_line(&mut answer)
            .map_err(|e| format!("no answer: {e}"))?;
        let a: Value = serde_json::from_str(&answer).map_err(|e| format!("{e}: {answer}"))?;
        if a["ok"] == true {
            Ok(a["data"].clone())
        } else {
            Err(a["error"].to_string())
        }
    }

    /// Installs `binary` as version `version` of the engine (staged in the node's
    /// directory, then `install`).
    pub fn install_engine(&self, version: &str, binary: &Path) -> Result<Value, String> {
        let src = self.sb.path(&format!("stage-engine-{version}"));
        std::fs::create_dir_all(src.join("bin")).map_err(|e| e.to_string())?;
        std::fs::copy(binary, src.join("bin/engine")).map_err(|e| e.to_string())?;
        self.request(json!({"cmd": "install", "tool": "engine", "version": version, "dir": src}))
    }

    /// `upgrade engine VERSION` (without waiting).
    pub fn upgrade_engine(&self, version: &str) -> Result<Value, String> {
        self.request(json!({"cmd": "upgrade", "tool": "engine", "version": version}))
    }

    /// `versions engine`.
    pub fn engine_versions(&self) -> Result<Value, String> {
        self.request(json!({"cmd": "versions", "tool": "engine"}))
    }

    pub fn lease_pid(&self) -> Option<i32> {
        self.lease.as_ref().map(|c| c.id() as i32)
    }

    pub fn supd_pid(&self) -> Option<i32> {
        self.sb.supd.as_ref().map(|c| c.id() as i32)
    }

    /// kill -9 of supd and sup-lease together (its engine, if any, is left as it is).
    pub fn kill9(&mut self) {
        let pids: Vec<i32> = self
            .supd_pid()
            .into_iter()
            .chain(self.lease_pid())
            .collect();
        for p in pids {
            signal(p, Signal::SIGKILL);
        }
        if self.sb.supd.is_some() {
            self.sb.stop_supd(Signal::SIGKILL);
        }
        if let Some(mut c) = self.lease.take() {
            let _ = c.wait();
        }
    }

    /// kill -9 of sup-lease alone.
    pub fn kill_lease(&mut self) {
        if let Some(mut c) = self.lease.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Makes the node's engine fail (every start exits 1) or work again.
    pub fn fail_engine(&self, fail: bool) {
        let flag = self.sb.path(FAIL_FLAG);
        if fail {
            std::fs::write(&flag, b"").expect("the fail flag");
        } else {
            let _ = std::fs::remove_file(&flag);
        }
    }

    /// supd and then sup-lease started again.
    pub fn restart(&mut self) {
        self.start_supd();
        self.start_lease();
    }
}

pub fn signal(pid: i32, sig: Signal) {
    if pid > 1 {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

impl Drop for Node {
    /// sup-lease killed by its pid; supd and what it started are the sandbox's to end
    /// (continued first, so that it can exit on SIGTERM).
    fn drop(&mut self) {
        if let Some(p) = self.supd_pid() {
            signal(p, Signal::SIGCONT);
        }
        if let Some(mut c) = self.lease.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
