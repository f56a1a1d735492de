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
    fn drop(&mut self) {
        let _ = fs::write(self.0.join("freezer.state"), "THAWED");
        let _ = fs::remove_dir(&self.0);
    }
}
