//! A three-member etcd cluster on loopback: each member its own data dir and client and
//! peer ports on 127.0.0.1, ready when its log says so (no polling), killed and restarted
//! on its data, stopped and continued, and ended by its pid.

use crate::common::etcd::{copy_log_until_ready, free_port};
use crate::common::{Sandbox, DEADLINE};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub struct Member {
    pub name: String,
    pub client: String,
    pub peer: String,
    pub data: PathBuf,
    pub log: PathBuf,
    pub child: Option<Child>,
    pub stopped: bool,
}

pub struct Etcd3 {
    pub members: Vec<Member>,
    initial: String,
    /// The cluster's token: a new one after a wipe makes a new cluster id (a replaced
    /// store); the same one makes the same cluster, empty (a wiped one).
    token: String,
    pub dir: Sandbox,
    pub starts: usize,
}

impl Etcd3 {
    /// Starts the three members at once and waits until each serves clients; `None`
    /// (said) when etcd is not installed outside CI.
    pub fn start() -> Option<Etcd3> {
        if !crate::common::etcd::installed() {
            return None;
        }
        let dir = Sandbox::new();
        let members: Vec<Member> = (1..=3)
            .map(|i| Member {
                name: format!("m{i}"),
                client: format!("http://127.0.0.1:{}", free_port()),
                peer: format!("http://127.0.0.1:{}", free_port()),
                data: dir.path(&format!("m{i}.data")),
                log: dir.path(&format!("m{i}.log")),
                child: None,
                stopped: false,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut e = Etcd3 {
            members,
            initial,
            token: "sup-lease-faults".into(),
            dir,
            starts: 0,
        };
        let ready: Vec<_> = (0..3).map(|i| e.spawn(i)).collect();
        for (i, rx) in ready.into_iter().enumerate() {
            e.await_ready(i, rx);
        }
        Some(e)
    }

    /// Starts member `i` (on its data dir, if it has one) and returns the channel that
    /// says it is ready.
    fn spawn(&mut self, i: usize) -> mpsc::Receiver<()> {
        self.starts += 1;
        let m = &mut self.members[i];
        let mut child = Command::new("etcd")
            .args(["--name", &m.name, "--data-dir"])
            .arg(&m.data)
            .args(["--listen-client-urls", &m.client])
            .args(["--advertise-client-urls", &m.client])
            .args(["--listen-peer-urls", &m.peer])
            .args(["--initial-advertise-peer-urls", &m.peer])
            .args(["--initial-cluster", &self.initial])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token])
            // A TTL of 1 s needs an election timeout of at most 2/3 s (etcd's minimum
            // lease TTL is 1.5 election timeouts).
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start etcd");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .ok();
        let rx = copy_log_until_ready(&mut child, log);
        m.child = Some(child);
        m.stopped = false;
        rx
    }

    fn await_ready(&mut self, i: usize, rx: mpsc::Receiver<()>) {
        if rx.recv_timeout(DEADLINE).is_err() {
            let log = std::fs::read_to_string(&self.members[i].log).unwrap_or_default();
            panic!(
                "etcd member {} did not become ready within {DEADLINE:?}:\n{log}",
                self.members[i].name
            );
        }
    }

    /// kill -9 of member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data and waits until it serves clients.
    pub fn restart(&mut self, i: usize) {
        let rx = self.spawn(i);
        self.await_ready(i, rx);
    }

    /// The store wiped: every member killed, its data dir deleted, and the cluster started
    /// again empty on the same ports, as the same cluster (`replace` false: its revision
    /// starts again at 1) or as a new one (a new token, so a new cluster id). Waits until
    /// every member serves clients.
    pub fn wipe(&mut self, replace: bool) {
        for i in 0..self.members.len() {
            self.kill(i);
            let _ = std::fs::remove_dir_all(&self.members[i].data);
        }
        if replace {
            self.token = format!("sup-lease-faults-{}", self.starts);
        }
        let ready: Vec<_> = (0..self.members.len()).map(|i| self.spawn(i)).collect();
        for (i, rx) in ready.into_iter().enumerate() {
            self.await_ready(i, rx);
        }
    }

    /// SIGSTOP (`false`) or SIGCONT (`true`) of member `i`.
    pub fn pause(&mut self, i: usize, resume: bool) {
        let m = &mut self.members[i];
        if let Some(c) = m.child.as_ref() {
            let sig = if resume {
                nix::sys::signal::Signal::SIGCONT
            } else {
                nix::sys::signal::Signal::SIGSTOP
            };
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
            m.stopped = !resume;
        }
    }

    /// The member that leads the raft now, as the members that answer see it.
    pub fn leader(&self) -> Option<usize> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_millis(500)))
            .http_status_as_error(false)
            .build()
            .into();
        for m in self
            .members
            .iter()
            .filter(|m| m.child.is_some() && !m.stopped)
        {
            let Ok(mut r) = agent
                .post(format!("{}/v3/maintenance/status", m.client))
                .header("content-type", "application/json")
                .send("{}")
            else {
                continue;
            };
            let Ok(text) = r.body_mut().read_to_string() else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
                continue;
            };
            let leader = v["leader"].as_str().unwrap_or("");
            if leader.is_empty() {
                continue;
            }
            // Ask each member for its own id, to name the leader.
            for (j, n) in self.members.iter().enumerate() {
                if n.child.is_none() || n.stopped {
                    continue;
                }
                let id = agent
                    .post(format!("{}/v3/maintenance/status", n.client))
                    .header("content-type", "application/json")
                    .send("{}")
                    .ok()
                    .and_then(|mut r| r.body_mut().read_to_string().ok())
                    .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                    .and_then(|v| v["header"]["member_id"].as_str().map(String::from));
                if id.as_deref() == Some(leader) {
                    return Some(j);
                }
            }
        }
        None
    }
}

impl Drop for Etcd3 {
    /// Every member killed by its pid (SIGKILL works on a stopped one; a member that
    /// lost quorum may take seconds to exit on SIGTERM).
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
