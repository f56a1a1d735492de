//! The supervisor: owns every service's state, the pid table and the edges (control
//! socket, notify socket, output pipes), and turns what happens into machine events and
//! the machine's actions into system calls.
//!
//! Invariants: a pid is in `pids` exactly while its process is unreaped; a service has at
//! most one process (it is spawned only from `stopped`); every spawn and reap rewrites
//! the pid records, so a later supd can end what this one leaves.

mod reap;
mod reload;
mod reports;
use reap::DRAIN_MAX;
mod commands;
mod down;
pub mod event_loop;
mod forks;
mod handoff;
mod health;
mod held;
mod indices;
mod kept;
mod leases;
mod log_lines;
mod metrics;
mod notify;
mod shutdown;
mod starts;
mod statedir;
mod status;
mod syslog;
mod tools;
mod waiters;

use crate::cgroup::{self, Cgroups};
use crate::config::{Config, LogMode, LogStderr, Ready, ServiceConfig};
use crate::control::Server;
use crate::fdset::FdSet;
pub use crate::instance::signal_group;
use crate::instance::Instance;
use crate::launch::{self, NotLaunched};
use crate::log_writer::LogWriter;
use crate::log_writer::{Dest, OWN_LOG};
use crate::logs::{Output, READ_MAX};
use crate::notify::NotifySocket;
use crate::records::{self, PidFile};
use crate::service::{Action, Event, Exit, Service, State, Want};
use crate::signals::Signals;
use crate::slots::{Slots, Timers};
use crate::sys::{self, Io, SpawnSpec};
use crate::time::Mono;
use crate::tool_state::StartGo;
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

pub use crate::fdset::ServiceFd;
pub use crate::slots::Slot;

struct Shutdown {
    deadline: Mono,
    code: i32,
    killed: bool,
    /// Every service was looked at once: after that, only those touched and what they
    /// come after can have become stoppable.
    looked: bool,
}

/// What supd's start found beside the config, handed to the supervisor once it is made
/// (`Supervisor::take_found`): the supervisor's fields are its own.
pub struct Found {
    /// Errors of the config at start.
    pub config_errors: Vec<String>,
    /// The files that did not load, with what stands for each.
    pub broken_files: Vec<crate::config::lastgood::BrokenFile>,
    /// Runs a previous supd left of services of a file that does not load.
    pub kept: Vec<crate::leftovers::Kept>,
    /// The state directory's lock (`None`: only a handoff without one leaves none).
    pub lock: Option<nix::fcntl::Flock<std::fs::File>>,
    /// The services' cgroups, where the machine lets supd have them.
    pub cgroups: Option<Cgroups>,
    /// The control socket could not be bound: when to try again, and the step after.
    pub socket_retry: Option<(Mono, Duration)>,
    /// What a previous supd left, to end before any service starts.
    pub cleanup: Option<crate::leftovers::Cleanup>,
    /// System mode (`--system` or `mode = "system"`).
    pub system: bool,
    /// The `listen` sockets taken over from runs a killed supd left (`kept/take.rs`).
    pub taken_sockets:
        BTreeMap<String, Vec<(crate::config::listen::ListenAddr, std::os::fd::OwnedFd)>>,
}

/// The whole supervisor.
pub struct Supervisor {
    /// The config: its services moved into the slots (`services` is empty: a
    /// service's config is its slot's `cfg`).
    cfg: Config,
    config_path: PathBuf,
    /// Errors of the config at start or of the last failed reload, for `status`.
    config_errors: Vec<String>,
    /// The files that did not load at start, with what stands for each (`lastgood.rs`).
    broken_files: Vec<crate::config::lastgood::BrokenFile>,
    /// Runs a previous supd left of services of a file that does not load: kept, each
    /// service held back until its run is ended (`held.rs`: `end_kept`).
    kept: Vec<crate::leftovers::Kept>,
    slots: Slots,
    /// The services' fds, in one epoll set kept in step with the touched slots.
    fdset: FdSet,
    /// Each service's earliest deadline (its machine's, its checks'), as of the last turn.
    timers: Timers,
    /// The starts part: the pending services, what a cut pass left, the children asked
    /// of the spawner (`starts.rs`; the pass is `supervisor/starts.rs`).
    starts: crate::starts::Starts,
    /// The services that come `after` each service; `None` once configs changed.
    dependents: Option<BTreeMap<String, Vec<String>>>,
    /// Each tool's services (a probation of it counts only while they run); `None` once
    /// configs changed. Entries are checked against their slots on use.
    tool_index: Option<BTreeMap<String, Vec<String>>>,
    /// A scan of all children is owed by then: a SIGCHLD that told of a leader watched by
    /// its pidfd may have stood for other exits too.
    scan_owed: Option<Mono>,
    pids: BTreeMap<i32, String>,
    /// The one socket of a supd from before per-service sockets, handed over by its
    /// `reexec` (the services it started still send there).
    legacy_notify: crate::notify::Legacy,
    /// The syslog listener (`[supd] syslog`) and its senders' rate bound.
    syslog: crate::syslog::Syslog,
    signals: Signals,
    shutdown: Option<Shutdown>,
    /// Set when the loop must end, with supd's exit status.
    exit: Option<i32>,
    /// The control part: the control socket and its clients, answers owed to parked
    /// clients, stops and restarts held for their dependents (`control.rs`).
    control: crate::control::Control,
    /// Services an operator stopped: they stay down across restarts of supd.
    down: BTreeSet<String>,
    /// The admin-down marks could not be written: when to try again, the delay, and why.
    down_retry: Option<(Mono, std::time::Duration, String)>,
    started: Mono,
    buf: Vec<u8>,
    /// The tools part: each tool's state (record, probation deadlines, a change waiting
    /// for its record, starts held for it) and the helper processes (`tool_state.rs`;
    /// carried out on the slots by `supervisor/tools.rs`).
    tools: crate::tool_state::Tools,
    /// The leases part: grants, their timer, the dead-man guards' pipe and boards, the
    /// health holds (`leases.rs`; carried out on the slots by `supervisor/leases.rs`).
    leases: crate::leases::Leases,
    /// The state directory's lock, held for the whole life of supd (and its re-executions).
    lock: Option<nix::fcntl::Flock<std::fs::File>>,
    /// The process that writes the log files.
    log_writer: LogWriter,
    /// The program to re-execute by default: what supd was started as.
    program: PathBuf,
    /// System mode (`--system`).
    system: bool,
    /// When this program image started (not restored by a reexec, unlike `started`).
    image_started: Mono,
    /// What ends the system once every service is down (system mode).
    final_action: Option<crate::pid1::Final>,
    /// The services' cgroups, where the machine lets supd have them.
    cgroups: Option<Cgroups>,
    /// Wakes the loop when the state directory changes under supd.
    state_watch: Option<crate::statedir::StateWatch>,
    /// The state directory's lock went with the directory and is not held again yet.
    lock_lost: bool,
    /// Services whose leader was reaped while other processes of that run remain.
    draining: BTreeSet<String>,
    /// The control socket could not be bound: when to try again, and the step after.
    socket_retry: Option<(Mono, Duration)>,
    /// What a previous supd left, being ended: no service starts until it is over.
    cleanup: Option<crate::leftovers::Cleanup>,
    /// When to look at `draining` again, and the step after that (a safety net for
    /// members whose exit supd is not told of: SIGCHLD is the usual news).
    drain_retry: Option<(Mono, Duration)>,
    /// A reload's helper reading the config (`reload.rs`).
    reload_job: Option<crate::reload::Job>,
    /// Health check commands under way: pid to service (`health/watch.rs`).
    check_pids: crate::health::CheckPids,
    /// The metrics part: supd's own counts, and when `metrics_file` is written.
    metrics: crate::metrics::file::MetricsFile,
}

impl Supervisor {
    /// A supervisor for `cfg`, with nothing started yet.
    pub fn new(
        cfg: Config,
        config_path: PathBuf,
        server: Server,
        legacy_notify: Option<NotifySocket>,
        signals: Signals,
        fdset: FdSet,
        handed_over: bool,
    ) -> Self {
        let down = records::read_down(&cfg.supd.state_dir);
        // Before /proc is mounted (as an init), the path supd was started by.
        let program = std::env::current_exe()
            .ok()
            .or_else(|| {
                std::env::args_os()
                    .next()
                    .map(PathBuf::from)
                    .filter(|p| p.is_absolute())
            })
            .unwrap_or_else(|| "/usr/sbin/supd".into());
        let mut sup = Supervisor {
            cfg,
            config_path,
            config_errors: Vec::new(),
            broken_files: Vec::new(),
            kept: Vec::new(),
            slots: Slots::default(),
            fdset,
            timers: Timers::default(),
            starts: crate::starts::Starts::default(),
            dependents: None,
            tool_index: None,
            scan_owed: None,
            pids: BTreeMap::new(),
            legacy_notify: crate::notify::Legacy::new(legacy_notify),
            syslog: Default::default(),
            signals,
            shutdown: None,
            exit: None,
            control: crate::control::Control::new(server),
            down,
            down_retry: None,
            started: Mono::now(),
            buf: vec![0; READ_MAX],
            tools: crate::tool_state::Tools::default(),
            leases: crate::leases::Leases::default(),
            lock: None,
            // The writer is this program too: as an init, before /proc is mounted, the
            // path supd was started by (/init), not /usr/sbin/supd (not there in an
            // initramfs: the lines of the first services were dropped).
            log_writer: LogWriter::new(program.clone()),
            program,
            system: false,
            image_started: Mono::now(),
            final_action: None,
            cgroups: None,
            state_watch: None,
            lock_lost: false,
            draining: BTreeSet::new(),
            drain_retry: None,
            socket_retry: None,
            cleanup: None,
            reload_job: None,
            check_pids: Default::default(),
            metrics: Default::default(),
        };
        // Moved, not copied: each service's config lives in its slot only (a second
        // copy of every one cost about a kilobyte a service).
        let defs = std::mem::take(&mut sup.cfg.services);
        for def in defs.into_values() {
            sup.add_slot(def);
        }
        sup.load_tools(Mono::now(), handed_over);
        sup
    }

    /// Takes what supd's start found (`Found`), and watches the state directory.
    pub fn take_found(&mut self, found: Found) {
        self.config_errors = found.config_errors;
        self.broken_files = found.broken_files;
        self.kept = found.kept;
        // Only a handoff without a lock leaves none here: the services already run, so
        // it is said, and taken again at the next change of state_dir.
        self.lock_lost = found.lock.is_none();
        self.lock = found.lock;
        self.cgroups = found.cgroups;
        self.socket_retry = found.socket_retry;
        self.cleanup = found.cleanup;
        // Only for a service this supd starts: one wanted down (`autostart = false`,
        // stopped by an operator, waiting for its lease) would hold them with nobody to
        // read the backlog; they close with the left run, and a start binds them anew.
        for (name, taken) in found.taken_sockets {
            match self.slots.get_mut(&name) {
                Some(slot) if slot.svc.want == Want::Up => slot.kept.take_over(taken),
                _ => log::info!("{name}: not started: the sockets of the run left are not kept"),
            }
        }
        self.state_watch = match crate::statedir::StateWatch::new(&self.cfg.supd.state_dir) {
            Ok(w) => Some(w),
            Err(e) => {
                log::warn!(
                    "cannot watch {} ({e}): its removal is noticed only at the next start of a service",
                    self.cfg.supd.state_dir.display()
                );
                None
            }
        };
        self.system = found.system;
    }

    /// The mode the config asks for (`--system` may ask for system mode besides).
    pub fn mode(&self) -> crate::config::Mode {
        self.cfg.supd.mode
    }

    /// The program a `reexec` runs by default: what supd was started as.
    pub fn program(&self) -> &std::path::Path {
        &self.program
    }

    /// The end of supd once its loop is over: helpers (an install's copy, a reload's
    /// reader) ended, staging deleted; its own log flushed; in system mode the system
    /// ended (an init never just exits: whatever ended the loop ends the system); the
    /// socket at `socket` and the cgroups removed.
    pub fn end(&mut self, socket: &std::path::Path) {
        self.end_helpers();
        self.flush_own_log(Mono::now());
        if self.system {
            let action = self.final_action.unwrap_or(crate::pid1::Final::Poweroff);
            crate::pid1::end(action, &mut self.signals);
        }
        let _ = std::fs::remove_file(socket);
        self.close_syslog();
        if let Some(c) = &self.cgroups {
            c.remove();
        }
    }

    /// Adds a service, wanted up when `autostart` and not stopped by an operator (a
    /// leader-only service: once its lease is granted).
    pub fn add_slot(&mut self, cfg: ServiceConfig) {
        self.dependents = None;
        self.tool_index = None;
        let up = cfg.autostart && !self.down.contains(&cfg.name) && cfg.leader_only.is_none();
        let want = if up { Want::Up } else { Want::Down };
        let mut svc = Service::new(want);
        if let Some(l) = &cfg.leader_only {
            svc.reason = Some(format!("waiting for lease '{l}'"));
        }
        let slot = Slot {
            id: 0,
            svc,
            cfg,
            output: None,
            ready_pipe: None,
            version: None,
            notify: Default::default(),
            pid_file: None,
            instance: None,
            leader: None,
            exec: None,
            exec_error: None,
            ran_as: None,
            removed: false,
            health: Default::default(),
            forking: None,
            limits_written: Default::default(),
            kept: Default::default(),
        };
        self.slots.insert(slot);
        self.metrics.changed();
    }

    /// Feeds one event to a service's machine and carries out its actions.
    pub fn apply(&mut self, name: &str, ev: Event, now: Mono) {
        // Whatever happens to it, a child asked for before is not the one to run now.
        self.drop_fork(name);
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        let (from, restarts) = (slot.svc.state, slot.svc.restarts_total);
        let actions = slot.svc.step(&slot.cfg, ev, now);
        let (instance, tool, to) = (slot.instance.clone(), slot.cfg.tool.clone(), slot.svc.state);
        let restarted = slot.svc.restarts_total.saturating_sub(restarts);
        self.let_go_when_done(name);
        self.metrics.restarted(u64::from(restarted));
        // The change is told before its consequences (a rollback restarts this service).
        if from != to {
            self.state_changed(name, from, to);
        }
        // What a watched version's verdict rests on is durable before it is acted on.
        if tool.is_some() {
            self.note_history(name, now);
        }
        let mut probation_ended = false;
        for a in actions {
            if let Action::Unhealthy(why) = &a {
                self.leases.note_unhealthy(name, why, now);
            }
            match a {
                Action::Signal(sig) => {
                    if let Some(i) = instance.as_ref().filter(|i| !i.leader_gone()) {
                        i.signal(sig, &self.pids);
                    }
                }
                Action::CrashLoop(why) | Action::NotReady(why) | Action::Unhealthy(why) => {
                    if let Some(t) = &tool {
                        probation_ended |= self.probation_failed(t, &format!("{name}: {why}"), now);
                    }
                }
                // A probation's end decides instead: the version was at fault, not the
                // container.
                Action::Shutdown(_) if probation_ended => {}
                Action::Shutdown(code) => {
                    log::error!(
                        "{name}: {}",
                        self.slots[name]
                            .svc
                            .reason
                            .as_deref()
                            .unwrap_or("crash loop")
                    );
                    self.begin_shutdown(code, now);
                }
            }
        }
    }

    fn state_changed(&mut self, name: &str, from: State, to: State) {
        self.metrics.changed();
        let slot = &self.slots[name];
        let reason = slot.svc.reason.clone();
        match (to, &reason) {
            (State::Failed | State::Backoff | State::Cooldown, Some(r)) => {
                log::warn!("{name}: {} ({r})", to.as_str())
            }
            (_, Some(r)) => log::info!("{name}: {} -> {} ({r})", from.as_str(), to.as_str()),
            (_, None) => log::info!("{name}: {} -> {}", from.as_str(), to.as_str()),
        }
        let event = json!({
            "event": "state",
            "service": name,
            "from": from.as_str(),
            "to": to.as_str(),
            "pid": slot.svc.pid,
            "version": slot.version,
            "reason": reason,
            "time": unix_ms(),
        });
        self.control.broadcast(&crate::protocol::line(event));
    }

    /// Starts a pending service now.
    fn spawn(&mut self, name: &str, now: Mono) {
        let notify_path = match self.notify_path(name) {
            Ok(p) => p,
            Err(why) => return self.apply(name, Event::SpawnFailed(why), now),
        };
        let Some(slot) = self.slots.get(name) else {
            return;
        };
        let plan = launch::resolve(&slot.cfg, &self.cfg.supd, notify_path.as_deref());
        if let (Some(tool), Ok(Some(version))) = (
            slot.cfg.tool.clone(),
            plan.as_ref().map(|p| p.version.clone()),
        ) {
            match self.check_start(&tool, name, &version, now) {
                StartGo::AsPlanned => {}
                StartGo::Replan => {
                    // `current` was switched back from a bad version: plan again (once).
                    let again = launch::resolve(
                        &self.slots[name].cfg,
                        &self.cfg.supd,
                        notify_path.as_deref(),
                    );
                    return self.spawn_planned(name, again, now);
                }
                StartGo::Held(why) => return self.apply(name, Event::Unavailable(why), now),
            }
        }
        self.spawn_planned(name, plan, now)
    }

    fn spawn_planned(&mut self, name: &str, plan: Result<launch::Launch, NotLaunched>, now: Mono) {
        let plan = match plan {
            Ok(p) => p,
            Err(NotLaunched::NoVersion(why)) => {
                return self.apply(name, Event::Unavailable(why), now)
            }
            Err(NotLaunched::Failed(why)) => return self.apply(name, Event::SpawnFailed(why), now),
        };
        // Made by supd; the child gives it to the service's user (it looks the user up).
        if let Err(why) = self.ensure_notify(name, None) {
            return self.apply(name, Event::SpawnFailed(why), now);
        }
        // Made by supd at each start (`runtime_dir`), given to the user by the child too.
        let run_dir = match self.slots.get(name).and_then(|s| s.cfg.runtime_dir.clone()) {
            Some(d) => match launch::make_runtime_dir(&d) {
                Ok(dir) => Some(dir),
                Err(why) => return self.apply(name, Event::SpawnFailed(why), now),
            },
            None => None,
        };
        let give: Vec<std::path::PathBuf> = plan
            .creds
            .as_ref()
            .and_then(|c| c.user.as_ref())
            .and_then(|_| {
                self.slots
                    .get(name)
                    .and_then(|s| s.notify.path())
                    .map(|p| p.to_path_buf())
            })
            .into_iter()
            .chain(run_dir)
            .collect();
        let mut plan = plan;
        if let Some(term) = self
            .slots
            .get(name)
            .and_then(|s| s.cfg.leader_only.as_deref())
            .and_then(|l| self.leases.term(l))
        {
            plan.env.push(("SUP_LEASE_TERM".into(), term.to_string()));
        }
        // A leader-only run gets its dead-man guard before its program may start.
        let leader_only = self
            .slots
            .get(name)
            .is_some_and(|s| s.cfg.leader_only.is_some());
        if leader_only {
            if let Err(e) = self.leases.ensure_deadman() {
                return self.apply(
                    name,
                    Event::SpawnFailed(format!("cannot make the dead-man pipe: {e}")),
                    now,
                );
            }
        }
        // Its `listen` sockets (bound once, held between runs) and stored fds, as 3..
        let mut give = give;
        let pass = match self.pass_kept(name, &mut plan, &mut give) {
            Ok(fds) => fds,
            Err(why) => return self.apply(name, Event::SpawnFailed(why), now),
        };
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        let mut own_pid_env = Vec::new();
        if plan.watchdog_pid {
            own_pid_env.push("WATCHDOG_PID".to_string());
        }
        if !pass.is_empty() {
            own_pid_env.push("LISTEN_PID".to_string());
        }
        let (stdout, stderr) = match streams(slot) {
            Ok(s) => s,
            Err(e) => {
                return self.apply(
                    name,
                    Event::SpawnFailed(format!("cannot set up its output: {e}")),
                    now,
                )
            }
        };
        let mut ready = None;
        if let Ready::Fd(n) = slot.cfg.ready {
            match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK) {
                Ok((r, w)) => ready = Some((r, w, n)),
                Err(e) => {
                    return self.apply(
                        name,
                        Event::SpawnFailed(format!("cannot make its readiness pipe: {e}")),
                        now,
                    )
                }
            }
        }
        let state_dir = self.cfg.supd.state_dir.clone();
        // Made now: a state directory it cannot be made in fails the start before a fork.
        if let Err(why) = pid_file_of(slot, &state_dir) {
            return self.apply(name, Event::SpawnFailed(why), now);
        }
        // The child is forked into its cgroup where the kernel can (no move, no wait for
        // one: `sys::BornIn`), else it moves itself in (`SpawnSpec::join`); a refused move
        // is learnt from its exec report (`read_exec_report`), before its program could
        // have started anything.
        let (cgroup_dir, join, born_in) = match self.cgroups.as_ref().map(|c| c.service_dir(name)) {
            None => (None, None, false),
            Some(dir) => {
                // A leader-only run's guard may have killed the cgroup behind supd's back.
                let born_in = cgroup::fit_to_be_born_in(&dir, leader_only);
                match cgroup::prepare(&dir).and_then(|()| cgroup::dir_fd(&dir)) {
                    Ok(f) => {
                        self.syslog.started_in(&dir, || cgroup::id_of(&f));
                        (Some(dir), Some(f), born_in)
                    }
                    Err(e) => {
                        log::warn!(
                            "{name}: cannot use its cgroup {}: {e}; it runs in its process group only",
                            dir.display()
                        );
                        (None, None, false)
                    }
                }
            }
        };
        // Its limits, written at each start; on a hybrid host the child joins the v1
        // hierarchies they are taken from (`cgroup/limits.rs`).
        let mut also_join = Vec::new();
        if cgroup_dir.is_none() && slot.cfg.resources.any() {
            // The config check passed them (a reload turned `cgroups` on, say), but
            // this supd has no cgroup for the service.
            log::warn!(
                "{name}: its limits do not hold: it runs without a cgroup (supd set up none for its services at its start; restart supd)"
            );
        }
        if let (Some(c), Some(_)) = (self.cgroups.as_ref(), cgroup_dir.as_ref()) {
            let new = slot.cfg.resources;
            if new.any() || slot.limits_written.any() {
                let (joins, problems) = c.apply(name, &new, &slot.limits_written);
                slot.limits_written = new;
                for p in problems {
                    log::warn!("{name}: {p}: its limits may not hold");
                }
                for dir in joins {
                    match cgroup::dir_fd(&dir) {
                        Ok(fd) => also_join.push(fd),
                        Err(e) => log::warn!(
                            "{name}: cannot open {}: {e}: its limits there do not hold",
                            dir.display()
                        ),
                    }
                }
            } else {
                // No limits now: what is left of v1 cgroups a run had (its limits taken
                // away by a reload, or by the config a killed or re-executed supd
                // started on) goes, now that its last run is over (rmdir refuses a
                // populated one); else `resources` would read them, empty.
                c.remove_v1(name);
            }
        }
        let spec = SpawnSpec {
            program: plan.program,
            args: plan.args,
            env: plan.env,
            cwd: plan.cwd,
            stdout,
            stderr,
            creds: plan.creds,
            ready_fd: ready.as_ref().map(|(_, w, n)| (sys::raw(w), *n)),
            give,
            tuning: plan.tuning,
            own_pid_env,
            pass,
            dies_with_supd: false,
            join,
            born_in,
            also_join,
        };
        let forking = |pending| crate::starts::Forking {
            name: name.to_string(),
            version: plan.version,
            cgroup: cgroup_dir,
            leader_only,
            ready: ready.map(|(r, w, _)| (r, w)),
            pending,
        };
        match crate::spawner::begin_service(spec) {
            Ok(crate::spawner::Begun::Forked(pid, pending)) => {
                self.release_child(forking(pending), pid, now)
            }
            Ok(crate::spawner::Begun::Asked(ticket, pending)) => {
                slot.forking = Some(ticket);
                self.starts.asked(ticket, forking(pending));
            }
            Err(why) => self.apply(name, Event::SpawnFailed(why), now),
        }
    }

    /// Binds the control socket that could not be bound before (supd stands in with an
    /// unnamed one meanwhile, and supervises).
    fn retry_socket(&mut self, now: Mono) {
        let Some((_, step)) = self.socket_retry else {
            return;
        };
        let path = self.control.socket_path().to_path_buf();
        // socket_group as looked up at the start: supd's loop never reads the user
        // database.
        let group = self.control.socket_group().cloned();
        let control = self.control.control_group().cloned();
        match Server::bind(&path, group.as_ref(), control.as_ref()) {
            Ok(server) => {
                log::info!("serving {} at last", path.display());
                crate::sys::set_listener_fd(std::os::fd::AsRawFd::as_raw_fd(&server.fd()));
                self.control.set_server(server);
                self.socket_retry = None;
            }
            Err(e) => {
                let next = (step * 2).min(Duration::from_secs(60));
                log::warn!(
                    "cannot serve {} yet: {e}; trying again in {}",
                    path.display(),
                    crate::time::Human(next)
                );
                self.socket_retry = Some((now.plus(next), next));
            }
        }
    }

    /// Fires every deadline that has come.
    pub fn fire_timers(&mut self, now: Mono) {
        self.expire_grants(now);
        if crate::spawner::deadline().is_some_and(|at| at <= now) {
            self.on_spawner(now);
        }
        if self.socket_retry.is_some_and(|(at, _)| at <= now) {
            self.retry_socket(now);
        }
        if self.cleanup.as_ref().is_some_and(|c| c.wake() <= now) {
            self.cleanup_step(now);
        }
        if let Some((at, step)) = self.drain_retry.filter(|(at, _)| *at <= now) {
            let _ = at;
            for i in self
                .draining
                .iter()
                .filter_map(|n| self.slots.get(n)?.instance.as_ref())
            {
                // Exact: only this run's processes are in its cgroup (with `kill_mode
                // = "group"`, those of its cgroup in its process group).
                i.kill_all(&self.pids);
            }
            self.drain_retry = None;
            if self.scan_owed.is_some() {
                // What is left of a run may be zombies of its own that supd adopted
                // (their parent died with them), whose SIGCHLD folded into the leader's:
                // only the owed scan reaps them, and the run is not over until it does.
                // Brought forward to this retry (on its backoff), not a second later.
                self.reap(now);
            } else {
                self.check_draining(now);
            }
            if let Some(r) = self.drain_retry.as_mut() {
                let next = (step * 2).min(DRAIN_MAX);
                *r = (now.plus(next), next);
            }
        }
        if self.scan_owed.is_some_and(|at| at <= now) {
            self.reap(now);
        }
        for name in self.timers.due(now) {
            if self
                .slots
                .get(&name)
                .and_then(|s| s.svc.deadline)
                .is_some_and(|d| d <= now)
            {
                self.apply(&name, Event::Timer, now);
            }
        }
        self.fire_health(now);
        self.shutdown_timers(now);
        self.cut_handshakes(now);
    }

    /// The earliest deadline, for the poll timeout (after [`Supervisor::sync_touched`]).
    pub fn next_deadline(&self) -> Option<Mono> {
        let services = self.timers.first().into_iter().chain(self.scan_owed);
        let shutdown = self.shutdown_deadline();
        let now_if_more = self.starts.more_to_start().then_some(Mono(0));
        services
            .chain(now_if_more)
            .chain(shutdown)
            .chain(self.drain_retry.map(|(at, _)| at))
            .chain(self.cleanup.as_ref().map(|c| c.wake()))
            .chain(self.socket_retry.map(|(at, _)| at))
            .chain(self.next_probation_deadline())
            .chain(self.leases.next_deadline())
            .chain(crate::spawner::deadline())
            .chain(self.handshake_deadline())
            .chain(self.control.deadlines())
            .chain(self.metrics_deadline())
            .min()
    }

    /// Starts what may start, stops what must stop, answers parked clients. Runs after
    /// every batch of events, until nothing changes.
    pub fn settle(&mut self, now: Mono) {
        self.retry_down(now);
        self.sweep_tools();
        self.check_probations(now);
        if self.shutdown.is_some() {
            self.control.clear_held();
            // Nothing starts any more: a pass cut at its limit before the shutdown must
            // not keep asking for the next turn at once (the loop would spin until the
            // last service is down).
            self.starts.no_more();
            self.shutdown_step(now);
        } else {
            self.run_queued(now);
            self.start_some(now);
        }
        // A removed service goes once it is down: it was touched on its way there.
        let gone: Vec<String> = (self.slots.touched().iter())
            .filter(|n| self.slots.get(*n).is_some_and(|s| s.removed && s.is_down()))
            .cloned()
            .collect();
        for name in gone {
            log::info!("{name}: removed");
            records::remove_pid_file(&self.cfg.supd.state_dir, &name);
            if let Some(c) = &self.cgroups {
                cgroup::remove(&c.service_dir(&name));
                cgroup::remove(&c.check_dir(&name));
                c.remove_v1(&name);
                for dir in [c.service_dir(&name), c.check_dir(&name)] {
                    if let Some(d) = dir.file_name() {
                        self.syslog.cgroups.forget(&d.to_string_lossy());
                    }
                }
            }
            if let Some(slot) = self.slots.remove(&name) {
                self.fdset.sync(slot.id, &[]);
            }
            self.metrics.changed();
        }
        // Checks begin and end with their service's run (spawned or stopped above).
        self.sync_health(now);
        self.answer_waiters(now);
    }

    /// Carries out the held stops and restarts whose dependents are down.
    fn run_queued(&mut self, now: Mono) {
        loop {
            let slots = &self.slots;
            let is_down = |d: &str| slots.get(d).is_none_or(|s| s.is_down());
            let Some(q) = self.control.next_ready(is_down) else {
                break;
            };
            // Those it held down (`startable`) are looked at again by this pass.
            for d in &q.until_down {
                let _ = self.slots.get_mut(d);
            }
            if self.slots.get(&q.name).is_some_and(|s| !s.removed) {
                self.apply(&q.name, q.event, now);
            }
        }
    }

    /// Reads a service's output (`err`: its stderr kept apart): its lines go to
    /// followers and to the log writer, for its file with `log = "file"` (as the config
    /// is now: a reload's `log_dir` or rotation settings apply from the next line on), or
    /// for supd's stdout (stderr kept apart: supd's stderr) with `log = "inherit"`. Lines
    /// the writer cannot take are counted.
    pub fn on_output(&mut self, name: &str, err: bool) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        let Some(out) = slot.output.as_mut() else {
            return;
        };
        let lines = out.read_available(name, &mut self.buf, err);
        if !lines.is_empty() {
            self.deliver(name, &lines, err);
        }
    }

    /// Sends stored lines of `name` (stamped, as its ring keeps them) where its log
    /// goes: log_dir/NAME.log, or supd's stdout (`err`: stderr) without their stamps
    /// with `log = "inherit"`; then to its followers. Lines the writer cannot take are
    /// counted. Output, run markers and syslog messages all take this one way.
    pub(crate) fn deliver(&mut self, name: &str, lines: &[String], err: bool) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        let sent = match slot.cfg.log {
            LogMode::File => {
                let path = self.cfg.supd.log_dir.join(format!("{name}.log"));
                let (max, keep) = (slot.cfg.log_max_size, slot.cfg.log_keep);
                let dest = Dest::file(path, max, keep, self.control.group());
                self.log_writer.send(name, &dest, lines, Mono::now())
            }
            LogMode::Inherit => {
                let texts: Vec<String> = lines
                    .iter()
                    .map(|l| crate::logs::text_of(l).0.to_string())
                    .collect();
                self.log_writer
                    .send(name, &Dest::console(err), &texts, Mono::now())
            }
            LogMode::Null => true,
        };
        if let (false, Some(out)) = (sent, slot.output.as_mut()) {
            out.dropped += lines.len() as u64;
        }
        self.control.broadcast_log(name, lines);
    }

    /// Hands what supd logged since the last turn to the log writer, for `[supd]
    /// log_file` (as the config is now); without one, it is let go.
    pub fn flush_own_log(&mut self, now: Mono) {
        let lines = crate::logging::take_kept();
        let Some(path) = self.cfg.supd.log_file.clone() else {
            return;
        };
        if lines.is_empty() {
            return;
        }
        let s = &self.cfg.supd;
        let dest = Dest::file(path, s.log_max_size, s.log_keep, self.control.group());
        self.log_writer.send(OWN_LOG, &dest, &lines, now);
    }

    /// Reads the log writer's reports: lines it could not write count as dropped.
    pub fn on_log_reports(&mut self, now: Mono) {
        for (name, n) in self.log_writer.on_reports(now) {
            if let Some(out) = self.slots.get_mut(&name).and_then(|s| s.output.as_mut()) {
                out.dropped += n;
            }
        }
    }
}

/// The record of a service's process, made (or made again) as needed: a record
/// whose file was removed or replaced (the state directory was deleted, or moved away and
/// made anew) would be written where no later supd looks, so it is noticed, said, and
/// the record made again in the state directory as it is now.
pub(crate) fn pid_file_of<'a>(
    slot: &'a mut Slot,
    state_dir: &std::path::Path,
) -> Result<&'a PidFile, String> {
    let name = &slot.cfg.name;
    if slot.pid_file.as_ref().is_some_and(|f| !f.is_current()) {
        log::warn!(
            "{name}: its pid record in {} was removed or replaced; writing it anew",
            state_dir.display()
        );
        slot.pid_file = None;
    }
    if slot.pid_file.is_none() {
        let f = PidFile::open(state_dir, name).map_err(|e| {
            format!(
                "cannot open its pid record in {}: {e}; not started (a service never runs unrecorded)",
                state_dir.display()
            )
        })?;
        slot.pid_file = Some(f);
    }
    slot.pid_file
        .as_ref()
        .ok_or_else(|| format!("{name}: no pid record"))
}

/// stdout and stderr for a new process of `slot`, creating its output pipes if needed
/// (both `file` and `inherit` are read by supd: the lines of `inherit` go to supd's own
/// output prefixed with the service's name, through the log writer).
fn streams(slot: &mut Slot) -> std::io::Result<(Io, Io)> {
    if slot.cfg.log == LogMode::Null {
        slot.output = None;
        return Ok((Io::Null, Io::Null));
    }
    let apart = slot.cfg.log_stderr == LogStderr::Marked;
    match slot.output.as_mut() {
        Some(out) => out.set_stderr_apart(apart)?,
        None => slot.output = Some(Box::new(Output::new(apart)?)),
    }
    let out = slot
        .output
        .as_ref()
        .ok_or_else(|| std::io::Error::other("no output pipe"))?;
    let (o, e) = out.writers()?;
    Ok((Io::Fd(o), Io::Fd(e)))
}

/// Milliseconds since the Unix epoch, for event times.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
