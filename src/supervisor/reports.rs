//! What a service's child reports: its exec (or why it could not exec, and as which
//! user), and readiness on an `fd:N` pipe.

use super::*;

impl Supervisor {
    /// What a start refused for want of permission says: which path, which user, the
    /// first directory or file on the way that refuses it (as the child found it, as its
    /// user, when it was refused), and what to do. Such a start is not retried and
    /// counts as no crash (a version is never marked bad for it): the service is
    /// `failed` until an operator mends it and starts it.
    pub(super) fn denied_reason(name: &str, why: &str) -> String {
        format!(
            "cannot start: permission denied: {why}; a permission problem, not a crash: it is \
             not retried and no version is marked bad; fix it, then supctl start {name}"
        )
    }

    /// Reads the report of a service's exec.
    pub fn on_exec_report(&mut self, name: &str, now: Mono) {
        if self.slots.get_mut(name).is_some_and(read_exec_report) {
            self.apply(name, Event::Execd, now);
        }
    }

    /// Reads a service's `fd:N` readiness pipe: a newline means ready.
    pub fn on_ready_pipe(&mut self, name: &str, now: Mono) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        let Some(fd) = slot.ready_pipe.as_ref() else {
            return;
        };
        let mut buf = [0u8; 512];
        match nix::unistd::read(fd, &mut buf) {
            Ok(0) => slot.ready_pipe = None,
            Ok(n) if buf[..n].contains(&b'\n') => {
                slot.ready_pipe = None;
                self.apply(name, Event::Ready, now);
            }
            Ok(_) | Err(_) => {}
        }
    }
}

/// Reads what a service's child reported of its exec, if it has: true once its program
/// runs; an error is kept for when the child is reaped (it exits with 127 after
/// reporting).
pub(super) fn read_exec_report(slot: &mut Slot) -> bool {
    let Some(exec) = slot.exec.as_mut() else {
        return false;
    };
    let outcome = exec.outcome();
    if let Some(took) = exec.took() {
        slot.ran_as = Some(Box::new(took));
    }
    if let Some(e) = exec.cgroup_refused() {
        if let Some(dir) = slot.instance.as_mut().and_then(|i| i.cgroup.take()) {
            log::warn!(
                "{}: cannot move it into {}: {e}; it runs in its process group only",
                slot.cfg.name,
                dir.display()
            );
        }
    }
    match outcome {
        None => false,
        Some(Ok(())) => {
            slot.exec = None;
            true
        }
        Some(Err(failure)) => {
            slot.exec = None;
            slot.exec_error = Some(failure);
            false
        }
    }
}
