//! Several nodes on one machine for the lease tests: each a sandbox with its own supd
//! (running an `agent` tool and a leader-only `engine`) and its own sup-lease, all
//! sharing one store. The engine takes a `mkdir` lock in a shared directory: if two
//! engines ever run at once, the second one writes `overlap`, and the test fails. A
//! SIGTERM that comes before the handler that removes the lock is in place is kept for
//! it, and the `mkdir` ignores it (the stop signals the whole group): an engine stopped
//! as it starts (a restart that meets a release) leaves no lock and no false mark. An
//! engine whose node has `fail-NODE` in the shared directory exits 1 at once.
#![allow(dead_code)]

use super::*;
use std::process::Child;

pub const SUP_LEASE: &str = env!("CARGO_BIN_EXE_sup-lease");

pub struct Node {
    pub name: String,
    pub sb: Sandbox,
    pub lease: Option<Child>,
}

/// How a cluster is built, beyond its versions, store and TTL.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Engines take this long to stop after SIGTERM.
    pub stop_secs: f32,
    /// `[lease.engine]` without a tool (plain leader election): no agent is installed.
    pub no_tool: bool,
    /// The sup-leases are started by the test (`start_lease_with`), not at once.
    pub hold_leases: bool,
    /// More lines of the engine's `[service.engine]` table (a `health` check, say);
    /// `{shared}` in them is the shared directory, and the engine has `NODE` in its
    /// environment, as its check does.
    pub engine: String,
    /// The agent's `probation` ("1s" when empty).
    pub probation: &'static str,
    /// Each node's sup-lease also follows the fleet of `agent` (`--fleet agent`, staging
    /// in its sandbox).
    pub fleet: bool,
    /// The agent is leader-only too (`leader_only = "engine"`), as in sup.toml(5)'s lease
    /// example: it runs only on the holder, and its upgrades are tried on the lease. Each
    /// node's first version is placed with its `current` link before supd starts
    /// (committed: a held-down agent could not pass a probation).
    pub agent_leads: bool,
    /// More arguments for every sup-lease the cluster runs (how the store is reached:
    /// `--cacert`, `--user`, ...).
    pub lease_args: Vec<String>,
}

pub struct Cluster {
    pub nodes: Vec<Node>,
    pub fleet: bool,
    pub store: String,
    pub shared: PathBuf,
    pub ttl: &'static str,
    pub lease_args: Vec<String>,
    _dir: Sandbox,
}

/// A version of the fake agent: stays up, or crashes at once.
pub fn agent_body(crash: bool) -> &'static str {
    if crash {
        "exit 3"
    } else {
        "exec /bin/sleep 3600"
    }
}

impl Cluster {
    /// `versions[i]` is node i's committed version of the agent; `store` None: a file
    /// store in the shared directory.
    pub fn new(versions: &[&str], store: Option<String>, ttl: &'static str) -> Cluster {
        Cluster::build(versions, store, ttl, Options::default())
    }

    /// A cluster built with `opts`.
    pub fn with(
        versions: &[&str],
        store: Option<String>,
        ttl: &'static str,
        opts: Options,
    ) -> Cluster {
        Cluster::build(versions, store, ttl, opts)
    }

    /// Engines that take `stop_secs` to stop after SIGTERM (longer than a TTL).
    pub fn slow_to_stop(
        versions: &[&str],
        store: Option<String>,
        ttl: &'static str,
        stop_secs: f32,
    ) -> Cluster {
        let opts = Options {
            stop_secs,
            ..Options::default()
        };
        Cluster::build(versions, store, ttl, opts)
    }

    fn build(
        versions: &[&str],
        store: Option<String>,
        ttl: &'static str,
        opts: Options,
    ) -> Cluster {
        let stop_secs = opts.stop_secs;
        let probation = match opts.probation {
            "" => "1s",
            p => p,
        };
        let more = opts.engine.clone();
        let dir = Sandbox::new();
        let shared = dir.dir.clone();
        let store =
            store.unwrap_or_else(|| format!("file:{}", shared.join("store.json").display()));
        let engine = dir.script(
            "engine.sh",
            &format!(
                "[ -e {s}/fail-$NODE ] && exit 1\n\
                 trap 'stop=1' TERM\n\
                 (trap '' TERM; exec mkdir {s}/lock 2>/dev/null); rc=$?; mine=\n\
                 if [ $rc = 0 ]; then mine=1; elif [ $rc -lt 128 ]; then echo \"$NODE overlaps\" >> {s}/overlap; fi\n\
                 echo \"$NODE $SUP_LEASE_TERM\" >> {s}/engine.log\n\
                 trap '/bin/sleep {stop_secs}; [ -n \"$mine\" ] && rmdir {s}/lock; exit 0' TERM\n\
                 [ -n \"$stop\" ] && kill -TERM $$\n\
                 while :; do /bin/sleep 1 & wait $!; done",
                s = shared.display()
            ),
        );
        let more = more.replace("{shared}", &shared.display().to_string());
        let mut nodes = Vec::new();
        for (i, v) in versions.iter().enumerate() {
            let name = format!("n{}", i + 1);
            let sb = Sandbox::new();
            let tool = if opts.no_tool {
                ""
            } else {
                "tool = \"agent\"\n"
            };
            sb.config(&format!(
                "[lease.engine]\n{tool}\n\
                 [service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\nrestart_delay = \"10ms\"\n{agent_leads}\
                 crash_loop = {{ restarts = 3, window = \"1m\" }}\ncooldown = \"1h\"\nprobation = \"{probation}\"\n\n\
                 [service.engine]\ncommand = [\"{engine}\"]\nleader_only = \"engine\"\nenv = {{ NODE = \"{name}\" }}\nstop_timeout = \"{stop}s\"\n{more}",
                stop = stop_secs as u32 + 2,
                agent_leads = if opts.agent_leads {
                    "leader_only = \"engine\"\n"
                } else {
                    ""
                },
            ));
            nodes.push(Node {
                name,
                sb,
                lease: None,
            });
            let n = nodes.last_mut().expect("node");
            if opts.agent_leads {
                n.sb.provision_version(v, agent_body(false));
            }
            n.sb.start();
            if !opts.no_tool && !opts.agent_leads {
                n.install(v, false);
                n.upgrade(v, true);
            }
        }
        let mut c = Cluster {
            nodes,
            fleet: opts.fleet,
            store,
            shared,
            ttl,
            lease_args: opts.lease_args.clone(),
            _dir: dir,
        };
        if !opts.hold_leases {
            for i in 0..c.nodes.len() {
                c.start_lease(i);
            }
        }
        c
    }

    /// Starts node i's sup-lease.
    pub fn start_lease(&mut self, i: usize) {
        self.start_lease_with(i, &[]);
    }

    /// Starts node i's sup-lease with more environment (an LD_PRELOAD shim).
    pub fn start_lease_with(&mut self, i: usize, env: &[(&str, &std::ffi::OsStr)]) {
        let n = &mut self.nodes[i];
        let log =
            std::fs::File::create(n.sb.path(&format!("lease-{}.log", unix_now()))).expect("log");
        let mut cmd = Command::new(SUP_LEASE);
        if self.fleet {
            cmd.args(["--fleet", "agent", "--staging"])
                .arg(n.sb.path("staging"));
        }
        let child = cmd
            .args([
                "--lease",
                "engine",
                "--node",
                &n.name,
                "--store",
                &self.store,
                "--ttl",
                self.ttl,
                "--socket",
            ])
            .arg(&n.sb.socket)
            .args(&self.lease_args)
            .env("SUP_LOG", "debug")
            .envs(env.iter().copied())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log)
            .spawn()
            .expect("sup-lease");
        n.lease = Some(child);
    }

    /// The nodes whose engine runs now.
    pub fn running_engines(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.sb.status("engine")["state"] == "running")
            .map(|n| n.name.clone())
            .collect()
    }

    /// Waits until `pred` holds, checking for overlaps all along. Looks again at every
    /// event of any node (the leader renews its grant every T/3, so events keep coming);
    /// each stream is waited on for a short while in turn.
    pub fn wait(&self, what: &str, pred: impl Fn(&Cluster) -> bool) {
        let end = std::time::Instant::now() + DEADLINE * 2;
        let mut watches: Vec<Watch> = self.nodes.iter().map(|n| n.sb.watch()).collect();
        loop {
            self.assert_no_overlap();
            if pred(self) {
                return;
            }
            assert!(
                std::time::Instant::now() < end,
                "{what}: not within {:?}; engines on {:?}\n{}\n{}",
                DEADLINE * 2,
                self.running_engines(),
                self.status_text(),
                self.logs()
            );
            for w in &mut watches {
                w.next_within(Duration::from_millis(30));
            }
        }
    }

    /// Waits until the engine runs on `node` alone.
    pub fn wait_leader(&self, node: &str) {
        self.wait(&format!("the engine on {node} alone"), |c| {
            c.running_engines() == [node]
        });
    }

    /// The engines' start log so far (a line "NODE TERM" per start of any node's engine).
    pub fn engine_log(&self) -> String {
        std::fs::read_to_string(self.shared.join("engine.log")).unwrap_or_default()
    }

    /// `node` kept the lease since `log_before` (an [`Cluster::engine_log`]): its engine
    /// runs (waited for: at T of about 1 s, a tick late by T/6 on a loaded machine lets a
    /// grant run out and the engine start again on the same node), and no other node's
    /// engine started meanwhile.
    pub fn assert_kept(&self, node: &str, log_before: &str) {
        self.wait_leader(node);
        let after = self.engine_log();
        let elsewhere: Vec<&str> = after[log_before.len().min(after.len())..]
            .lines()
            .filter(|l| l.split_whitespace().next() != Some(node))
            .collect();
        assert!(
            after.starts_with(log_before) && elsewhere.is_empty(),
            "the engine was started elsewhere than on {node}: {elsewhere:?} (log before {log_before:?}, after {after:?})\n{}",
            self.logs()
        );
    }

    /// Waits until the engine runs on exactly one node; returns it.
    pub fn wait_any_leader(&self) -> String {
        self.wait("one leader", |c| c.running_engines().len() == 1);
        self.running_engines()[0].clone()
    }

    pub fn assert_no_overlap(&self) {
        let overlap = std::fs::read_to_string(self.shared.join("overlap")).unwrap_or_default();
        assert!(
            overlap.is_empty(),
            "two engines ran at once: {overlap}\n{}",
            self.logs()
        );
    }

    /// Everyone's sup-lease and supd logs, for a failure.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            for e in std::fs::read_dir(&n.sb.dir).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("lease-") && name.ends_with(".log") {
                    out += &format!(
                        "--- {} {name}\n{}",
                        n.name,
                        std::fs::read_to_string(e.path()).unwrap_or_default()
                    );
                }
            }
        }
        out
    }

    pub fn status_text(&self) -> String {
        let out = Command::new(SUP_LEASE)
            .args(["--lease", "engine", "--store", &self.store, "status"])
            .args(&self.lease_args)
            .output()
            .expect("status");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn policy(&self, words: &[&str]) -> std::process::Output {
        Command::new(SUP_LEASE)
            .args(["--lease", "engine", "--store", &self.store, "policy"])
            .args(&self.lease_args)
            .args(words)
            .output()
            .expect("policy")
    }

    pub fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|n| n.name == name).expect("node")
    }
}

fn unix_now() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

impl Node {
    pub fn install(&self, version: &str, crash: bool) {
        self.sb.install_version(version, agent_body(crash));
    }

    /// `upgrade --wait`; `ok` says whether it must commit.
    pub fn upgrade(&self, version: &str, ok: bool) {
        self.sb.upgrade_wait(version, ok);
    }

    /// Ends this node's sup-lease with `sig` (KILL: no goodbye).
    pub fn signal_lease(&mut self, sig: nix::sys::signal::Signal) {
        if let Some(c) = self.lease.as_ref() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
        }
    }

    /// Ends this node's sup-lease with `sig` and waits for it: the node has none after.
    pub fn end_lease(&mut self, sig: nix::sys::signal::Signal) {
        self.signal_lease(sig);
        if let Some(mut l) = self.lease.take() {
            let _ = l.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.lease.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
