//! Ending what a previous supd left running (it was killed, or crashed), before anything
//! starts: no service ever runs twice, and nothing that was not a service's is touched.
//!
//! What counts as left by a service:
//! - everything in a cgroup the previous supd used for its services (exact);
//! - the process group (and session) a pid record names, while the recorded leader is
//!   alive with the recorded start time: Linux never reuses a pid that still names a
//!   process group or session, so they are the service's;
//! - when the recorded leader is gone, the group's id may since have been taken by an
//!   unrelated process that made a group of its own: then only the members whose
//!   environment names the service (`SUP_SERVICE`, which supd gives every service).
//!
//! Signals go through pidfds, so a member that exits meanwhile, and whose pid is taken by
//! another process, is never signalled by mistake. On kernels without pidfds (before
//! 5.3) each member is named by its pid and start time: it is signalled only while
//! `/proc` still shows that start time, and its exit is noticed by a re-check on a timer
//! that backs off (20ms, doubling to 1s) until the phase's deadline: no service starts
//! before the last of them is gone, as with pidfds.
//!
//! A service whose `kill_mode` (in the config the new supd reads) is narrower has less
//! counted as left: with `"group"`, its recorded process group (not its session nor the
//! rest of its cgroup); with `"main"`, the recorded main process alone, while it is that
//! very process (its start time): what it started (sshd's sessions) is never ended, even
//! in its cgroup, which keeps it. A service no longer in the config counts whole. But a
//! run recorded with the `kill_mode` it started under is ended as that says, whatever
//! the config says now, or whether it has the service (as a reload stops the old run
//! as it was started).
//!
//! A process that cannot die (in uninterruptible sleep on a hung file system, held by a
//! cgroup freezer) is waited for as long as it lives: the KILL is sent again on a
//! backoff (`unkillable::kill_again_in`), and its service is held back meanwhile, with
//! `status` saying which pid, in which state. Each service is held by its own leftovers
//! only: one whose processes are all gone is released (its records cleared, its old
//! cgroup removed) and starts, whatever is still left of another's.

use crate::cgroup;
use crate::config::KillMode;
use crate::proc::Stat;
use crate::records::{self, PidRecord};
use crate::time::Mono;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Ending what a previous supd left, carried out by the loop: the socket answers
/// meanwhile (and `status` says what is being ended), but no service starts until what
/// was left of it is gone. TERM and CONT first, up to `grace`; then KILL, looked for
/// again until nothing is left (a member may have forked meanwhile), and sent again on a
/// backoff to what outlives it.
pub struct Cleanup {
    state_dir: PathBuf,
    recs: Vec<PidRecord>,
    cgroups: Vec<PathBuf>,
    /// The services whose `kill_mode` is narrower than their cgroup.
    narrow: Vec<(String, KillMode)>,
    /// The services that still have something left: each is held back until it is gone.
    pub services: Vec<String>,
    /// When the ending began: what `status` counts a wait from.
    began: Mono,
    members: Vec<Member>,
    /// When the current phase gives up waiting.
    pub deadline: Mono,
    /// Begun for these services alone ([`Cleanup::begin_only`]): it holds no other.
    only: bool,
    /// KILL rounds so far (0: still in the TERM grace).
    kills: u32,
    /// Without pidfds: when to look at the members again, and the step after that.
    recheck: Option<(Mono, Duration)>,
}

/// A cleanup under way, carried across `reexec` (handoff format 6): the new image goes on
/// waiting for what is left, holding the same services back. The records of the held
/// services stay on disk until they are released; these are the ones it was begun with.
#[derive(Debug, Serialize, Deserialize)]
pub struct Carried {
    recs: Vec<(String, i32, u64)>,
    cgroups: Vec<PathBuf>,
    #[serde(default)]
    narrow: Vec<(String, KillMode)>,
    services: Vec<String>,
    began: Mono,
    deadline: Mono,
    kills: u32,
    #[serde(default)]
    only: bool,
}

/// KILL rounds 5 s apart before supd says what outlives them and backs off
/// (`unkillable::kill_again_in`); it never goes on without them.
const KILL_ROUNDS: u32 = 3;
/// Without pidfds: the first re-check of the members, and the longest step between two.
const RECHECK_FIRST: Duration = Duration::from_millis(20);
const RECHECK_MAX: Duration = Duration::from_secs(1);

impl Cleanup {
    /// Looks for what a previous supd of `state_dir` left and sends it TERM; `None` when
    /// nothing is left (the records are cleared). `narrow`: the services whose
    /// `kill_mode` is not `"cgroup"`, with it. What `spare` names is left alone, records
    /// and all: a service of a config file that does not load (see [`spared`]).
    pub fn begin(
        state_dir: &Path,
        grace: Duration,
        narrow: Vec<(String, KillMode)>,
        now: Mono,
        spare: &dyn Fn(&str) -> bool,
    ) -> Option<Cleanup> {
        let recs: Vec<PidRecord> = records::read_pids(state_dir)
            .into_iter()
            .filter(|r| r.pid > 1 && !spare(&r.service))
            .collect();
        // A run is ended as the kill_mode it started under says (its record's), not as
        // the config says now: the config's for a service without a run recorded so.
        let mut narrow = narrow;
        for r in &recs {
            if let Some(mode) = r.mode {
                narrow.retain(|(n, _)| *n != r.service);
                if mode != KillMode::Cgroup {
                    narrow.push((r.service.clone(), mode));
                }
            }
        }
        let cgroups: Vec<PathBuf> = cgroup::left_by_previous(state_dir)
            .into_iter()
            // What is in the cgroup of a service of a narrower `kill_mode` is not ended
            // for being there (its check commands' cgroup still is).
            .filter(|d| {
                !narrow
                    .iter()
                    .any(|(n, _)| own_cgroup_of(d) == Some(n.as_str()))
            })
            .filter(|d| !spare(&cgroup_service(d)))
            .filter(|d| {
                let busy = cgroup::populated(d);
                if !busy {
                    cgroup::remove(d);
                }
                busy
            })
            .collect();
        let found = remnants(&recs, &cgroups, &narrow);
        if found.is_empty() {
            for r in records::read_pids(state_dir) {
                if !spare(&r.service) {
                    clear_records(state_dir, &r.service);
                }
            }
            return None;
        }
        let mut services: Vec<String> = found.iter().map(|(_, s)| s.clone()).collect();
        services.sort();
        services.dedup();
        for service in &services {
            log::warn!("{service}: a run of it was left by a previous supd; ending it");
        }
        // Every record is kept, and looked at again at each step, until the services
        // may start: a child of the killed supd caught between its fork and its own
        // `setsid` (or its cgroup) is found by a later look, not missed for good.
        let members = open(&found);
        signal(&members, Signal::SIGTERM);
        signal(&members, Signal::SIGCONT);
        let mut c = Cleanup {
            state_dir: state_dir.to_path_buf(),
            recs,
            cgroups,
            narrow,
            services,
            began: now,
            members,
            deadline: now.plus(grace),
            kills: 0,
            only: false,
            recheck: None,
        };
        c.plan_recheck(now, true);
        Some(c)
    }

    /// [`Cleanup::begin`] for the runs of `services` alone, while the others run: those
    /// a previous supd left that were kept while their file did not load, now that it
    /// does (or that no file is broken any more). It holds back only them.
    pub fn begin_only(
        state_dir: &Path,
        services: &[String],
        grace: Duration,
        narrow: Vec<(String, KillMode)>,
        now: Mono,
    ) -> Option<Cleanup> {
        let spare = |s: &str| !services.iter().any(|n| n == s);
        let mut c = Cleanup::begin(state_dir, grace, narrow, now, &spare)?;
        c.only = true;
        Some(c)
    }

    /// What a new image needs to go on with this cleanup (`reexec`).
    pub fn carry(&self) -> Carried {
        Carried {
            recs: (self.recs.iter())
                .map(|r| (r.service.clone(), r.pid, r.start_time))
                .collect(),
            cgroups: self.cgroups.clone(),
            narrow: self.narrow.clone(),
            services: self.services.clone(),
            began: self.began,
            deadline: self.deadline,
            kills: self.kills,
            only: self.only,
        }
    }

    /// Goes on with a cleanup a previous image of this supd began (`reexec`): the same
    /// services held back, the same phase and deadline; its members are found again
    /// (the pidfds stayed behind with the old image). `None` when nothing is left.
    pub fn resume(state_dir: &Path, c: Carried, now: Mono) -> Option<Cleanup> {
        let recs: Vec<PidRecord> = (c.recs.into_iter())
            .map(|(service, pid, start_time)| PidRecord {
                service,
                pid,
                start_time,
                mode: None,
            })
            .collect();
        let mut cleanup = Cleanup {
            state_dir: state_dir.to_path_buf(),
            recs,
            cgroups: c.cgroups,
            narrow: c.narrow,
            services: c.services,
            began: c.began,
            members: Vec::new(),
            deadline: c.deadline,
            kills: c.kills,
            only: c.only,
            recheck: None,
        };
        let found = remnants(&cleanup.recs, &cleanup.cgroups, &cleanup.narrow);
        if found.is_empty() {
            cleanup.release(&found);
            for r in std::mem::take(&mut cleanup.recs) {
                clear_records(state_dir, &r.service);
            }
            log::info!("what a previous supd left is gone");
            return None;
        }
        if cleanup.past_rounds() {
            let released = cleanup.release(&found);
            if !released.is_empty() {
                log::info!("released across the reexec: {}", released.join(", "));
            }
        }
        cleanup.members = open(&found);
        cleanup.plan_recheck(now, true);
        Some(cleanup)
    }

    /// When the loop must call [`Cleanup::step`] at the latest: the phase's deadline, or
    /// sooner the next re-check of members that have no pidfd.
    pub fn wake(&self) -> Mono {
        match self.recheck {
            Some((at, _)) => at.min(self.deadline),
            None => self.deadline,
        }
    }

    /// Sets the next re-check while a member has no pidfd to poll (kernels before 5.3),
    /// or when there is none to poll (all gone between the scan and the signal): from
    /// the first step after a signal, else doubling up to [`RECHECK_MAX`].
    fn plan_recheck(&mut self, now: Mono, fresh: bool) {
        if !self.members.is_empty() && self.members.iter().all(|m| m.fd.is_some()) {
            self.recheck = None;
            return;
        }
        let step = match self.recheck {
            Some((_, step)) if !fresh => (step * 2).min(RECHECK_MAX),
            _ => RECHECK_FIRST,
        };
        self.recheck = Some((now.plus(step), step));
    }

    /// The pidfds to poll: each is readable once its process has exited.
    pub fn fds(&self) -> impl Iterator<Item = std::os::fd::BorrowedFd<'_>> {
        self.members
            .iter()
            .filter_map(|m| m.fd.as_ref().map(|f| f.as_fd()))
    }

    /// How many processes are still awaited.
    pub fn left(&self) -> usize {
        self.members.len()
    }

    /// Whether `service` is held back by what is left of it.
    /// Every service is held while the TERM grace and the KILL rounds last (what is
    /// left of a killed supd, its children caught mid-start included, is found by the
    /// looks of those phases); past them, only those with something still left (that
    /// outlived SIGKILL: frozen, in uninterruptible sleep), so that the others start.
    pub fn holds(&self, service: &str) -> bool {
        let mine = || self.services.iter().any(|s| s == service);
        !self.is_over() && (!(self.past_rounds() || self.only) || mine())
    }

    /// Whether nothing is left: every service is released.
    pub fn is_over(&self) -> bool {
        self.services.is_empty()
    }

    /// What holds `service` back, for `status`: the first of its processes still there.
    pub fn holder(&self, service: &str, now: Mono) -> Option<crate::unkillable::Holder> {
        let _ = now;
        let mine = self.members.iter().filter(|m| m.service == service);
        let (seen, more) =
            crate::unkillable::first_alive(mine.map(|m| (m.pid, Some(m.start_time))))?;
        Some(crate::unkillable::Holder {
            seen,
            run: crate::unkillable::Run::Previous,
            more,
            since: self.began,
        })
    }

    /// Takes note of exits and of the deadline; returns the services released (nothing
    /// is left of them: they may start). The cleanup is over once every service is.
    pub fn step(&mut self, now: Mono) -> Vec<String> {
        let before = self.members.len();
        self.members.retain(|m| match &m.fd {
            Some(f) => !has_exited(f),
            // No pidfds (Linux before 5.3): alive while /proc shows its start time and
            // it is not a zombie.
            None => crate::proc::is_same(m.pid, m.start_time),
        });
        let due = self.deadline <= now;
        if !due && !self.members.is_empty() && self.members.len() == before {
            self.plan_recheck(now, false);
            return Vec::new();
        }
        if due {
            // The TERM grace is over, or a KILL round is: KILL whatever is there now.
            for d in &self.cgroups {
                cgroup::kill(d);
            }
        }
        // A member exited, or the phase is over: what is there now (a member may have
        // forked), and the services with nothing left.
        let found = remnants(&self.recs, &self.cgroups, &self.narrow);
        let mut fresh: Vec<String> = (found.iter())
            .map(|(_, s)| s.clone())
            .filter(|s| !self.services.contains(s))
            .collect();
        fresh.sort();
        fresh.dedup();
        for service in fresh {
            log::warn!("{service}: a run of it was left by a previous supd; ending it");
            self.services.push(service);
        }
        if found.is_empty() {
            let released = self.release(&found);
            let stale: Vec<String> = self.recs.drain(..).map(|r| r.service).collect();
            for service in &stale {
                clear_records(&self.state_dir, service);
            }
            self.members.clear();
            self.recheck = None;
            log::info!("what a previous supd left is gone");
            return released;
        }
        if due {
            self.members = open(&found);
            signal(&self.members, Signal::SIGKILL);
            self.kills += 1;
            if self.kills == KILL_ROUNDS + 1 {
                self.say_survivors(now);
            }
            self.deadline = now.plus(crate::unkillable::kill_again_in(self.kills, KILL_ROUNDS));
            self.plan_recheck(now, true);
        } else {
            // Before the deadline: those new since the last look get this phase's signal.
            let fresh: Vec<(i32, String)> = (found.iter())
                .filter(|(p, _)| !self.members.iter().any(|m| m.pid == *p))
                .cloned()
                .collect();
            let fresh = open(&fresh);
            if self.kills == 0 {
                signal(&fresh, Signal::SIGTERM);
                signal(&fresh, Signal::SIGCONT);
            } else {
                signal(&fresh, Signal::SIGKILL);
            }
            self.members.extend(fresh);
            self.plan_recheck(now, false);
        }
        if !self.past_rounds() {
            return Vec::new();
        }
        // Past the KILL rounds: the services with nothing left are released, and the
        // records of those never found are stale (cleared before they may start).
        let mut released = self.release(&found);
        let stale: Vec<String> = (self.recs.iter())
            .filter(|r| !self.services.contains(&r.service))
            .map(|r| r.service.clone())
            .collect();
        for service in stale {
            clear_records(&self.state_dir, &service);
            self.recs.retain(|r| r.service != service);
            released.push(service);
        }
        released
    }

    /// Whether the TERM grace and the KILL rounds are over: what is left now outlived
    /// SIGKILL, and only its own services are held back.
    pub fn past_rounds(&self) -> bool {
        self.kills > KILL_ROUNDS
    }

    /// Releases the services of which nothing is in `found`: their records are cleared
    /// and their old cgroups removed (a new run makes its own), before they may start.
    fn release(&mut self, found: &[(i32, String)]) -> Vec<String> {
        let (gone, held): (Vec<String>, Vec<String>) = std::mem::take(&mut self.services)
            .into_iter()
            .partition(|s| !found.iter().any(|(_, f)| f == s));
        self.services = held;
        for service in &gone {
            clear_records(&self.state_dir, service);
            self.recs.retain(|r| &r.service != service);
            self.cgroups.retain(|d| {
                let mine = cgroup_service(d) == *service;
                if mine {
                    cgroup::remove(d);
                }
                !mine
            });
            log::info!("{service}: what a previous supd left of it is gone");
        }
        gone
    }

    /// Says, once, what outlived the KILL rounds: it is waited for, never gone past.
    fn say_survivors(&self, now: Mono) {
        for service in &self.services {
            if let Some(h) = self.holder(service, now) {
                log::error!(
                    "{service}: what a previous supd left survives SIGKILL; not started until it is gone: {}",
                    h.waiting(now)
                );
            }
        }
    }
}

/// A run a previous supd left of a service whose config file does not load: kept
/// running, unsupervised, and said in the log and `status`; ended (then started anew,
/// if it is defined) once its file loads, or no file is broken any more.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    pub service: String,
    /// The first of its processes (its leader while it lives), with its start time.
    pub pid: i32,
    pub start_time: u64,
}

impl Kept {
    /// Whether it still runs.
    pub fn alive(&self) -> bool {
        crate::proc::is_same(self.pid, self.start_time)
    }
}

/// What a previous supd left of the services `spare` names, kept (its records too).
pub fn spared(state_dir: &Path, spare: &dyn Fn(&str) -> bool) -> Vec<Kept> {
    let recs: Vec<PidRecord> = (records::read_pids(state_dir).into_iter())
        .filter(|r| r.pid > 1 && spare(&r.service))
        .collect();
    let cgroups: Vec<PathBuf> = (cgroup::left_by_previous(state_dir).into_iter())
        .filter(|d| spare(&cgroup_service(d)))
        .collect();
    let mut kept: Vec<Kept> = Vec::new();
    for (pid, service) in remnants(&recs, &cgroups, &[]) {
        let leader = recs.iter().any(|r| r.pid == pid && r.service == service);
        let Some(stat) = crate::proc::stat(pid) else {
            continue;
        };
        match kept.iter_mut().find(|k| k.service == service) {
            Some(k) if leader => (k.pid, k.start_time) = (pid, stat.start_time),
            Some(_) => {}
            None => kept.push(Kept {
                service,
                pid,
                start_time: stat.start_time,
            }),
        }
    }
    for k in &kept {
        log::warn!(
            "{}: a run of it left by a previous supd is kept (pid {}): its config file does not load, so supd neither supervises nor ends it until it does",
            k.service,
            k.pid
        );
    }
    kept
}

/// Clears the records of `service` (its run's and its check command's) that are there.
fn clear_records(state_dir: &Path, service: &str) {
    let there = |sub: &str| state_dir.join(sub).join(service).exists();
    let files = [
        there("pids").then(|| records::PidFile::open(state_dir, service)),
        there("checks").then(|| records::PidFile::open_check(state_dir, service)),
    ];
    for f in files.into_iter().flatten().flatten() {
        if let Err(e) = f.set(None) {
            log::warn!("{service}: cannot clear its pid record: {e}");
        }
    }
}

/// The service a cgroup of a previous supd was for: `NAME.service`, or its check
/// command's `NAME+check.service` ('+' is in no service's name).
fn cgroup_service(dir: &Path) -> String {
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let name = name.trim_end_matches(".service");
    name.trim_end_matches("+check").to_string()
}

/// Whether the process of a pidfd has exited (its pidfd is readable).
fn has_exited(fd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

/// The service a cgroup of a previous supd ran (`NAME.service`; `None` for a check
/// command's).
fn own_cgroup_of(dir: &Path) -> Option<&str> {
    let name = dir.file_name()?.to_str()?.strip_suffix(".service")?;
    (!name.ends_with("+check")).then_some(name)
}

/// The live processes left by services, with the service of each.
fn remnants(
    recs: &[PidRecord],
    cgroups: &[PathBuf],
    narrow: &[(String, KillMode)],
) -> Vec<(i32, String)> {
    let mode = |service: &str| {
        (narrow.iter())
            .find(|(n, _)| n == service)
            .map_or(KillMode::Cgroup, |(_, m)| *m)
    };
    // For each record: whether its group is surely the service's (the leader lives).
    let groups: Vec<(&PidRecord, bool)> = recs
        .iter()
        .filter_map(|r| match crate::proc::stat(r.pid) {
            Some(s) if s.start_time == r.start_time => Some((r, true)),
            // Another process has the pid now: it cannot be the leader of the old
            // group, and the old group, which would have kept the pid, is empty.
            Some(_) => None,
            None => Some((r, false)),
        })
        .collect();
    let mut out: Vec<(i32, String)> = Vec::new();
    if !groups.is_empty() {
        for s in crate::proc::all().iter().filter(|s| s.state != 'Z') {
            // The recorded leader itself, while it is that very process (its start
            // time): a child killed between its fork and its own `setsid` is still in
            // supd's group and session, and would be missed by them (and its service
            // released beside it).
            if let Some((r, _)) = groups.iter().find(|(r, owned)| {
                let reach = match mode(&r.service) {
                    KillMode::Cgroup => r.pid == s.pgrp || r.pid == s.session,
                    KillMode::Group => r.pid == s.pgrp,
                    KillMode::Main => false,
                };
                (*owned && s.pid == r.pid) || (reach && (*owned || names_service(s, &r.service)))
            }) {
                out.push((s.pid, r.service.clone()));
            }
        }
    }
    for d in cgroups {
        let service = cgroup_service(d);
        out.extend(cgroup::members(d).into_iter().map(|p| (p, service.clone())));
    }
    out.sort();
    out.dedup_by_key(|(p, _)| *p);
    out
}

/// Whether the environment a process was started with names `service` as its own.
fn names_service(s: &Stat, service: &str) -> bool {
    let want = format!("SUP_SERVICE={service}");
    crate::proc::environ(s.pid)
        .is_some_and(|env| env.split(|b| *b == 0).any(|v| v == want.as_bytes()))
}

/// A process to end: its pid and start time, its service and, where the kernel has
/// them, a pidfd.
struct Member {
    pid: i32,
    start_time: u64,
    service: String,
    fd: Option<OwnedFd>,
}

/// The members found, each with its start time (one that is gone already is left out)
/// and a pidfd where the kernel has them.
fn open(found: &[(i32, String)]) -> Vec<Member> {
    found
        .iter()
        .filter_map(|(pid, service)| {
            let start_time = crate::proc::stat(*pid)?.start_time;
            Some(Member {
                pid: *pid,
                start_time,
                service: service.clone(),
                fd: crate::sys::pidfd_open(*pid).ok(),
            })
        })
        .collect()
}

/// Sends `sig` to each member: through its pidfd (exact), or, on kernels without
/// pidfds, by pid while its start time is still the one found.
fn signal(members: &[Member], sig: Signal) {
    for m in members {
        let sent =
            m.fd.as_ref()
                .is_some_and(|fd| crate::sys::pidfd_send_signal(fd, sig as i32).is_ok());
        if !sent {
            crate::proc::kill_if_same(m.pid, m.start_time, sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cleanup(members: Vec<Member>) -> Cleanup {
        Cleanup {
            state_dir: PathBuf::from("/nonexistent/sup-test"),
            recs: Vec::new(),
            cgroups: Vec::new(),
            narrow: Vec::new(),
            services: vec!["svc".into()],
            began: Mono(0),
            members,
            deadline: Mono(0).plus(Duration::from_secs(10)),
            kills: 0,
            only: false,
            recheck: None,
        }
    }

    fn this_process() -> (i32, u64) {
        let me = std::process::id() as i32;
        (me, crate::proc::stat(me).expect("own stat").start_time)
    }

    #[test]
    fn without_pidfds_members_are_looked_at_again_on_a_backoff_timer() {
        let (pid, start_time) = this_process();
        let mut c = cleanup(vec![Member {
            pid,
            start_time,
            service: "svc".into(),
            fd: None,
        }]);
        c.plan_recheck(Mono(0), true);
        assert_eq!(c.wake(), Mono(0).plus(RECHECK_FIRST));
        let mut steps = Vec::new();
        for _ in 0..8 {
            let now = c.wake();
            assert!(c.step(now).is_empty(), "this process is alive: not over");
            assert!(c.holds("svc") && !c.is_over());
            let (at, step) = c.recheck.expect("a re-check");
            assert_eq!(at, now.plus(step));
            steps.push(step.as_millis());
        }
        assert_eq!(steps, [40, 80, 160, 320, 640, 1000, 1000, 1000]);
        // Never past the phase's deadline.
        c.recheck = Some((c.deadline.plus(RECHECK_MAX), RECHECK_MAX));
        assert_eq!(c.wake(), c.deadline);
        // Its pid with another start time is another process: this one is gone.
        c.members[0].start_time += 1;
        assert_eq!(c.step(Mono(1)), ["svc"], "nothing left to end: released");
        assert!(c.is_over());
    }

    #[test]
    fn with_pidfds_nothing_is_looked_at_on_a_timer() {
        let (pid, start_time) = this_process();
        let Ok(fd) = crate::sys::pidfd_open(pid) else {
            return; // a kernel without pidfds: the other test is the one that applies
        };
        let mut c = cleanup(vec![Member {
            pid,
            start_time,
            service: "svc".into(),
            fd: Some(fd),
        }]);
        c.plan_recheck(Mono(0), true);
        assert_eq!((c.recheck, c.wake()), (None, c.deadline));
    }

    #[test]
    fn a_cleanup_of_kept_runs_holds_back_only_their_services() {
        let mut c = cleanup(Vec::new());
        assert!(
            c.holds("svc") && c.holds("other"),
            "a start's holds every service"
        );
        c.only = true;
        assert!(c.holds("svc") && !c.holds("other"));
    }

    #[test]
    fn nothing_to_await_is_over_at_the_first_look_not_at_the_deadline() {
        let mut c = cleanup(Vec::new());
        c.plan_recheck(Mono(0), true);
        assert_eq!(c.wake(), Mono(0).plus(RECHECK_FIRST));
        assert_eq!(c.step(c.wake()), ["svc"]);
        assert!(c.is_over() && !c.holds("svc"));
    }
}
