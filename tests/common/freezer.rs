//! A cgroup v1 freezer holds a SIGKILLed process alive until it is thawed: a member of a
//! service's run that is slow to die, deterministically.

use std::fs;
use std::path::PathBuf;

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
