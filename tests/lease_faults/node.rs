//! One node: a sandbox with its supd (running an `agent` tool and the leader-only
//! `engine`) and its sup-lease talking to its own etcd member, both under the clock shim
//! with the node's own clock file.

use crate::common::{Sandbox, SUPD};
use crate::native;
use nix::sys::signal::Signal;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

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
    /// Configures, starts supd, makes version 0.6.2 of the agent committed, starts
    /// sup-lease.
    pub fn new(
        name: &str,
        store: String,
        ttl: &str,
        engine: &Path,
        witness: &Path,
        lock: &Path,
        shim: &Path,
    ) -> Node {
        let sb = Sandbox::new();
        sb.config(&format!(
            // No tool: plain leader election, every live node eligible.
            "[lease.engine]\n\n\
             [service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\nrestart_delay = \"10ms\"\n\
             probation = \"1s\"\n\n\
             [service.engine]\ncommand = [\"{engine}\"]\nleader_only = \"engine\"\nrestart_delay = \"10ms\"\n\
             stop_timeout = \"2s\"\n\
             env = {{ NODE = \"{name}\", WITNESS = \"{witness}\", LOCK = \"{lock}\" }}\n",
            engine = engine.display(),
            witness = witness.display(),
            lock = lock.display(),
        ));
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
