//! Reaping, in one place: the children a SIGCHLD or a leader's pidfd tells of, a scan
//! of all children owed within a second, and the runs that drain (their leader reaped,
//! other processes of theirs left) until their last process is gone.

use super::reports::read_exec_report;
use super::*;

impl Supervisor {
    /// SIGCHLD, which told of `from`. A service's leader watched through its pidfd is
    /// reaped when that is readable; check commands and helper tasks under way are
    /// looked at by pid. Anything else (the log writer, the spawner, dead-man guards,
    /// adopted orphans, leaders on kernels without pidfds) is found by a scan of every
    /// child, which the kernel makes by walking all of them: so when the signal told of
    /// a leader, check or task, the scan is not made now but owed within a second, as
    /// that one signal may stand for other exits too (the kernel folds a SIGCHLD into
    /// one still pending).
    pub fn on_sigchld(&mut self, from: Option<i32>, now: Mono) {
        let watched = |p: i32| {
            self.pids
                .get(&p)
                .and_then(|n| self.slots.get(n))
                .is_some_and(|s| s.leader.as_ref().is_some_and(|(l, _)| *l == p))
        };
        // A watched leader, a check command or a task: found by pid, not by a scan.
        let known = from
            .is_some_and(|p| watched(p) || self.check_pids.contains(p) || self.tools.is_task(p));
        if known {
            self.scan_owed.get_or_insert(now.plus(SCAN_OWED));
            // What else it may stand for and cannot wait a second is looked at by pid
            // now: a check command (its timeout runs: found late, it would be taken for
            // timed out) and a helper task (a client waits for it). Their number is
            // that of checks and tasks under way, not of services.
            let others: Vec<i32> = (self.check_pids.pids())
                .chain(self.tools.task_pids())
                .collect();
            for pid in others {
                self.reap_id(Some(pid), now);
            }
        } else {
            self.reap(now);
        }
    }

    /// A service's leader pidfd is readable: its leader has exited (or was reaped).
    pub fn on_leader_exit(&mut self, name: &str, now: Mono) {
        let Some(pid) = self
            .slots
            .get(name)
            .and_then(|s| s.leader.as_ref())
            .map(|l| l.0)
        else {
            return;
        };
        self.reap_id(Some(pid), now);
    }

    /// Owes a scan of all children now: a new image (`reexec`) is not told of what exited
    /// around its exec. A SIGCHLD pending then does cross the exec, but the new image's
    /// reset of dispositions (`sys::reset_dispositions`) discards it: SIGCHLD's default
    /// action is to be ignored, and the kernel drops a pending signal whose action
    /// becomes "ignored". A leader is still found by its pidfd; an adopted orphan, a
    /// guard or a task is found only by a scan.
    pub(crate) fn owe_scan_now(&mut self, now: Mono) {
        self.scan_owed = Some(now);
    }

    /// When a scan of all children is owed (`Some(now)`: a scan was cut at its time).
    pub(crate) fn scan_owed_now(&self) -> Option<Mono> {
        self.scan_owed
    }

    /// Reaps every exited child: services' and adopted orphans'.
    pub fn reap(&mut self, now: Mono) {
        self.scan_owed = None;
        self.reap_id(None, now);
    }

    /// Reaps the exited children: `only` that one, or all. A service's leader is looked
    /// at before it is reaped (`WNOWAIT`): its group and cgroup are killed while the
    /// zombie still holds its pid, so no other process can be signalled by mistake.
    pub(super) fn reap_id(&mut self, only: Option<i32>, now: Mono) {
        let began = Mono::now();
        loop {
            // A scan that finds hundreds (a storm, found by the owed scan) goes on at
            // the next turn, at once: clients and signals are served in between.
            if only.is_none() && Mono::now().since(began) >= SCAN_TIME {
                self.scan_owed = Some(now);
                break;
            }
            let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
            let id = match only {
                Some(p) => Id::Pid(nix::unistd::Pid::from_raw(p)),
                None => Id::All,
            };
            let pid = match waitid(id, flags) {
                Ok(status) => match status.pid() {
                    Some(p) => p,
                    None => break,
                },
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::ECHILD) => break,
                Err(e) => {
                    log::warn!("waitid: {e}");
                    break;
                }
            };
            if let Some(name) = self.check_pids.name_of(pid.as_raw()) {
                // What is left of a check goes with it; its zombie still holds the pid,
                // so the group is the check's own. Its cgroup holds what left the group,
                // unless another run of the check is in it already.
                let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
                let alone = self.check_pids.alone(pid.as_raw());
                if let Some(c) = self.cgroups.as_ref().filter(|_| alone) {
                    cgroup::kill(&c.check_dir(name));
                }
            }
            let service = self.pids.get(&pid.as_raw()).cloned();
            let (mut others, mut uncounted, mut count_after) = (0, false, false);
            if let Some(slot) = service.as_ref().and_then(|n| self.slots.get(n)) {
                if let Some(i) = slot.instance.as_ref() {
                    // A leader that exits while it runs and leaves others of its run may
                    // have daemonized: they are counted before they are killed, where
                    // the zombie leader can be told from them (a cgroup, or its session
                    // found below supd); where only its process group is known, after
                    // (`group_left`).
                    if matches!(slot.svc.state, State::Starting | State::Running) {
                        match i.others(&self.pids) {
                            Some(n) => others = n,
                            None => count_after = true,
                        }
                    }
                    // Whatever is left of its run (as `kill_mode` says) goes with it: no
                    // remnant of one instance may overlap the next.
                    i.kill_all(&self.pids);
                }
            }
            let exit = match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => Exit::Code(code),
                Ok(WaitStatus::Signaled(_, sig, _)) => Exit::Signal(sig as i32),
                Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    log::warn!("waitpid {pid}: {e}");
                    break;
                }
            };
            if count_after {
                (others, uncounted) = self.group_left(pid);
            }
            let pid = pid.as_raw();
            if let Some(task) = self.tools.take_task(pid) {
                self.task_done(task, exit, now);
                continue;
            }
            if self.check_pids.contains(pid) {
                self.check_reaped(pid, exit, now);
                continue;
            }
            let Some(name) = self.pids.remove(&pid) else {
                if !self.guard_died(pid) {
                    log::debug!("reaped orphan {pid} ({exit})");
                }
                continue;
            };
            let mut execd = false;
            let how = if only.is_some() {
                "by its pidfd"
            } else {
                "in a scan of all children"
            };
            log::debug!("{name}: reaped its leader {pid} ({exit}) {how}");
            // What it sent before it exited is read while it is still the service's
            // process: an `FDSTORE=1` just before an exit is the common case.
            if self
                .slots
                .get(&name)
                .is_some_and(|s| s.notify.fd().is_some())
            {
                self.on_notify(&name, now);
            }
            match self.slots.get_mut(&name) {
                Some(slot) => {
                    slot.ready_pipe = None;
                    slot.leader = None;
                    // The child is gone: what it reported is all there is to read. A
                    // program that ran, however briefly, was running.
                    execd = read_exec_report(slot);
                    // Killed before its program ran: perhaps at its birth, in a cgroup
                    // killed behind supd's back (`cgroup::fit_to_be_born_in`).
                    if !execd && exit == Exit::Signal(libc::SIGKILL) {
                        if let Some(dir) = slot.instance.as_ref().and_then(|i| i.cgroup.as_deref())
                        {
                            cgroup::born_dead(dir);
                        }
                    }
                    match slot.instance.as_mut() {
                        Some(i) => {
                            (i.exit, i.reaped_at) = (Some(exit), Some(now));
                            (i.left_at_exit, i.left_uncounted) = (others, uncounted);
                        }
                        None => {
                            slot.instance = Some(Instance {
                                pid,
                                start_time: 0,
                                cgroup: None,
                                exit: Some(exit),
                                guard: None,
                                lease: None,
                                reaped_at: Some(now),
                                kill_mode: Some(slot.cfg.kill_mode),
                                left_at_exit: others,
                                left_uncounted: uncounted,
                                oom_at_start: None,
                                out_of_memory: None,
                            })
                        }
                    }
                    // Killed by the kernel's OOM killer: its memory cgroup counted a
                    // kill since the run started. Not only when the leader was the one
                    // killed: a shell whose child was killed exits 137, a server whose
                    // worker was killed exits 1, and the cause is the same.
                    if let (Some(c), Some(i)) = (self.cgroups.as_ref(), slot.instance.as_mut()) {
                        if exit != Exit::Code(0) {
                            i.out_of_memory =
                                out_of_memory(c, &name, i.oom_at_start, &slot.cfg.resources);
                        }
                    }
                    self.draining.insert(name.clone());
                }
                None => log::debug!("{name}: reaped {pid} ({exit}) of a service that is gone"),
            }
            self.mark_exited(&name, pid, exit, now);
            if execd {
                self.apply(&name, Event::Execd, now);
            }
        }
        self.check_draining(now);
    }

    /// How many processes were left in the process group `pgid` of a leader just
    /// reaped, for a run tracked by its process group alone (`subtree.rs`), and whether
    /// that is a lower bound. Its zombie counted as a member of the group, so the group
    /// could not be told empty before the reap: the count, which `reap_id` otherwise
    /// makes before the kill, comes after the kill and the reap here, so that the group
    /// is still killed while the zombie holds its id (the kill is what must not reach
    /// another group; a count that might is only a word in `status`). Each of supd's
    /// zombies in the group is reaped: one the kill ended was a process left; one that
    /// ended by itself before was not (a child the leader never waited for). Members
    /// still dying, or not supd's children, are there while `killpg(pgid, 0)` finds
    /// them: then the count is a lower bound, and at least one.
    fn group_left(&mut self, pgid: nix::unistd::Pid) -> (u32, bool) {
        let mut killed: u32 = 0;
        loop {
            let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
            let pid = match waitid(Id::PGid(pgid), flags) {
                Ok(status) => match status.pid() {
                    Some(p) => p,
                    None => break,
                },
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
            };
            // Not in the group of another run's leader nor of a helper; looked at first
            // all the same, as what is reaped here is not told to anything else.
            let raw = pid.as_raw();
            if self.pids.contains_key(&raw)
                || self.check_pids.contains(raw)
                || self.tools.is_task(raw)
            {
                break;
            }
            match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Signaled(_, nix::sys::signal::Signal::SIGKILL, _)) => {
                    killed = killed.saturating_add(1);
                    log::debug!("reaped {pid}, killed with its run's leader {pgid}");
                }
                Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => {
                    log::debug!("reaped orphan {pid} of {pgid}'s run");
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) | Err(_) => break,
            }
        }
        let more = nix::sys::signal::killpg(pgid, None).is_ok();
        (killed.saturating_add(u32::from(more)), more)
    }

    /// Writes again the pid record of every run whose record file is gone or replaced.
    pub(crate) fn rewrite_pid_records(&mut self) {
        let state_dir = self.cfg.supd.state_dir.clone();
        for slot in self.slots.values_mut() {
            let Some((pid, start, mode)) =
                (slot.instance.as_ref()).map(|i| (i.pid, i.start_time, i.mode()))
            else {
                continue;
            };
            if slot.pid_file.as_ref().is_some_and(PidFile::is_current) {
                continue;
            }
            let name = slot.cfg.name.clone();
            let written = pid_file_of(slot, &state_dir)
                .and_then(|f| f.set_run(pid, start, mode).map_err(|e| e.to_string()));
            match written {
                Ok(()) => log::info!("{name}: its pid record is written again"),
                Err(e) => log::error!("{name}: cannot write its pid record again: {e}"),
            }
        }
    }

    /// Ends the runs whose last process is gone: their record is cleared, and their
    /// service learns how its leader exited (and may start again).
    pub(crate) fn check_draining(&mut self, now: Mono) {
        let names: Vec<String> = self.draining.iter().cloned().collect();
        for name in names {
            let gone = self
                .slots
                .get(&name)
                .and_then(|s| s.instance.as_ref())
                .is_none_or(|i| i.is_gone(&self.pids));
            if !gone {
                continue;
            }
            self.draining.remove(&name);
            let state_dir = self.cfg.supd.state_dir.clone();
            let Some(slot) = self.slots.get_mut(&name) else {
                continue;
            };
            let (exit, others, oom) =
                slot.instance.take().map_or((None, Some(0), None), |mut i| {
                    i.disarm();
                    // Every process of the run the OOM killer took, the leader or not,
                    // the run failed for it or went on.
                    if let Some(c) = self.cgroups.as_ref() {
                        slot.svc.count_oom_kills(oom_rise(c, &name, i.oom_at_start));
                    }
                    let oom = i.out_of_memory.take();
                    (i.exit, (!i.left_uncounted).then_some(i.left_at_exit), oom)
                });
            if let Err(e) = pid_file_of(slot, &state_dir).and_then(|f| {
                f.set(None)
                    .map_err(|e| format!("cannot clear its pid record: {e}"))
            }) {
                log::warn!("{name}: {e}");
            }
            let exec_error = slot.exec_error.take();
            match (exec_error, exit) {
                (Some(e), _) if e.denied => {
                    let why = Self::denied_reason(&name, &e.why);
                    self.apply(&name, Event::Unavailable(why.clone()), now);
                    // A probation ends (rolled back where it can be), the version unmarked.
                    if let Some(tool) = self.slots.get(&name).and_then(|s| s.cfg.tool.clone()) {
                        self.probation_refused(&tool, &format!("{name}: {why}"), now);
                    }
                }
                (Some(e), _) => self.apply(&name, Event::SpawnFailed(e.why), now),
                (None, Some(exit)) if oom.is_some() => {
                    let why = oom.unwrap_or_default();
                    log::warn!("{name}: {why}");
                    self.control
                        .broadcast(&crate::protocol::line(serde_json::json!({
                            "event": "oom",
                            "service": name,
                            "reason": why,
                            "time": crate::supervisor::unix_ms(),
                        })));
                    self.apply(&name, Event::OutOfMemory(exit, why), now)
                }
                (None, Some(exit)) if others != Some(0) => {
                    self.apply(&name, Event::Daemonized(exit, others), now)
                }
                (None, Some(exit)) => self.apply(&name, Event::Exited(exit), now),
                (None, None) => {}
            }
        }
        self.drain_retry = match (self.draining.is_empty(), self.drain_retry) {
            (true, _) => None,
            (false, None) => Some((now.plus(DRAIN_FIRST), DRAIN_FIRST)),
            (false, kept) => kept,
        };
    }
}

/// How many of a run's processes the OOM killer took since it started (its memory
/// cgroup's count now, less the count at its start); 0 without a memory cgroup.
pub(crate) fn oom_rise(c: &crate::cgroup::Cgroups, name: &str, at_start: Option<u64>) -> u64 {
    match (c.oom_kills(name), at_start) {
        (Some(now), Some(then)) => now.saturating_sub(then),
        _ => 0,
    }
}

/// Why a run that failed was OOM-killed (the leader or another of its processes), if it was: its memory
/// cgroup's OOM-kill count rose past `at_start`.
fn out_of_memory(
    c: &crate::cgroup::Cgroups,
    name: &str,
    at_start: Option<u64>,
    limits: &crate::config::resources::ResourceLimits,
) -> Option<String> {
    let now = c.oom_kills(name)?;
    if now <= at_start? {
        return None;
    }
    Some(crate::cgroup::limits::oom_reason(limits))
}

/// How long one turn reaps what a scan of all children finds, at most.
pub(super) const SCAN_TIME: Duration = Duration::from_millis(4);

/// How long a scan of all children may be owed after a SIGCHLD that told of a watched
/// leader (`on_sigchld`).
pub(super) const SCAN_OWED: Duration = Duration::from_secs(1);

/// How long the first look at a run's remaining processes waits; it doubles up to
/// `DRAIN_MAX` while any is left.
pub(super) const DRAIN_FIRST: Duration = Duration::from_millis(10);

pub(super) const DRAIN_MAX: Duration = Duration::from_secs(1);
