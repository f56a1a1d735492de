//! A cgroup v1 freezer holds a SIGKILLed process alive until it is thawed: a member of a
//! service's run that is slow to die, deterministically.

use nix::sys::signal::Signal;
use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub struct Freezer(PathBuf);

impl Freezer {
    /// A freezer cgroup of the test's own, where the machine has the v1 freezer.
    pub fn new(tag: u64) -> Option<Freezer> {
        let dir = PathBuf::from(format!("/sys/fs/cgroup/freezer/sup-test-{tag}"));
        fs::create_dir_all(&dir).ok()?;
        Some(Freezer(dir))
    }

    pub fn freeze(&self, pid: i32) {
        fs::write(self.0.join("cgroup.procs"), pid.to_string()).expect("join freezer");
        fs::write(self.0.join("freezer.state"), "FROZEN").expect("freeze");
    }

    pub fn thaw(&self) {
        fs::write(self.0.join("freezer.state"), "THAWED").expect("thaw");
    }
}

impl Drop for Freezer {
    /// Thaws, ends what the test froze (by pid: only its own processes are ever moved
    /// here) and waits for each to go before removing the cgroup, which the kernel
    /// refuses while a member lives.
    fn drop(&mut self) {
        let _ = fs::write(self.0.join("freezer.state"), "THAWED");
        let pids: Vec<i32> = fs::read_to_string(self.0.join("cgroup.procs"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = super::wait_exit(pid, super::DEADLINE);
        }
        let _ = fs::remove_dir(&self.0);
    }
}

/// The processes a test froze: thawed and SIGKILLed by pid (while the pid is still the
/// process frozen) when the test ends, even when it fails, and waited for.
pub struct Frozen {
    freezer: Freezer,
    pids: Vec<(i32, u64)>,
}

impl Frozen {
    /// `None` where it cannot be (not root, no v1 freezer): the test says it skipped.
    pub fn new(sb: &super::Sandbox) -> Option<Frozen> {
        if !super::is_root() {
            return None;
        }
        Some(Frozen {
            freezer: Freezer::new(sb.tag)?,
            pids: Vec::new(),
        })
    }

    /// Freezes `pid` and returns once /proc says it is (FREEZING, then FROZEN: D).
    pub fn freeze(&mut self, pid: i32) {
        let start = sup::proc::stat(pid)
            .expect("the process to freeze")
            .start_time;
        self.pids.push((pid, start));
        self.freezer.freeze(pid);
        let end = Instant::now() + super::DEADLINE;
        while sup::proc::stat(pid).is_some_and(|s| s.state != 'D') {
            assert!(Instant::now() < end, "pid {pid} did not freeze");
            std::thread::sleep(Duration::from_millis(5)); // /proc has no event to wait on
        }
    }

    pub fn thaw(&self) {
        self.freezer.thaw();
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        self.freezer.thaw();
        for (pid, start) in &self.pids {
            sup::proc::kill_if_same(*pid, *start, Signal::SIGKILL);
            let _ = super::wait_exit(*pid, Duration::from_secs(5));
        }
    }
}

/// What supd gives a SIGKILLed process to die before it says it cannot (the bound of
/// `stop` and of a shutdown beyond their timeouts), with room for a loaded machine.
pub const KILL_BOUND: Duration = Duration::from_secs(5);
pub const SLACK: Duration = Duration::from_secs(4);

/// The `pid` of a status.
pub fn pid_of(v: &serde_json::Value) -> i32 {
    v["pid"].as_i64().expect("a pid") as i32
}

/// Asks `status` until `pred` holds, within `within`; the last status if it never did.
pub fn status_within(
    sb: &super::Sandbox,
    service: &str,
    within: Duration,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Result<serde_json::Value, serde_json::Value> {
    let end = Instant::now() + within;
    loop {
        let s = sb.status(service);
        if pred(&s) {
            return Ok(s);
        }
        if Instant::now() >= end {
            return Err(s);
        }
        std::thread::sleep(Duration::from_millis(20)); // a poll of status, bounded above
    }
}
