//! supd's side of leases: it does not talk to the cluster; `sup-lease` does, and tells
//! supd when this node leads. A grant is valid for a while; `leader_only` services run
//! only while their lease's grant is valid, and are stopped when it runs out without
//! renewal, even if sup-lease hung or died.
//!
//! A grant's end is an absolute instant on `CLOCK_BOOTTIME` (`until_boot_ms`), computed
//! by sup-lease on this host from when its keepalive was sent; supd enforces it as given,
//! however late the grant arrives, and reads that clock itself (its other timers are on
//! `CLOCK_MONOTONIC`, which stops during suspend: a grant must not outlive a suspend).
//! An older sup-lease sends only `valid_for`, counted from receipt.

use crate::deadman::Deadman;
use crate::protocol::{Error, ErrorKind};
use crate::service::State;
use crate::time::{Boot, Mono};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::time::Duration;

/// How long a `lease-release` waits, after the SIGKILL of its services, for processes
/// that do not die (uninterruptible sleep) before it answers anyway. A killed process
/// normally exits within milliseconds; tearing down a very large one takes longer.
pub const RELEASE_GRACE: Duration = Duration::from_secs(1);

/// What a candidacy needs to know of one leader-only service's health.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceHealth {
    pub name: String,
    /// Unhealthy now (its failed checks reached `failures`, or its watchdog was missed).
    pub unhealthy: bool,
    /// When it last became unhealthy, if ever since supd started.
    pub since: Option<Mono>,
    /// Its last failure, as `status` says it.
    pub failure: Option<String>,
    /// How long the node stays out after that: the service's `cooldown`.
    pub hold: Duration,
}

/// Whether a node whose leader-only services of a lease are `services` may lead: `None`
/// when it may, else why not (the service and its last failure).
///
/// A leader-only service runs on the holder alone: once the holder stepped down, its
/// service is stopped and its health is unknown, which proves nothing. So the node stays
/// out for the service's `cooldown` after its last unhealthy verdict (the wait the
/// crash-loop rule gives a service that keeps failing), and leadership does not come
/// straight back to where the service just failed; then it is a candidate again like
/// any other, and its next run is checked again.
pub fn health_hold(services: &[ServiceHealth], now: Mono) -> Option<String> {
    let failure = |s: &ServiceHealth| {
        s.failure
            .as_deref()
            .map(|f| format!(": {f}"))
            .unwrap_or_default()
    };
    if let Some(s) = services.iter().find(|s| s.unhealthy) {
        return Some(format!("{} is unhealthy{}", s.name, failure(s)));
    }
    services
        .iter()
        .filter_map(|s| {
            let since = s.since?;
            let end = since.plus(s.hold);
            (end > now).then_some((end, s, since))
        })
        .max_by_key(|(end, _, _)| *end)
        .map(|(end, s, since)| {
            format!(
                "{} was unhealthy {} ago{}; a candidate again in {}",
                s.name,
                crate::time::Human(round_s(now.since(since))),
                failure(s),
                crate::time::Human(round_s(end.since(now)))
            )
        })
}

/// What a candidacy needs to know of whether one leader-only service can run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRun {
    pub name: String,
    pub state: State,
    /// Unhealthy now (see [`ServiceHealth`]).
    pub unhealthy: bool,
    /// Why it is in its state, as `status` says it.
    pub reason: Option<String>,
}

/// Why this node's leader-only services of a lease cannot run, or `None`: one failed
/// (supd gave up on it), is in its crash-loop cooldown, or is unhealthy. sup-lease
/// publishes it as the member's `failing`; a failing holder steps down for a member
/// that is not failing (sup-lease(8), THE RULE). A stopped service (not leading) is not
/// failing: what it did when it last led, sup-lease remembers.
pub fn failing(services: &[ServiceRun]) -> Option<String> {
    let with = |s: &ServiceRun| {
        s.reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default()
    };
    services.iter().find_map(|s| match s.state {
        State::Failed => Some(format!("{} failed{}", s.name, with(s))),
        State::Cooldown => Some(format!(
            "{} is in its crash-loop cooldown{}",
            s.name,
            with(s)
        )),
        _ if s.unhealthy => Some(format!("{} is unhealthy", s.name)),
        _ => None,
    })
}

/// A duration to the nearest second above a second, for people.
fn round_s(d: Duration) -> Duration {
    if d < Duration::from_secs(1) {
        Duration::from_millis(d.as_millis() as u64)
    } else {
        Duration::from_secs(d.as_secs_f64().round() as u64)
    }
}

/// Leadership granted by sup-lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The fencing token: the store revision that made this node leader.
    pub term: u64,
    pub holder: String,
    /// The end, on `CLOCK_BOOTTIME`.
    pub until: Boot,
    /// The most a stop may take once it ran out (then SIGKILL): given by sup-lease
    /// (T/4), or half the validity for an older one.
    pub kill_grace: Duration,
}

/// What supd does with a `lease-grant`: when it ends and how fast its services must go.
/// `until_boot_ms` wins when given; `valid_for` (from receipt) is for older sup-leases.
pub fn grant_deadline(
    valid_for: Duration,
    until_boot_ms: Option<u64>,
    kill_grace: Option<Duration>,
    now: Boot,
) -> (Boot, Duration) {
    let until = match until_boot_ms {
        Some(ms) => Boot::from_ms(ms).min(now.plus(valid_for)),
        None => now.plus(valid_for),
    };
    (until, kill_grace.unwrap_or(valid_for / 2))
}

/// The ends a `lease-grant` names, as sent: read by [`GrantEnds::read`].
pub struct GrantEnds<'a> {
    pub valid_for: &'a str,
    pub until_boot_ms: Option<u64>,
    pub kill_grace: Option<&'a str>,
}

impl GrantEnds<'_> {
    /// The grant's end and its kill grace, or why the request is wrong.
    pub fn read(&self, now: Boot) -> Result<(Boot, Duration), Error> {
        let d = crate::time::parse_duration(self.valid_for)
            .map_err(|e| Error::new(ErrorKind::BadRequest, format!("valid_for: {e}")))?;
        if d.is_zero() || d > Duration::from_secs(3600) {
            return Err(Error::new(
                ErrorKind::BadRequest,
                "valid_for: from 1ms to 1h",
            ));
        }
        let grace = (self.kill_grace)
            .map(crate::time::parse_duration)
            .transpose()
            .map_err(|e| Error::new(ErrorKind::BadRequest, format!("kill_grace: {e}")))?;
        // The guard lets a run live this long past the grant's end, whatever supd does:
        // bounded as the validity is (sup-lease sends T/4).
        if grace.is_some_and(|g| g > Duration::from_secs(3600)) {
            return Err(Error::new(
                ErrorKind::BadRequest,
                "kill_grace: from 0 to 1h",
            ));
        }
        Ok(grant_deadline(d, self.until_boot_ms, grace, now))
    }
}

/// Whether a grant of `term` may be taken while `held` (its term and holder) is held:
/// a term never goes back, so an older one is a stale grant (from a holder that lost
/// leadership, or a store that went back) and is refused, naming both terms. The same
/// term renews; a newer one replaces it.
pub fn check_term(lease: &str, held: Option<(u64, &str)>, term: u64) -> Result<(), String> {
    match held {
        Some((h, holder)) if term < h => Err(format!(
            "lease {lease}: term {term} is older than term {h} held (granted to {holder}); a term never goes back: refused, the grant of term {h} stands"
        )),
        _ => Ok(()),
    }
}

/// The leases part: the grants sup-lease gave, the timer that wakes supd at their end,
/// the dead-man pipe and boards that bound their runs (`deadman.rs`), and when each
/// service last turned unhealthy (a leader-only one holds its node out of its lease).
/// Its state is its own: the coordinator (`supervisor/leases.rs`) asks and tells it,
/// and carries out what it answers (starts, stops, guards to replace).
#[derive(Default)]
pub struct Leases {
    /// Leadership granted by sup-lease, by lease.
    grants: BTreeMap<String, Grant>,
    /// Fires at the earliest grant's end on CLOCK_BOOTTIME (a resume from suspend too);
    /// `None` until the first grant.
    timer: Option<GrantTimer>,
    /// When each service last turned unhealthy, and why: a leader-only one holds its
    /// node out of its lease for its `cooldown`.
    unhealthy_at: BTreeMap<String, (Mono, String)>,
    /// The dead-man pipe of leader-only services, made at the first such start.
    deadman: Option<Deadman>,
}

/// What a `lease-grant` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Granted {
    /// It was over when it arrived: answered, nothing changed.
    Late,
    /// Held for `valid_for` from now. `before`: the term of the grant valid until now,
    /// if any (none: newly held, its services may start; another: a new term).
    /// `earlier`: its end moved earlier than the guards of its runs read, which must
    /// be replaced (they sleep until the end they read).
    Held {
        before: Option<u64>,
        valid_for: Duration,
        earlier: bool,
    },
}

/// A grant that ran out without renewal.
#[derive(Debug, PartialEq, Eq)]
pub struct Expired {
    pub lease: String,
    pub term: u64,
    pub kill_grace: Duration,
}

impl Leases {
    /// The grant of `lease`, while it is valid (its own clock is read).
    fn valid(&self, lease: &str) -> Option<&Grant> {
        let now = Boot::now();
        self.grants.get(lease).filter(|g| g.until > now)
    }

    /// Whether this node holds a valid grant for `lease` now.
    pub fn holds(&self, lease: &str) -> bool {
        self.valid(lease).is_some()
    }

    /// The term a leader-only service starts with, if its lease is held.
    pub fn term(&self, lease: &str) -> Option<u64> {
        self.valid(lease).map(|g| g.term)
    }

    /// The leases granted (valid or not yet expired).
    pub fn granted(&self) -> Vec<String> {
        self.grants.keys().cloned().collect()
    }

    /// A service turned unhealthy (its check failed `failures` times, or its watchdog
    /// was missed): remembered for the candidacy of its lease.
    pub fn note_unhealthy(&mut self, name: &str, why: &str, now: Mono) {
        self.unhealthy_at
            .insert(name.to_string(), (now, why.to_string()));
    }

    /// When `name` last turned unhealthy, and why.
    pub fn unhealthy_since(&self, name: &str) -> Option<&(Mono, String)> {
        self.unhealthy_at.get(name)
    }

    /// `lease-grant`: takes a grant of `term` to `holder` until `ends`, and posts its
    /// end on the lease's board. A stale term is refused ([`check_term`]).
    pub fn grant(
        &mut self,
        lease: &str,
        holder: &str,
        term: u64,
        ends: GrantEnds,
    ) -> Result<Granted, Error> {
        let held = (self.grants.get(lease)).map(|g| (g.term, g.holder.as_str()));
        check_term(lease, held, term).map_err(|e| {
            log::warn!("{e}");
            Error::new(ErrorKind::BadRequest, e)
        })?;
        let boot = Boot::now();
        let (until, grace) = ends.read(boot)?;
        if until <= boot {
            log::warn!("lease {lease}: a grant of term {term} arrived after its end; ignored");
            return Ok(Granted::Late);
        }
        let before = (self.grants.get(lease))
            .filter(|g| g.until > boot)
            .map(|g| g.term);
        self.grants.insert(
            lease.to_string(),
            Grant {
                term,
                holder: holder.to_string(),
                until,
                kill_grace: grace,
            },
        );
        Ok(Granted::Held {
            before,
            valid_for: until.since(boot),
            earlier: self.post_grant_end(lease),
        })
    }

    /// `lease-grant` with `stopping` (see `Supervisor::grant_stopping`): the validity
    /// from now, and whether the end posted moved earlier (true: replace the guards).
    /// `down`: every leader-only service of the lease has exited (nothing to post).
    pub fn grant_stopping(
        &mut self,
        lease: &str,
        ends: GrantEnds,
        down: bool,
    ) -> Result<(Duration, bool), Error> {
        let boot = Boot::now();
        if let Some(g) = self.valid(lease) {
            return Err(Error::new(
                ErrorKind::BadRequest,
                format!(
                    "lease {lease}: this node leads (term {}): a stopping grant is for a holder that released",
                    g.term
                ),
            ));
        }
        let (until, grace) = ends.read(boot)?;
        let earlier = until > boot && !down && self.post_end(lease, until.plus(grace));
        Ok((until.since(boot), earlier))
    }

    /// Posts the end of `lease`'s grant (plus its kill grace) on its board, where the
    /// guards of its runs read it (`deadman.rs`): they kill the runs there, whatever
    /// supd does meanwhile. True when the end moved earlier: the guards must be replaced.
    #[must_use]
    pub fn post_grant_end(&mut self, lease: &str) -> bool {
        match (self.grants.get(lease)).map(|g| g.until.plus(g.kill_grace)) {
            Some(end) => self.post_end(lease, end),
            None => false,
        }
    }

    /// Posts `end` on the board of `lease`; true when it moved earlier.
    fn post_end(&mut self, lease: &str, end: Boot) -> bool {
        if let Err(e) = self.ensure_deadman() {
            log::error!("cannot make the dead-man pipe: {e}; the leader-only services of {lease} cannot start");
            return false;
        }
        let Some(d) = self.deadman.as_mut() else {
            return false;
        };
        let before = d.posted(lease);
        d.post(lease, end);
        // The guards sleep until the end they read: one moved earlier needs new guards.
        before.is_some_and(|b| end < b)
    }

    /// `lease-release`: the grant is dropped; its term, if one was held.
    pub fn release(&mut self, lease: &str) -> Option<u64> {
        self.grants.remove(lease).map(|g| g.term)
    }

    /// Drops the grants whose validity ran out, and says which.
    pub fn expire(&mut self) -> Vec<Expired> {
        let boot = Boot::now();
        let ended: Vec<String> = (self.grants.iter())
            .filter(|(_, g)| g.until <= boot)
            .map(|(l, _)| l.clone())
            .collect();
        ended
            .into_iter()
            .filter_map(|lease| {
                let g = self.grants.remove(&lease)?;
                Some(Expired {
                    lease,
                    term: g.term,
                    kill_grace: g.kill_grace,
                })
            })
            .collect()
    }

    /// Arms the grant timer at the earliest grant's end, or disarms it: a machine that
    /// resumes from suspend past a grant's end wakes supd at once, where the poll
    /// timeout (CLOCK_MONOTONIC, which stops while suspended) would not.
    pub fn arm_timer(&mut self) {
        let end = self.grants.values().map(|g| g.until).min();
        let Some(end) = end else {
            if let Some(t) = self.timer.as_ref().and_then(GrantTimer::fd) {
                let _ = t.unset();
            }
            return;
        };
        let timer = self.timer.get_or_insert_with(GrantTimer::new);
        let (t, at) = match timer {
            GrantTimer::Boot(t) => (t, end.0),
            // The same instant on the wall clock, which runs on through a suspend. A
            // step of the wall clock only moves this wake-up: the grant ends when
            // CLOCK_BOOTTIME says (`expire`), the poll timeout wakes supd without a
            // suspend, and every wake-up arms the timer again.
            GrantTimer::Wall(t) => {
                let wall = nix::time::clock_gettime(nix::time::ClockId::CLOCK_REALTIME)
                    .map(|ts| Duration::from(ts).as_nanos() as u64)
                    .unwrap_or(0);
                (
                    t,
                    wall.saturating_add(end.since(Boot::now()).as_nanos() as u64),
                )
            }
            GrantTimer::Missing => return,
        };
        // A zero expiration disarms: the earliest instant is one nanosecond.
        let at = nix::sys::time::TimeSpec::from_duration(Duration::from_nanos(at.max(1)));
        let _ = t.set(
            nix::sys::timerfd::Expiration::OneShot(at),
            nix::sys::timerfd::TimerSetTimeFlags::TFD_TIMER_ABSTIME,
        );
    }

    /// The grant timer's fd, while a grant is held.
    pub fn timer_fd(&self) -> Option<BorrowedFd<'_>> {
        self.timer
            .as_ref()
            .and_then(GrantTimer::fd)
            .filter(|_| !self.grants.is_empty())
            .map(|t| t.as_fd())
    }

    /// The grant timer fired: clear it (the loop then expires what has ended).
    pub fn on_timer(&mut self) {
        if let Some(t) = self.timer.as_ref().and_then(GrantTimer::fd) {
            let mut buf = [0u8; 8];
            let _ = nix::unistd::read(t, &mut buf);
        }
    }

    /// The earliest end of a grant, as a CLOCK_MONOTONIC deadline for the poll.
    pub fn next_deadline(&self) -> Option<Mono> {
        let boot = Boot::now();
        let end = self.grants.values().map(|g| g.until).min()?;
        Some(Mono::now().plus(end.since(boot)))
    }

    /// Makes the dead-man pipe if there is none yet (a leader-only run is about to
    /// start, or one runs unguarded).
    pub fn ensure_deadman(&mut self) -> std::io::Result<()> {
        if self.deadman.is_none() {
            self.deadman = Some(Deadman::new()?);
        }
        Ok(())
    }

    /// Forks a guard for the run of `lease` led by `pid` (`Deadman::arm`), or `None`
    /// when there is no dead-man pipe.
    pub fn guard(
        &mut self,
        lease: &str,
        pid: i32,
        cgroup: Option<&std::path::Path>,
    ) -> Option<Result<i32, String>> {
        (self.deadman.as_mut()).map(|d| d.arm(lease, pid, cgroup))
    }

    /// What this part carries across `reexec`, naming its fds in `fds`.
    pub fn handoff<'a>(&'a self, fds: &mut Vec<BorrowedFd<'a>>) -> Carried {
        let grants = (self.grants.iter())
            .map(|(l, g)| GrantState {
                lease: l.clone(),
                term: g.term,
                holder: g.holder.clone(),
                until: g.until,
                valid_for_ms: g.kill_grace.as_millis() as u64 * 2,
                kill_grace_ms: Some(g.kill_grace.as_millis() as u64),
            })
            .collect();
        let deadman = self.deadman.as_ref().map(|d| {
            let [r, w] = d.fds();
            fds.extend([r, w]);
            (r.as_raw_fd(), w.as_raw_fd())
        });
        let boards = (self.deadman.as_ref()).map(|d| {
            d.boards()
                .map(|(lease, fd)| {
                    fds.push(fd);
                    (lease.to_string(), fd.as_raw_fd())
                })
                .collect()
        });
        Carried {
            grants,
            deadman,
            unhealthy_at: self.unhealthy_at.clone(),
            boards,
        }
    }

    /// The part a previous image carried, and whether the guards of its runs must be
    /// armed again (an older image's guards read no board: they know no grant's end).
    /// The grants' ends are not posted yet: the coordinator posts each
    /// ([`Leases::post_grant_end`]) and replaces the guards it says.
    pub fn from_handoff(c: Carried) -> (Leases, bool) {
        let rearm = c.deadman.is_some() && c.boards.is_none();
        let deadman = c.deadman.and_then(|fds| {
            Deadman::adopt(fds, c.boards.as_deref().unwrap_or_default())
                .map_err(|e| log::warn!("the dead-man pipe was not handed over ({e})"))
                .ok()
        });
        let grants = (c.grants.into_iter())
            .map(|g| {
                let grant = Grant {
                    term: g.term,
                    holder: g.holder,
                    until: g.until,
                    kill_grace: Duration::from_millis(
                        g.kill_grace_ms.unwrap_or(g.valid_for_ms / 2),
                    ),
                };
                (g.lease, grant)
            })
            .collect();
        let leases = Leases {
            grants,
            timer: None,
            unhealthy_at: c.unhealthy_at,
            deadman,
        };
        (leases, rearm)
    }
}

/// What the leases part carries across `reexec`: flattened into the handoff's top
/// level (`handoff::Handoff`), under the names and shapes of formats 1 to 7.
#[derive(Debug, Serialize, Deserialize)]
pub struct Carried {
    grants: Vec<GrantState>,
    /// The dead-man pipe of leader-only services (read end, write end): kept open, so
    /// that their guards do not fire across the exec.
    #[serde(default)]
    deadman: Option<(RawFd, RawFd)>,
    /// When each service last turned unhealthy, and why: a leader-only one keeps its
    /// node out of its lease for its cooldown, across the exec too.
    #[serde(default)]
    unhealthy_at: BTreeMap<String, (Mono, String)>,
    /// The grant board of each lease (`deadman.rs`), kept open so that the guards and
    /// the new image share it (format 5). A supd of an older format hands over none:
    /// its guards know no grant's end and are armed again.
    #[serde(default)]
    boards: Option<Vec<(String, RawFd)>>,
}

/// One grant, as the handoff carries it.
#[derive(Debug, Serialize, Deserialize)]
struct GrantState {
    lease: String,
    term: u64,
    holder: String,
    /// CLOCK_BOOTTIME (a handoff of an older supd had CLOCK_MONOTONIC here, which is
    /// never later: its grants end early, never late).
    until: Boot,
    /// Twice the kill grace: an older supd reads half of it as the grace.
    valid_for_ms: u64,
    #[serde(default)]
    kill_grace_ms: Option<u64>,
}

/// The timer that wakes supd at a grant's end.
pub enum GrantTimer {
    /// A CLOCK_BOOTTIME timerfd (Linux 3.15).
    Boot(nix::sys::timerfd::TimerFd),
    /// Older kernels refuse CLOCK_BOOTTIME timers (EINVAL): a CLOCK_REALTIME one, armed
    /// at the same instant on the wall clock, which also runs on through a suspend.
    Wall(nix::sys::timerfd::TimerFd),
    /// No timerfd at all: grants end on the poll timeout only.
    Missing,
}

impl GrantTimer {
    /// Made once, at the first grant; says once what it falls back to.
    fn new() -> GrantTimer {
        use nix::sys::timerfd::{ClockId, TimerFd, TimerFlags};
        let flags = TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC;
        let boot_error = match TimerFd::new(ClockId::CLOCK_BOOTTIME, flags) {
            Ok(t) => return GrantTimer::Boot(t),
            Err(e) => e,
        };
        match TimerFd::new(ClockId::CLOCK_REALTIME, flags) {
            Ok(t) => {
                log::info!(
                    "no CLOCK_BOOTTIME timers ({boot_error}; Linux before 3.15): a grant's end after a suspend is noticed by a wall-clock timer, and checked on CLOCK_BOOTTIME"
                );
                GrantTimer::Wall(t)
            }
            Err(e) => {
                log::warn!(
                    "cannot make a timer for grants ({boot_error}; {e}): grants end on the poll timeout only, late by the time the machine was suspended"
                );
                GrantTimer::Missing
            }
        }
    }

    fn fd(&self) -> Option<&nix::sys::timerfd::TimerFd> {
        match self {
            GrantTimer::Boot(t) | GrantTimer::Wall(t) => Some(t),
            GrantTimer::Missing => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_older_than_the_one_held_is_refused_naming_both_terms() {
        assert_eq!(check_term("engine", None, 3), Ok(()));
        assert_eq!(
            check_term("engine", Some((3, "n1")), 3),
            Ok(()),
            "a renewal"
        );
        assert_eq!(
            check_term("engine", Some((3, "n1")), 9),
            Ok(()),
            "a newer term"
        );
        let e = check_term("engine", Some((7, "n1")), 3).expect_err("older");
        assert!(e.contains("term 3") && e.contains("term 7"), "{e}");
    }

    fn s(name: &str, unhealthy: bool, since_ms: Option<u64>) -> ServiceHealth {
        ServiceHealth {
            name: name.into(),
            unhealthy,
            since: since_ms.map(|ms| Mono(ms * 1_000_000)),
            failure: since_ms.map(|_| "health: 3 failures: HTTP 500 from 127.0.0.1:8080/".into()),
            hold: Duration::from_secs(60),
        }
    }

    #[test]
    fn leader_only_services_that_cannot_run_make_the_candidacy_failing() {
        let run = |name: &str, state: State, unhealthy: bool| ServiceRun {
            name: name.into(),
            state,
            unhealthy,
            reason: (state == State::Cooldown)
                .then(|| "crash loop: 3 restarts within 40ms (last: exit 1)".into()),
        };
        assert_eq!(failing(&[]), None);
        for state in [
            State::Running,
            State::Starting,
            State::Stopped,
            State::Backoff,
            State::Stopping,
            State::Exited,
        ] {
            assert_eq!(failing(&[run("engine", state, false)]), None, "{state:?}");
        }
        assert_eq!(
            failing(&[run("web", State::Running, false), run("engine", State::Cooldown, false)]).as_deref(),
            Some("engine is in its crash-loop cooldown (crash loop: 3 restarts within 40ms (last: exit 1))")
        );
        assert_eq!(
            failing(&[run("engine", State::Failed, false)]).as_deref(),
            Some("engine failed")
        );
        assert_eq!(
            failing(&[run("engine", State::Running, true)]).as_deref(),
            Some("engine is unhealthy")
        );
    }

    #[test]
    fn a_node_is_held_out_while_unhealthy_and_for_the_cooldown_after() {
        let at = |ms: u64| Mono(ms * 1_000_000);
        // Never unhealthy, or no leader-only service at all: a candidate.
        assert_eq!(health_hold(&[], at(0)), None);
        assert_eq!(health_hold(&[s("engine", false, None)], at(0)), None);
        // Unhealthy now: out, naming the service and its failure.
        assert_eq!(
            health_hold(
                &[s("web", false, None), s("engine", true, Some(1000))],
                at(2000)
            )
            .as_deref(),
            Some("engine is unhealthy: health: 3 failures: HTTP 500 from 127.0.0.1:8080/")
        );
        // Stopped (its health unknown) or healthy again: out until the cooldown ends.
        let held = health_hold(&[s("engine", false, Some(1000))], at(21_000));
        assert_eq!(
            held.as_deref(),
            Some("engine was unhealthy 20s ago: health: 3 failures: HTTP 500 from 127.0.0.1:8080/; a candidate again in 40s")
        );
        assert!(health_hold(&[s("engine", false, Some(1000))], at(60_999)).is_some());
        assert_eq!(
            health_hold(&[s("engine", false, Some(1000))], at(61_000)),
            None
        );
        // The longest hold of several services wins.
        let two = [s("a", false, Some(1000)), s("b", false, Some(30_000))];
        let why = health_hold(&two, at(61_000)).expect("b holds");
        assert!(why.starts_with("b was unhealthy 31s ago"), "{why}");
    }
}
