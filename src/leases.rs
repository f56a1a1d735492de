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

use crate::protocol::{Error, ErrorKind};
use crate::service::{Event, State, Want};
use crate::supervisor::{unix_ms, Supervisor};
use crate::time::{Boot, Mono};
use crate::upgrade::Phase;
use serde_json::{json, Value};
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

impl Supervisor {
    fn known_lease(&self, lease: &str) -> Result<(), Error> {
        if self.cfg.leases.contains_key(lease) {
            Ok(())
        } else {
            Err(Error::new(
                ErrorKind::UnknownLease,
                format!("no [lease.{lease}] in the config"),
            ))
        }
    }

    /// The services that run only while this node holds `lease`.
    pub fn leader_only(&self, lease: &str) -> Vec<String> {
        self.slots
            .iter()
            .filter(|(_, s)| s.cfg.leader_only.as_deref() == Some(lease))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Whether this node holds a valid grant for `lease` now (the grant's own clock is
    /// read: `now` is on CLOCK_MONOTONIC).
    pub fn holds(&self, lease: &str, _now: Mono) -> bool {
        let now = Boot::now();
        self.grants.get(lease).is_some_and(|g| g.until > now)
    }

    /// Whether a leader-only service of `lease` runs `tool`: its probation proves itself
    /// only while this node leads, so the candidacy offers the lease on trial.
    fn runs_leader_only(&self, lease: &str, tool: &str) -> bool {
        self.leader_only(lease)
            .iter()
            .any(|n| self.slots[n].cfg.tool.as_deref() == Some(tool))
    }

    /// A service turned unhealthy (its check failed `failures` times, or its watchdog
    /// was missed): remembered for the candidacy of its lease.
    pub fn note_unhealthy(&mut self, name: &str, why: &str, now: Mono) {
        self.unhealthy_at
            .insert(name.to_string(), (now, why.to_string()));
    }

    /// The health of the leader-only services of `lease`, for a candidacy.
    fn leader_only_health(&self, lease: &str) -> Vec<ServiceHealth> {
        self.leader_only(lease)
            .into_iter()
            .map(|name| {
                let hold = self.slots[&name].cfg.policy.cooldown;
                let last = self.unhealthy_at.get(&name);
                // A verdict about the run under way: a stopped service keeps its last
                // one, which the hold below speaks for.
                let up = matches!(
                    self.slots[&name].svc.state,
                    State::Starting | State::Running
                );
                let unhealthy = up
                    && self
                        .health_of(&name)
                        .is_some_and(|h| h.health == crate::health::Health::Unhealthy);
                ServiceHealth {
                    unhealthy,
                    since: last.map(|(at, _)| *at),
                    failure: last.map(|(_, why)| why.clone()),
                    name,
                    hold,
                }
            })
            .collect()
    }

    /// `lease-candidacy`: this node's version of the lease's tool, and whether it may lead.
    /// `healthy` is false (with the `reason`) while a leader-only service of the lease is
    /// unhealthy, or was so less than its `cooldown` ago ([`health_hold`]); `failing`
    /// says why one cannot run now (failed, in its crash-loop cooldown, unhealthy:
    /// [`failing`]), null when none.
    pub fn candidacy(&mut self, lease: &str, now: Mono) -> Result<Value, Error> {
        self.known_lease(lease)?;
        let health = self.leader_only_health(lease);
        let hold = health_hold(&health, now);
        let runs: Vec<ServiceRun> = health
            .iter()
            .map(|h| ServiceRun {
                name: h.name.clone(),
                state: self.slots[&h.name].svc.state,
                unhealthy: h.unhealthy,
                reason: self.slots[&h.name].svc.reason.clone(),
            })
            .collect();
        let mut c = self.candidacy_of_tool(lease, now)?;
        c["healthy"] = json!(hold.is_none());
        c["reason"] = json!(hold);
        c["failing"] = json!(failing(&runs));
        Ok(c)
    }

    /// The candidacy's version, and whether it is committed, running and irreversible;
    /// `trial` when the tool waits in a probation that a leader-only service of the lease
    /// must pass, which only leading lets it run (sup-lease(8), THE RULE).
    fn candidacy_of_tool(&mut self, lease: &str, now: Mono) -> Result<Value, Error> {
        let tool = self.cfg.leases[lease].tool.clone();
        let Some(tool) = tool else {
            return Ok(
                json!({"lease": lease, "tool": null, "version": null, "committed": true, "running": true, "irreversible": false}),
            );
        };
        self.ensure_tool(&tool, now);
        let r = &self.tools[&tool].record;
        let version = r
            .current
            .clone()
            .or_else(|| crate::versions::current(&self.cfg.supd.tools_dir, &tool));
        let irreversible = version.as_ref().is_some_and(|v| {
            r.irreversible.contains(v)
                || crate::versions::irreversible(
                    &crate::versions::tool_dir(&self.cfg.supd.tools_dir, &tool).join(v),
                )
                .unwrap_or(false)
        });
        let services = self.tool_services(&tool);
        let running = !services.is_empty()
            && services
                .iter()
                .all(|n| self.slots[n].svc.state == State::Running);
        let in_probation = r.phase == Phase::Probation;
        Ok(json!({
            "lease": lease,
            "tool": tool,
            "version": version,
            "committed": !in_probation && version.is_some(),
            "running": running,
            "irreversible": irreversible,
            "trial": in_probation && version.is_some() && self.runs_leader_only(lease, &tool),
        }))
    }

    /// `lease-grant`: this node leads until the grant's end, unless granted again. A
    /// grant that is already over when it arrives is answered and changes nothing.
    pub fn grant(
        &mut self,
        lease: &str,
        holder: &str,
        term: u64,
        ends: GrantEnds,
        now: Mono,
    ) -> Result<Value, Error> {
        self.known_lease(lease)?;
        let held = (self.grants.get(lease)).map(|g| (g.term, g.holder.as_str()));
        check_term(lease, held, term).map_err(|e| {
            log::warn!("{e}");
            Error::new(ErrorKind::BadRequest, e)
        })?;
        let boot = Boot::now();
        let (until, grace) = ends.read(boot)?;
        if until <= boot {
            log::warn!("lease {lease}: a grant of term {term} arrived after its end; ignored");
            return Ok(json!({"lease": lease, "term": term, "valid_for_ms": 0}));
        }
        let d = until.since(boot);
        let old = self
            .grants
            .get(lease)
            .filter(|g| g.until > boot)
            .map(|g| g.term);
        // Newly held: its leader-only services may start (a renewal changes nothing).
        if old.is_none() {
            self.recheck_pending = true;
        }
        self.grants.insert(
            lease.to_string(),
            Grant {
                term,
                holder: holder.to_string(),
                until,
                kill_grace: grace,
            },
        );
        self.post_grant_end(lease);
        let what = if old == Some(term) {
            "renewed"
        } else {
            "granted"
        };
        if what == "granted" {
            log::info!("lease {lease}: this node leads (term {term}, holder {holder})");
        }
        self.emit_lease(lease, what, Some(term), Some(d));
        for name in self.leader_only(lease) {
            let slot = &self.slots[&name];
            if self.down.contains(&name) {
                continue;
            }
            // A new term while running: the services restart with the new fencing token.
            let stale = old.is_some_and(|t| t != term) && slot.svc.pid.is_some();
            let ev = if stale { Event::Restart } else { Event::Start };
            if stale || slot.svc.want == Want::Down || slot.svc.pending() {
                self.apply(&name, ev, now);
            }
        }
        Ok(json!({"lease": lease, "term": term, "valid_for_ms": d.as_millis() as u64}))
    }

    /// `lease-grant` with `stopping`: time to stop, not to lead. The holder stepped down
    /// (`lease-release`) and keeps renewing its store lease and its key while the
    /// leader-only services stop; each renewal moves their guards' end as a grant would,
    /// so a slow stop is not cut at the last grant's end, and a frozen supd still cannot
    /// keep them past the last renewal. While a grant is held (no release under way), it
    /// is refused: it would shorten nothing and start nothing.
    pub fn grant_stopping(
        &mut self,
        lease: &str,
        term: u64,
        ends: GrantEnds,
    ) -> Result<Value, Error> {
        self.known_lease(lease)?;
        let boot = Boot::now();
        if let Some(g) = self.grants.get(lease).filter(|g| g.until > boot) {
            return Err(Error::new(
                ErrorKind::BadRequest,
                format!(
                    "lease {lease}: this node leads (term {}): a stopping grant is for a holder that released",
                    g.term
                ),
            ));
        }
        let (until, grace) = ends.read(boot)?;
        if until > boot && !self.leader_only_down(lease) {
            self.post_end(lease, until.plus(grace));
        }
        Ok(json!({"lease": lease, "term": term, "stopping": true,
                  "valid_for_ms": until.since(boot).as_millis() as u64}))
    }

    /// Posts the end of `lease`'s grant (plus its kill grace) on its board, where the
    /// guards of its runs read it (`deadman.rs`): they kill the runs there, whatever
    /// supd does meanwhile.
    pub(crate) fn post_grant_end(&mut self, lease: &str) {
        if let Some(end) = (self.grants.get(lease)).map(|g| g.until.plus(g.kill_grace)) {
            self.post_end(lease, end);
        }
    }

    /// Posts `end` on the board of `lease`.
    fn post_end(&mut self, lease: &str, end: Boot) {
        if self.deadman.is_none() {
            match crate::deadman::Deadman::new() {
                Ok(d) => self.deadman = Some(d),
                Err(e) => {
                    log::error!("cannot make the dead-man pipe: {e}; the leader-only services of {lease} cannot start");
                    return;
                }
            }
        }
        let Some(d) = self.deadman.as_mut() else {
            return;
        };
        let before = d.posted(lease);
        d.post(lease, end);
        // The guards sleep until the end they read: one moved earlier needs new guards.
        if before.is_some_and(|b| end < b) {
            self.replace_guards(lease);
        }
    }

    /// `lease-release`: stop the leader-only services now; the caller waits for them, until
    /// the time returned at the most: `RELEASE_GRACE` after the last SIGKILL is due.
    pub fn release(&mut self, lease: &str, now: Mono) -> Result<Mono, Error> {
        self.known_lease(lease)?;
        if let Some(g) = self.grants.remove(lease) {
            log::info!("lease {lease}: released (term {})", g.term);
            self.emit_lease(lease, "released", Some(g.term), None);
        }
        // A release keeps the key until the services exited: they may stop gracefully.
        self.stop_leader_only(lease, "lease released", None, now);
        let kill_at = self
            .leader_only(lease)
            .iter()
            .filter(|n| self.slots[*n].svc.state == State::Stopping)
            .filter_map(|n| self.slots[n].svc.deadline)
            .fold(now, Mono::max);
        Ok(kill_at.plus(RELEASE_GRACE))
    }

    /// The answer to a `lease-release` once the leader-only services have exited, or at
    /// `by` with the pids of what is left: a process SIGKILLed in uninterruptible sleep
    /// (a hung disk, a frozen cgroup) dies when it wakes, and runs no code of its own
    /// before; waiting for it would hold the lease on this node forever.
    pub(crate) fn release_settled(
        &self,
        lease: &str,
        by: Mono,
        now: Mono,
    ) -> Option<Result<Value, Error>> {
        if self.leader_only_down(lease) {
            return Some(Ok(json!({"lease": lease, "released": true})));
        }
        if now < by {
            return None;
        }
        let mut wedged: Vec<i32> = self
            .leader_only(lease)
            .iter()
            .filter_map(|n| self.slots[n].instance.as_ref())
            .flat_map(|i| i.pids())
            .collect();
        wedged.sort_unstable();
        wedged.dedup();
        log::warn!("lease {lease}: released with processes killed but not yet gone (uninterruptible sleep): {wedged:?}");
        Some(Ok(
            json!({"lease": lease, "released": true, "wedged": wedged}),
        ))
    }

    /// Whether every leader-only service of `lease` has exited.
    pub fn leader_only_down(&self, lease: &str) -> bool {
        self.leader_only(lease)
            .iter()
            .all(|n| self.slots[n].is_down())
    }

    /// Stops the leader-only services of `lease`; with `hurry`, SIGKILL comes after that
    /// long at the most, whatever their `stop_timeout`.
    fn stop_leader_only(&mut self, lease: &str, why: &str, hurry: Option<Duration>, now: Mono) {
        for name in self.leader_only(lease) {
            self.apply(&name, Event::Stop, now);
            if let Some(s) = self.slots.get_mut(&name) {
                s.svc.reason = Some(format!("{why}; waiting for lease '{lease}'"));
                if let (Some(h), Some(d)) = (hurry, s.svc.deadline) {
                    s.svc.deadline = Some(d.min(now.plus(h)));
                }
            }
        }
    }

    /// Ends the grants whose validity ran out: their services stop.
    pub fn expire_grants(&mut self, now: Mono) {
        let boot = Boot::now();
        let ended: Vec<(String, u64, Duration)> = self
            .grants
            .iter()
            .filter(|(_, g)| g.until <= boot)
            .map(|(l, g)| (l.clone(), g.term, g.kill_grace))
            .collect();
        for (lease, term, grace) in ended {
            self.grants.remove(&lease);
            log::warn!("lease {lease}: the grant of term {term} ran out without renewal; stopping its leader-only services");
            self.emit_lease(&lease, "expired", Some(term), None);
            // Another node may lead soon: no graceful stop past the kill grace.
            self.stop_leader_only(&lease, "lease expired", Some(grace), now);
        }
    }

    /// Arms the grant timer at the earliest grant's end, or disarms it: a machine that
    /// resumes from suspend past a grant's end wakes supd at once, where the poll
    /// timeout (CLOCK_MONOTONIC, which stops while suspended) would not.
    pub fn arm_grant_timer(&mut self) {
        let end = self.grants.values().map(|g| g.until).min();
        let Some(end) = end else {
            if let Some(t) = self.grant_timer.as_ref().and_then(GrantTimer::fd) {
                let _ = t.unset();
            }
            return;
        };
        let timer = self.grant_timer.get_or_insert_with(GrantTimer::new);
        let (t, at) = match timer {
            GrantTimer::Boot(t) => (t, end.0),
            // The same instant on the wall clock, which runs on through a suspend. A
            // step of the wall clock only moves this wake-up: the grant ends when
            // CLOCK_BOOTTIME says (`expire_grants`), the poll timeout wakes supd
            // without a suspend, and every wake-up arms the timer again.
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
    pub fn grant_timer_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.grant_timer
            .as_ref()
            .and_then(GrantTimer::fd)
            .filter(|_| !self.grants.is_empty())
            .map(|t| t.as_fd())
    }

    /// The grant timer fired: clear it (the loop then expires what has ended).
    pub fn on_grant_timer(&mut self) {
        if let Some(t) = self.grant_timer.as_ref().and_then(GrantTimer::fd) {
            let mut buf = [0u8; 8];
            let _ = nix::unistd::read(t, &mut buf);
        }
    }

    /// The earliest end of a grant, as a CLOCK_MONOTONIC deadline for the poll.
    pub fn next_grant_deadline(&self) -> Option<Mono> {
        let boot = Boot::now();
        let end = self.grants.values().map(|g| g.until).min()?;
        Some(Mono::now().plus(end.since(boot)))
    }

    /// The term a leader-only service starts with, if its lease is held.
    pub fn lease_term(&self, lease: &str, _now: Mono) -> Option<u64> {
        let boot = Boot::now();
        self.grants
            .get(lease)
            .filter(|g| g.until > boot)
            .map(|g| g.term)
    }

    fn emit_lease(
        &mut self,
        lease: &str,
        what: &str,
        term: Option<u64>,
        valid_for: Option<Duration>,
    ) {
        let e = json!({"event": "lease", "lease": lease, "what": what, "term": term,
                       "valid_for_ms": valid_for.map(|d| d.as_millis() as u64), "time": unix_ms()});
        self.server.broadcast(&crate::protocol::line(e));
    }
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
