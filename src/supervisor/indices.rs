//! The indices kept for the touched slots (each service's deadline, its fds in the
//! epoll set, the pending services), brought up to date at the end of each turn; debug
//! builds check them against a look at every slot.

use super::*;

impl Supervisor {
    /// Brings the loop's indices (timers, pending starts, the epoll set) up to date with
    /// the slots touched since the last turn, and forgets those: the end of each turn.
    pub fn sync_touched(&mut self) {
        self.note_pending();
        for name in self.slots.take_touched() {
            let Some(slot) = self.slots.get(&name) else {
                self.timers.set(&name, None);
                continue;
            };
            self.timers.set(&name, deadline_of(slot));
            self.fdset.sync(slot.id, &wanted_fds(slot));
        }
        #[cfg(debug_assertions)]
        self.check_indices();
    }

    /// Debug builds: the indices kept for touched slots are what a look at every slot
    /// finds. A change made without touching its slot would be missed by the loop.
    #[cfg(debug_assertions)]
    fn check_indices(&self) {
        use std::os::fd::AsRawFd;
        for (name, slot) in self.slots.iter() {
            assert_eq!(
                self.timers.get(name),
                deadline_of(slot),
                "{name}: its deadline changed without its slot being touched"
            );
            assert!(
                !slot.svc.pending() || self.starts.is_pending(name),
                "{name}: pending without its slot being touched"
            );
            let mut want: Vec<_> = (wanted_fds(slot).iter())
                .map(|(fd, k, f)| (fd.as_raw_fd(), *k, *f))
                .collect();
            let mut held = self.fdset.held(slot.id);
            want.sort();
            held.sort();
            assert_eq!(
                want, held,
                "{name}: its fds changed without its slot being touched"
            );
        }
        assert!(self.timers.len() <= self.slots.len());
        // Every pid in the table is the leader, not reaped yet, of its service's run: a
        // pid left there would never be reaped again, and a shutdown never end.
        for (pid, name) in &self.pids {
            let run = self.slots.get(name).and_then(|s| s.instance.as_ref());
            assert!(
                run.is_some_and(|i| i.pid == *pid && !i.leader_gone()),
                "{name}: pid {pid} is in the pid table but is no unreaped leader of its run ({run:?})"
            );
        }
        // Whatever may start was started, unless the pass stopped at its limit, or at a
        // full spawner queue: then the next pass (woken by the spawner's answers) looks
        // at it again.
        if self.shutdown.is_none() && !self.starts.more_to_start() {
            let left = self.startable(self.starts.pending(), &BTreeSet::new(), 1);
            let carried = !crate::spawner::room() && left.iter().all(|n| self.starts.carried(n));
            assert!(
                left.is_empty() || carried,
                "{left:?}: startable but not started"
            );
        }
    }
}

/// A slot's earliest deadline: its machine's, and its checks' while they run.
fn deadline_of(slot: &Slot) -> Option<Mono> {
    slot.svc
        .deadline
        .into_iter()
        .chain(slot.health.deadline())
        .min()
}

/// The fds of a slot to watch: output, readiness, notify, exec report, health check,
/// leader pidfd, stored fds.
fn wanted_fds(s: &Slot) -> Vec<crate::fdset::Wanted<'_>> {
    use nix::sys::epoll::EpollFlags;
    let input = EpollFlags::EPOLLIN;
    let mut out = Vec::new();
    if let Some(o) = &s.output {
        out.extend(o.fd(false).map(|fd| (fd, ServiceFd::Output, input)));
        out.extend(o.fd(true).map(|fd| (fd, ServiceFd::OutputErr, input)));
    }
    out.extend(
        s.ready_pipe
            .as_ref()
            .map(|r| (r.as_fd(), ServiceFd::Ready, input)),
    );
    out.extend(s.notify.fd().map(|fd| (fd, ServiceFd::Notify, input)));
    out.extend(
        s.exec
            .as_ref()
            .map(|e| (e.report.as_fd(), ServiceFd::Exec, input)),
    );
    if let Some((fd, flags)) = s.health.poll_fd() {
        out.push((fd, ServiceFd::Health, crate::fdset::epoll_flags(flags)));
    }
    out.extend(
        s.leader
            .as_ref()
            .map(|(_, fd)| (fd.as_fd(), ServiceFd::Leader, input)),
    );
    // Only a hang-up or an error (which epoll always reports) wakes the loop for them.
    out.extend((s.kept.watched()).map(|fd| (fd, ServiceFd::Stored, EpollFlags::empty())));
    out
}
