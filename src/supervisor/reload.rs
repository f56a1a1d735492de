//! The coordinator side of `reload` (`reload.rs`): the reader forked and its answer
//! applied to the slots (services added, changed, removed; `[supd]` and the leases).

use super::Supervisor;
use crate::config::{self, Config, SupdConfig};
use crate::protocol::{Error, ErrorKind};
use crate::reload::{Delta, Finished, Job};
use crate::service::Event;
use crate::time::Mono;
use serde_json::{json, Value};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};

impl Supervisor {
    /// Asks for a reload, answered to `client` (if any: SIGHUP has none) when it is done.
    pub fn request_reload(&mut self, client: Option<(u64, Value)>, now: Mono) {
        if let Some(job) = self.reload_job.as_mut() {
            job.ask_again(client);
            return;
        }
        self.start_reload(client.into_iter().collect(), now);
    }

    /// supd is exiting: the reader under way, if any, is dropped; returns its pid, for
    /// the caller to kill and reap (`end_helpers`).
    pub(crate) fn end_reload_reader(&mut self) -> Option<i32> {
        self.reload_job.take().map(|job| job.pid())
    }

    fn start_reload(&mut self, waiting: Vec<(u64, Value)>, now: Mono) {
        match self.fork_reader() {
            Ok((pid, pipe)) => {
                log::debug!("reading {} in helper {pid}", self.config_path.display());
                self.reload_job = Some(Job::new(pid, pipe, waiting));
            }
            Err(e) => {
                log::warn!("cannot fork a reader of the config ({e}): reading it in the loop");
                let result = match config::lastgood::load_and_keep(&self.config_path) {
                    Ok(cfg) => Ok(self.delta(cfg)),
                    Err(errs) => Err(errs.iter().map(ToString::to_string).collect()),
                };
                self.finish_reload(result, waiting, now);
            }
        }
    }

    fn fork_reader(&self) -> std::io::Result<(i32, File)> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        nix::fcntl::fcntl(
            &read,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )?;
        let keep = write.as_raw_fd();
        let pid = crate::sys::fork_worker(keep, || self.read_in_helper(write))?;
        Ok((pid, File::from(read)))
    }

    /// In the helper: the config read, compared, and written to `out`; the exit status.
    fn read_in_helper(&self, out: OwnedFd) -> i32 {
        crate::failpoint::reload_gate(&self.cfg.supd.state_dir);
        let result: Result<Delta, Vec<String>> =
            match config::lastgood::load_and_keep(&self.config_path) {
                Ok(cfg) => Ok(self.delta(cfg)),
                Err(errs) => Err(errs.iter().map(ToString::to_string).collect()),
            };
        let mut out = std::io::BufWriter::new(File::from(out));
        match serde_json::to_writer(&mut out, &result).map(|()| out.flush()) {
            Ok(Ok(())) => 0,
            _ => 1,
        }
    }

    /// What `cfg` changes, relative to the slots.
    fn delta(&self, cfg: Config) -> Delta {
        let removed = self
            .slots
            .iter()
            .filter(|(name, slot)| !slot.removed && !cfg.services.contains_key(*name))
            .map(|(name, _)| name.clone())
            .collect();
        let origins = (cfg.origins.into_iter())
            .filter(|(name, o)| self.cfg.origins.get(name) != Some(o))
            .collect();
        let defs = cfg
            .services
            .into_iter()
            .filter(|(name, def)| {
                self.slots
                    .get(name)
                    .is_none_or(|s| s.removed || s.cfg != *def)
            })
            .collect();
        Delta {
            supd: cfg.supd,
            leases: cfg.leases,
            files: cfg.files,
            defs,
            removed,
            origins,
        }
    }

    /// Reads what the helper wrote; once it is all there, applies it.
    pub fn on_reload_pipe(&mut self, now: Mono) {
        let Some(job) = self.reload_job.as_mut() else {
            return;
        };
        let Some(end) = job.read() else {
            return;
        };
        let Some(job) = self.reload_job.take() else {
            return;
        };
        let Finished {
            result,
            pid,
            waiting,
            again,
        } = job.finish(end);
        let result = result.unwrap_or_else(|why| {
            Err(vec![format!(
                "{}: cannot reload: the helper reading it (pid {pid}) failed: {why}",
                self.config_path.display(),
            )])
        });
        self.finish_reload(result, waiting, now);
        if let Some(waiting) = again {
            self.start_reload(waiting, now);
        }
    }

    fn finish_reload(
        &mut self,
        result: Result<Delta, Vec<String>>,
        waiting: Vec<(u64, Value)>,
        now: Mono,
    ) {
        let answer = match result {
            Ok(_) if self.shutting_down() => {
                Err(Error::new(ErrorKind::Failed, "supd is shutting down"))
            }
            Ok(delta) => Ok(self.apply_reload(delta, now)),
            Err(msgs) => {
                for m in &msgs {
                    log::error!("reload refused: {m}");
                }
                Err(Error::new(ErrorKind::InvalidConfig, msgs.join("\n")))
            }
        };
        for (client, id) in waiting {
            self.unpark(client, &id, answer.clone(), now);
        }
    }

    /// Applies a valid config's difference: added services start, removed ones stop,
    /// changed ones restart.
    fn apply_reload(&mut self, delta: Delta, now: Mono) -> Value {
        // A new log_dir is made by the log writer (a hung one must not block supd).
        self.warn_fixed_settings(&delta.supd);
        let (mut added, mut removed, mut changed) = (Vec::new(), Vec::new(), Vec::new());
        let mut limited = Vec::new();
        for name in &delta.removed {
            if self.slots.get(name).is_some_and(|s| !s.removed) {
                if let Some(s) = self.slots.get_mut(name) {
                    s.removed = true;
                }
                self.apply(name, Event::Stop, now);
                removed.push(name.clone());
            }
        }
        for (name, def) in &delta.defs {
            // Looked at first, touched only if it changes: a reload costs the loop what
            // it changes, not the number of services.
            match self.slots.get(name).map(|s| s.removed || s.cfg != *def) {
                None => {
                    self.add_slot(def.clone());
                    added.push(name.clone());
                }
                Some(true) if self.limits_only(name, def) => {
                    self.write_limits(name, def);
                    limited.push(name.clone());
                }
                Some(true) => {
                    let Some(slot) = self.slots.get_mut(name) else {
                        continue;
                    };
                    let revived = slot.removed;
                    slot.removed = false;
                    // Another service now: its restarts are counted afresh.
                    slot.svc.count_afresh();
                    let running = slot.svc.pid.is_some();
                    // Stop with the old definition (its stop_signal); start with the new.
                    if running {
                        self.apply(name, Event::Restart, now);
                    }
                    if let Some(slot) = self.slots.get_mut(name) {
                        slot.cfg = def.clone();
                    }
                    self.forget_dependents();
                    if revived && def.autostart && !self.down.contains(name) {
                        self.apply(name, Event::Start, now);
                    } else if !running {
                        // Waiting out a backoff or cooldown, or failed: at once.
                        self.apply(name, Event::Changed, now);
                    }
                    changed.push(name.clone());
                }
                Some(false) => {}
            }
        }
        let (socket, state_dir) = (
            self.cfg.supd.socket.clone(),
            self.cfg.supd.state_dir.clone(),
        );
        let metrics_was = self.cfg.supd.metrics_file.take();
        self.cfg.supd = SupdConfig {
            socket,
            state_dir,
            ..delta.supd
        };
        crate::sys::set_own_nice(self.cfg.supd.nice);
        crate::sys::set_own_realtime(self.cfg.supd.realtime);
        self.open_syslog();
        self.cfg.leases = delta.leases;
        self.cfg.files = delta.files;
        for name in &delta.removed {
            self.cfg.origins.remove(name);
        }
        self.cfg.origins.extend(delta.origins);
        self.config_errors.clear();
        self.broken_files.clear();
        self.end_kept(now);
        // `metrics_file` may have been set or moved: written afresh.
        self.metrics_file_moved(metrics_was);
        self.metrics.changed();
        log::info!(
            "reloaded {}: added {added:?}, removed {removed:?}, changed {changed:?}, limits changed {limited:?}",
            self.config_path.display()
        );
        json!({"added": added, "removed": removed, "changed": changed, "limits": limited})
    }

    /// Whether `def` changes only the cgroup limits of a running service `name`: they
    /// are written to its cgroups, and the run goes on.
    fn limits_only(&self, name: &str, def: &config::ServiceConfig) -> bool {
        let Some(slot) = self.slots.get(name) else {
            return false;
        };
        let mut same = slot.cfg.clone();
        same.resources = def.resources;
        !slot.removed && slot.instance.is_some() && self.cgroups.is_some() && same == *def
    }

    /// Takes `def` (whose limits alone changed) for `name` and writes its limits into
    /// the cgroups of its run, moving the run into the cgroup v1 cgroups a new limit
    /// needs (`cgroup/limits.rs`).
    fn write_limits(&mut self, name: &str, def: &config::ServiceConfig) {
        let Some(slot) = self.slots.get_mut(name) else {
            return;
        };
        slot.cfg = def.clone();
        let Some(c) = self.cgroups.as_ref() else {
            return;
        };
        let (joins, mut problems) = c.apply(name, &def.resources, &slot.limits_written);
        // A run started without a memory cgroup had no OOM-kill count to start from:
        // it starts from its new cgroup's, before the run moves in, so that a kill
        // under the new `memory_max` is said as one.
        if let Some(i) = slot.instance.as_mut().filter(|i| i.oom_at_start.is_none()) {
            i.oom_at_start = c.oom_kills(name);
        }
        problems.extend(c.move_run(name, &joins));
        slot.limits_written = def.resources;
        for p in &problems {
            log::warn!("{name}: {p}: its new limits may not hold");
        }
        log::info!("{name}: its cgroup limits were written to its running cgroups (no restart)");
    }

    fn warn_fixed_settings(&self, new: &SupdConfig) {
        let old = &self.cfg.supd;
        if new.socket != old.socket {
            log::warn!(
                "reload: the socket moves to {} only when supd restarts",
                new.socket.display()
            );
        }
        if new.cgroups != old.cgroups {
            let was = if old.cgroups { "auto" } else { "off" };
            log::warn!(
                "reload: cgroups takes effect when supd restarts (it is set up once, at the start): services run as with cgroups = \"{was}\" until then, and limits a reload adds do not hold without cgroups"
            );
        }
        if new.control_group != old.control_group {
            log::warn!("reload: control_group takes effect when supd restarts (it is looked up once, at the start)");
        }
        if new.state_dir != old.state_dir {
            log::warn!(
                "reload: state_dir {} takes effect when supd restarts",
                new.state_dir.display()
            );
        }
    }
}
