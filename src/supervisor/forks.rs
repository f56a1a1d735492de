//! Services' children asked of the spawner and not answered yet: the coordinator's side
//! (what is kept for each is the starts part's, `starts.rs`).
//!
//! A service's spawn is two steps: its plan goes to the spawner's queue
//! (`spawner::begin_service`), and when the answer (the child's pid) is read in the loop,
//! the child is recorded and released ([`Supervisor::release_child`]). In between the
//! service is still pending (`stopped`, wanted up) but marked as forking, so it is not
//! asked for twice; clients, signals and exits are served meanwhile.
//!
//! Anything that happens to the service in between (a stop, a restart, a reload, an
//! upgrade: any event of its machine), a shutdown or a reexec drops its request: the
//! child, if the spawner made it, reads end-of-file instead of its go-ahead and exits
//! without running anything (it is reaped as any unknown child). An answer is taken
//! only while the service could still be started then, as at its request.

use super::{pid_file_of, Supervisor};
use crate::instance::Instance;
use crate::service::Event;
use crate::starts::Forking;
use crate::sys;
use crate::time::Mono;

impl Supervisor {
    /// Reads the spawner's answers (or learns it is gone) and releases the children
    /// still wanted.
    pub fn on_spawner(&mut self, now: Mono) {
        for (ticket, answer) in crate::spawner::answers(now) {
            let Some(f) = self.starts.answered(ticket) else {
                continue;
            };
            let name = f.name.clone();
            let ours = match self.slots.get_mut(&name) {
                // Touched: a service still pending is looked at by the next pass.
                Some(slot) if slot.forking == Some(ticket) => {
                    slot.forking = None;
                    true
                }
                _ => false,
            };
            match answer {
                // The spawner went away: asked again (of supd's own fork) by the next
                // pass, if it is still to start.
                None => {}
                Some(Err(e)) if ours => {
                    self.apply(&name, Event::SpawnFailed(format!("fork: {e}")), now)
                }
                Some(Err(_)) => {}
                Some(Ok(pid)) if ours && self.may_start(&name) => {
                    self.release_child(f, pid, now)
                }
                // Called off meanwhile (`drop_fork`), or no longer to start (what it
                // waits for went down, its lease is gone: the next pass decides again).
                Some(Ok(pid)) => log::info!(
                    "{name}: its start was called off: child {pid} exits without running its program"
                ),
            }
        }
    }

    /// Calls off a service's start under way, if it has one: the child, once the
    /// spawner has made it, exits without running its program.
    pub(crate) fn drop_fork(&mut self, name: &str) {
        if let Some(slot) = self.slots.get_mut(name) {
            slot.forking = None;
        }
    }

    /// Drops every request under way (shutdown, reexec): their children exit unrun.
    pub(crate) fn drop_forks(&mut self) {
        for f in self.starts.take_forks() {
            self.drop_fork(&f.name);
        }
    }

    /// Records the child `pid` of `f`'s service and lets it go on to its program; it
    /// is `starting` from here. A record that cannot be written (or a guard that cannot
    /// be armed) fails the start: the child exits without running anything.
    pub(crate) fn release_child(&mut self, f: Forking, pid: i32, now: Mono) {
        let Forking {
            name,
            version,
            cgroup,
            leader_only,
            ready,
            pending,
        } = f;
        let state_dir = self.cfg.supd.state_dir.clone();
        // Before its program runs: an OOM kill of this run raises the count past it.
        let oom_at_start = (self.cgroups.as_ref()).and_then(|c| c.oom_kills(&name));
        let Some(slot) = self.slots.get_mut(&name) else {
            return;
        };
        let lease = slot.cfg.leader_only.clone().filter(|_| leader_only);
        let run_lease = lease.clone();
        let kill_mode = slot.cfg.kill_mode;
        let run_cgroup = cgroup.clone();
        let guard_cgroup = cgroup
            .clone()
            .filter(|_| kill_mode == crate::config::KillMode::Cgroup);
        let guard_cgroup = guard_cgroup.as_deref();
        let leases = &mut self.leases;
        let pid_file = match pid_file_of(slot, &state_dir) {
            Ok(f) => f,
            Err(why) => return self.apply(&name, Event::SpawnFailed(why), now),
        };
        let mut instance = None;
        // The child is in its cgroup before it waits for its go-ahead, and the record is
        // written before the go-ahead: a supd killed at any moment leaves nothing a
        // successor cannot find.
        let result = pending.release(pid, |pid| {
            crate::failpoint::hit("spawn-before-record");
            // Before /proc is mounted (an init's first one-shot mounts it) the start time
            // is unknown: 0 records the pid alone, which a later supd never takes for a
            // process with a start time (it then leaves that pid alone).
            let start_time = crate::proc::stat(pid).map(|s| s.start_time).unwrap_or(0);
            pid_file.set_run(pid, start_time, kill_mode).map_err(|e| {
                format!(
                    "cannot record its pid in {}: {e}; not started (a service never runs unrecorded)",
                    state_dir.display()
                )
            })?;
            crate::failpoint::hit("spawn-after-record");
            // With a narrower `kill_mode`, the guard ends the leader (and its group),
            // not what else is in its cgroup.
            let guard = match lease.as_deref().and_then(|l| leases.guard(l, pid, guard_cgroup)) {
                Some(armed) => Some(armed.map_err(|e| {
                    format!("{e}; not started (a leader-only service never runs without it)")
                })?),
                None => None,
            };
            instance = Some(Instance {
                pid,
                start_time,
                cgroup,
                exit: None,
                guard,
                lease: run_lease,
                reaped_at: None,
                kill_mode: Some(kill_mode),
                left_at_exit: 0,
                left_uncounted: false,
                oom_at_start,
                out_of_memory: None,
            });
            Ok(())
        });
        let (ready_pipe, ready_write) = ready.unzip();
        // The child has its copy: end-of-file on the pipe then means it closed it.
        drop(ready_write);
        match result {
            Ok(exec) => {
                if slot.version != version {
                    slot.svc.other_version();
                }
                slot.version = version;
                slot.exec = Some(exec);
                slot.exec_error = None;
                slot.ready_pipe = ready_pipe;
                slot.instance = Some(instance.unwrap_or(Instance {
                    pid,
                    start_time: 0,
                    cgroup: None,
                    exit: None,
                    guard: None,
                    lease: None,
                    reaped_at: None,
                    kill_mode: Some(kill_mode),
                    left_at_exit: 0,
                    left_uncounted: false,
                    oom_at_start: None,
                    out_of_memory: None,
                }));
                // Its exit wakes the loop through the pidfd (kernels from 5.3).
                slot.leader = sys::pidfd_open(pid).ok().map(|fd| (pid, fd));
                self.pids.insert(pid, name.clone());
                self.apply(&name, Event::Spawned(pid), now);
                self.mark_started(&name, pid);
            }
            Err(why) => {
                // Nothing runs: the child exits before its program could. It may have
                // been killed at its birth in a cgroup killed behind supd's back (an
                // operator's `cgroup.kill`, on a kernel that then kills every child
                // forked into it): the next is forked into that cgroup made anew.
                if let Some(dir) = run_cgroup.as_deref() {
                    crate::cgroup::born_dead(dir);
                }
                if let Some(mut i) = instance {
                    i.disarm();
                }
                if let Err(e) = pid_file.set(None) {
                    log::warn!("{name}: cannot clear its pid record: {e}");
                }
                self.apply(&name, Event::SpawnFailed(why), now);
            }
        }
    }
}
