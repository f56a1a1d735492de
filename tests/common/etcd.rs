//! A real etcd (Debian's etcd-server) for one test: free loopback ports, a temp data dir,
//! ready when it says so in its log (no polling), ended by its pid.
#![allow(dead_code)]

use super::*;
use std::io::BufRead;
use std::process::Child;
use std::sync::mpsc;

/// etcd as the one member `t1` of a new cluster: its data in `data`, serving clients at
/// `url` and its peer at `peer_url` (quick elections: a heartbeat of 25 ms).
pub fn one_member(data: &Path, url: &str, peer_url: &str) -> Command {
    let mut cmd = Command::new("etcd");
    cmd.args(["--name", "t1", "--data-dir"])
        .arg(data)
        .args(["--listen-client-urls", url, "--advertise-client-urls", url])
        .args([
            "--listen-peer-urls",
            peer_url,
            "--initial-advertise-peer-urls",
            peer_url,
        ])
        .args([
            "--initial-cluster",
            &format!("t1={peer_url}"),
            "--initial-cluster-state",
            "new",
        ])
        .args(["--heartbeat-interval", "25", "--election-timeout", "250"]);
    cmd
}

/// Copies what etcd `child` (spawned with its stderr piped) logs to `log`, in a thread;
/// the channel says when etcd is ready to serve client requests.
pub fn copy_log_until_ready(child: &mut Child, log: Option<std::fs::File>) -> mpsc::Receiver<()> {
    let stderr = child.stderr.take().expect("etcd stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut log = log;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(f) = log.as_mut() {
                let _ = std::io::Write::write_all(f, format!("{line}\n").as_bytes());
            }
            if line.contains("ready to serve client requests") {
                let _ = tx.send(());
            }
        }
    });
    rx
}

pub struct Etcd {
    child: Child,
    pub url: String,
    pub dir: Sandbox,
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Whether etcd is on PATH; outside CI a missing one is said (the test skips), in CI
/// it is a failure (`.ci/run` installs it).
pub fn installed() -> bool {
    if Command::new("etcd").arg("--version").output().is_ok() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "etcd is missing: .ci/run installs etcd-server"
    );
    eprintln!("skipped: etcd is not installed (apt-get install etcd-server)");
    false
}

impl Etcd {
    /// Starts etcd, or returns `None` (said) when it is not installed outside CI.
    pub fn start() -> Option<Etcd> {
        Etcd::start_with("http", &[])
    }

    /// Starts etcd serving its clients over `scheme` (`http` or `https`), with more
    /// arguments (its certificates, say).
    pub fn start_with(scheme: &str, extra: &[String]) -> Option<Etcd> {
        if !installed() {
            return None;
        }
        let dir = Sandbox::new();
        let (client, peer) = (free_port(), free_port());
        let url = format!("{scheme}://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut child = one_member(&dir.path("data"), &url, &peer_url)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start etcd");
        let rx = copy_log_until_ready(&mut child, std::fs::File::create(dir.path("etcd.log")).ok());
        let mut etcd = Etcd { child, url, dir };
        if rx.recv_timeout(DEADLINE).is_err() {
            let log = std::fs::read_to_string(etcd.dir.path("etcd.log")).unwrap_or_default();
            let _ = etcd.child.kill();
            panic!("etcd did not become ready within {DEADLINE:?}:\n{log}");
        }
        Some(etcd)
    }

    pub fn store(&self) -> String {
        format!("etcd:{}", self.url)
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) etcd: unreachable, then back with its data.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig)
            .expect("signal etcd");
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
