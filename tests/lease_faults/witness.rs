//! The witness: a Unix socket every engine connects to as it starts, so that each run of
//! an engine on any node becomes an interval on CLOCK_BOOTTIME (one host, one clock).
//!
//! A run starts at the engine's first instant (before it connects and tries the lock). It
//! ends when the engine says `stop` (after it unlocked, on SIGTERM), or, when it was
//! killed, at the moment this side reads the end of its connection: the kernel closes it
//! as the process dies, so the recorded end is never before the real one. Every interval
//! therefore covers the whole time the engine could act; an overlap of two is two engines
//! alive at once. An engine that serves also says `ready`: from then to its end it served
//! (a version that hangs never says it).

use crate::native::boot;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

#[derive(Clone, Debug)]
pub struct Run {
    pub node: String,
    pub term: String,
    pub pid: i32,
    pub start: f64,
    /// The exclusive flock was taken; false is an overlap by itself.
    pub locked: bool,
    pub end: Option<f64>,
    /// How it ended: said `stop` (graceful), or its connection closed (killed).
    pub graceful: bool,
    /// The engine's version (`SUP_VERSION`).
    pub version: String,
    /// When it said it was ready (a crashing or hanging version never does): from then
    /// to its end it served, which is what the downtime of an upgrade is measured on.
    pub ready: Option<f64>,
}

pub struct Witness {
    pub path: PathBuf,
    pub runs: Arc<Mutex<Vec<Run>>>,
    /// Rung at every line an engine tells, for a wait on what the runs show.
    bell: Arc<Condvar>,
}

impl Witness {
    pub fn listen(path: &Path) -> Witness {
        let listener = UnixListener::bind(path).expect("bind the witness socket");
        let runs: Arc<Mutex<Vec<Run>>> = Arc::default();
        let bell: Arc<Condvar> = Arc::default();
        let (r, b) = (runs.clone(), bell.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (runs, bell) = (r.clone(), b.clone());
                std::thread::spawn(move || follow(conn, runs, bell));
            }
        });
        Witness {
            path: path.to_path_buf(),
            runs,
            bell,
        }
    }

    /// Waits, up to `wait`, until `done` holds of the runs (looked at each time an
    /// engine tells something); whether it did.
    pub fn wait_for(&self, wait: std::time::Duration, done: impl Fn(&[Run]) -> bool) -> bool {
        let end = std::time::Instant::now() + wait;
        let mut runs = self.runs.lock().expect("runs");
        loop {
            if done(&runs) {
                return true;
            }
            let left = end.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            runs = self.bell.wait_timeout(runs, left).expect("runs").0;
        }
    }

    pub fn runs(&self) -> Vec<Run> {
        self.runs.lock().expect("runs").clone()
    }

    /// The nodes whose engine is alive now (a run that has not ended).
    pub fn alive(&self) -> Vec<String> {
        self.runs()
            .into_iter()
            .filter(|r| r.end.is_none())
            .map(|r| r.node)
            .collect()
    }

    /// The nodes whose engine is alive and ready now.
    pub fn serving(&self) -> Vec<String> {
        self.runs()
            .into_iter()
            .filter(|r| r.end.is_none() && r.ready.is_some())
            .map(|r| r.node)
            .collect()
    }

    /// The pid of `node`'s live engine, if one runs.
    pub fn engine_pid(&self, node: &str) -> Option<i32> {
        self.runs()
            .into_iter()
            .rev()
            .find(|r| r.end.is_none() && r.node == node)
            .map(|r| r.pid)
    }
}

impl Drop for Witness {
    /// Ends every engine still alive, by its pid: its connection is open, so the pid is
    /// still that engine's (the kernel closes the connection when the process dies).
    fn drop(&mut self) {
        for r in self.runs() {
            if r.end.is_none() && r.pid > 1 {
                let pid = nix::unistd::Pid::from_raw(r.pid);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
            }
        }
    }
}

fn follow(conn: std::os::unix::net::UnixStream, runs: Arc<Mutex<Vec<Run>>>, bell: Arc<Condvar>) {
    let mut index = None;
    let mut lines = BufReader::new(conn).lines();
    loop {
        let line = lines.next();
        let now = boot();
        let mut runs = runs.lock().expect("runs");
        bell.notify_all();
        match line {
            Some(Ok(l)) => {
                let w: Vec<&str> = l.split_whitespace().collect();
                match (w.first(), index) {
                    (Some(&"start"), None) if w.len() == 8 => {
                        runs.push(Run {
                            node: w[1].to_string(),
                            term: w[2].to_string(),
                            pid: w[3].parse().unwrap_or(0),
                            start: w[4].parse().unwrap_or(now),
                            locked: w[6] == "1",
                            end: None,
                            graceful: false,
                            version: w[7].to_string(),
                            ready: None,
                        });
                        index = Some(runs.len() - 1);
                    }
                    (Some(&"ready"), Some(i)) if w.len() == 2 => {
                        runs[i].ready = Some(w[1].parse().unwrap_or(now));
                    }
                    (Some(&"stop"), Some(i)) if w.len() == 2 => {
                        runs[i].end = Some(w[1].parse().unwrap_or(now));
                        runs[i].graceful = true;
                    }
                    _ => eprintln!("witness: an unexpected line: {l}"),
                }
            }
            _ => {
                if let Some(i) = index {
                    if runs[i].end.is_none() {
                        runs[i].end = Some(now);
                    }
                }
                return;
            }
        }
    }
}
