//! The coordinator's side of `reexec` (`handoff.rs` holds the format): the state of
//! every part and slot written for a new image with the fds it names, what cannot be
//! carried refused as `busy`, the exec, and the takeover of a previous image's state.

use super::Supervisor;
use crate::handoff::{Handoff, ServiceState, FORMAT};
use crate::protocol::{Error, ErrorKind};
use crate::time::Mono;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

impl Supervisor {
    /// The handoff of this supervisor, and every fd it names.
    pub fn handoff(&self) -> (Handoff, Vec<BorrowedFd<'_>>) {
        let mut fds = vec![self.control.listener_fd()];
        let notify = self.legacy_notify.carry(&mut fds);
        let lock_fd = self.lock.as_ref().map(|l| {
            fds.push(l.as_fd());
            l.as_fd().as_raw_fd()
        });
        let mut services = Vec::new();
        for (name, slot) in self.slots.iter() {
            let output = slot.output.as_ref().map(|o| {
                let (r, w) = o.fds();
                fds.push(r.as_fd());
                fds.push(w.as_fd());
                (
                    r.as_raw_fd(),
                    w.as_raw_fd(),
                    o.tail(usize::MAX, false),
                    o.dropped,
                )
            });
            let output_err = slot
                .output
                .as_ref()
                .and_then(|o| o.err_fds())
                .map(|(r, w)| {
                    fds.push(r.as_fd());
                    fds.push(w.as_fd());
                    (r.as_raw_fd(), w.as_raw_fd())
                });
            let ready_fd = slot.ready_pipe.as_ref().map(|p| {
                fds.push(p.as_fd());
                p.as_raw_fd()
            });
            let notify = slot.notify.carry(&mut fds);
            let kept = slot.kept.carry(&mut fds);
            let exec = slot.exec.as_ref().map(|e| {
                fds.push(e.report.as_fd());
                let (program, cwd) = e.names();
                (e.report.as_raw_fd(), program, cwd)
            });
            let exec_read = (slot.exec.as_ref())
                .map(|e| e.read_so_far().to_vec())
                .unwrap_or_default();
            services.push(ServiceState {
                name: name.clone(),
                svc: slot.svc.clone(),
                version: slot.version.clone(),
                ran_as: slot.ran_as.as_deref().cloned(),
                limits_written: Some(slot.limits_written),
                output,
                output_err,
                ready_fd,
                instance: slot.instance.clone(),
                notify,
                exec,
                exec_read,
                health: slot.health.carry(),
                kept,
            });
        }
        let tools = self.tools.handoff();
        let log_writer = self.log_writer.handoff().map(|(state, pipes)| {
            fds.extend(pipes);
            state
        });
        let leases = self.leases.handoff(&mut fds);
        let queued = self.control.handoff();
        let syslog = self.carry_syslog(&mut fds);
        let h = Handoff {
            format: FORMAT,
            from: crate::VERSION.into(),
            config_path: self.config_path.clone(),
            listener_fd: self.control.listener_fd().as_raw_fd(),
            notify,
            lock_fd,
            started: self.started,
            config_errors: self.config_errors.clone(),
            kept: self.kept.clone(),
            services,
            leases,
            system: self.system,
            tools,
            log_writer,
            socket_group: self.control.socket_group().cloned(),
            control_group: self.control.control_group().cloned(),
            queued,
            leftovers: self.cleanup.as_ref().map(|c| c.carry()),
            syslog,
            metrics: Some(self.metrics.counts()),
        };
        (h, fds)
    }

    /// Why a `reexec` cannot be made now, if it cannot: what is under way and would be
    /// lost across the exec (the new image could not finish it), as a `busy` refusal
    /// that says what it waits for. Asked when `reexec` is asked and again when the new
    /// program passed its check, just before the exec.
    pub fn reexec_refusal(&self) -> Option<Error> {
        let busy = |what: String| {
            Some(Error::new(
                ErrorKind::Busy,
                format!("{what}; a reexec now would lose it: nothing changed, try again once it is over"),
            ))
        };
        if self.reload_job.is_some() {
            return busy("a reload of the config is under way".into());
        }
        // A change waiting for its record, another reexec's check.
        self.tools.why_not_reexec().and_then(busy)
    }

    /// The new program's handshake ended: supd re-executes into it, unless the
    /// handshake failed or something that cannot be carried began meanwhile; the client is
    /// answered first (its connection closes with the exec).
    pub fn finish_reexec(
        &mut self,
        binary: PathBuf,
        client: u64,
        id: serde_json::Value,
        handshake: Result<(), String>,
        program: &std::fs::File,
        now: Mono,
    ) {
        let refusal = if let Err(why) = handshake {
            Error::new(
                ErrorKind::Failed,
                format!("{} refused: {why}; supd keeps running", binary.display()),
            )
        } else if self.shutting_down() {
            Error::new(ErrorKind::Failed, "supd is shutting down")
        } else if let Some(busy) = {
            // What a probation counted is written for the new image to go on from.
            self.note_probations(now);
            self.reexec_refusal()
        } {
            busy
        } else {
            let answer = serde_json::json!({"reexec": binary, "pid": std::process::id()});
            self.unpark(client, &id, Ok(answer), now);
            // Held stops and restarts go over in the handoff, in their order.
            let why = self.exec_handoff(&binary, Some(program));
            log::error!("reexec: {why}; supd keeps running");
            return;
        };
        log::error!("reexec: {}", refusal.message);
        self.unpark(client, &id, Err(refusal), now);
    }

    /// Execs `binary` with the handoff (through `opened`, the file that answered the
    /// handshake, when there was one: `handshake::exec_opened`). Returns only on
    /// failure, with everything as it was (the fds close-on-exec again, the handoff
    /// file removed).
    pub fn exec_handoff(&mut self, binary: &Path, opened: Option<&std::fs::File>) -> String {
        let path = self.cfg.supd.state_dir.join("handoff.json");
        // Children asked for and not released are not handed over: they exit unrun, and
        // their services, still pending, are started by the new image.
        self.drop_forks();
        // Health checks' runs under way end here (the new image knows nothing of them):
        // a check command's group is killed, a socket closed. The checks' state goes on
        // in the new image (`ServiceState::health`), the ended run made again at once.
        let now = Mono::now();
        for slot in self.slots.values_mut() {
            slot.health.before_exec(now);
        }
        // What has exited is reaped here, its group killed, by the image that knows it:
        // all of it (a scan cut at its time is made again until it is whole).
        loop {
            self.reap(Mono::now());
            if self.scan_owed_now().is_none() {
                break;
            }
        }
        // What this image logged goes to its log file before the exec (the writer and
        // what is queued for it are handed over).
        self.flush_own_log(Mono::now());
        // And to its stderr, for a bounded moment: the queue of what stderr did not
        // take yet is not handed over (a stderr nobody reads loses it, as it would).
        crate::logging::finish_stderr(Duration::from_millis(250));
        let (h, fds) = self.handoff();
        let bytes = match serde_json::to_vec(&h) {
            Ok(b) => b,
            Err(e) => return format!("cannot write the handoff: {e}"),
        };
        if let Err(e) = crate::records::atomic_write(&path, &bytes, false) {
            return format!("cannot write the handoff {}: {e}", path.display());
        }
        let mut kept = Vec::new();
        let mut failure = None;
        for fd in &fds {
            match crate::sys::keep_across_exec(fd, true) {
                Ok(()) => kept.push(*fd),
                Err(e) => {
                    failure = Some(format!(
                        "cannot keep fd {} open across exec: {e}",
                        fd.as_raw_fd()
                    ));
                    break;
                }
            }
        }
        if failure.is_none() {
            let mut args = vec![
                binary.to_string_lossy().into_owned(),
                "-c".into(),
                self.config_path.to_string_lossy().into_owned(),
            ];
            if self.system {
                args.push("--system".into());
            }
            args.extend(["--handoff".into(), path.to_string_lossy().into_owned()]);
            if let Some(v) = crate::sys::child_nofile_env() {
                // Single-threaded: nothing reads the environment meanwhile.
                std::env::set_var("SUP_CHILD_NOFILE", v);
            }
            if let Some(v) = crate::sys::child_nice_env() {
                std::env::set_var("SUP_CHILD_NICE", v);
            }
            log::warn!(
                "re-executing {} with {} services",
                binary.display(),
                h.services.len()
            );
            crate::failpoint::stop_at("reexec-stops-before-exec");
            failure = Some(match opened {
                Some(f) => crate::handshake::exec_opened(f, &args),
                None => crate::sys::exec(&args),
            });
        }
        for fd in kept {
            let _ = crate::sys::keep_across_exec(&fd, false);
        }
        let _ = std::fs::remove_file(&path);
        failure.unwrap_or_default()
    }

    /// Takes over the state of a previous image (after `Supervisor::new` from the config).
    pub fn restore(&mut self, h: Handoff) {
        self.started = h.started;
        self.metrics.adopt(h.metrics.unwrap_or_default());
        // The config's errors are those of the config as this image read it (the
        // broken files stand in by their copies as at any start), not the last image's.
        self.kept = h.kept;
        for s in h.services {
            let (notify, lost) = crate::notify::Inbox::adopt(s.notify);
            if let Some(e) = lost {
                log::warn!("{}: its notify socket was not handed over ({e})", s.name);
            }
            // Its held sockets and stored fds (dropped, so closed, if it is gone below).
            let (kept, lost) = crate::kept::Kept::adopt(s.kept);
            for why in lost {
                log::warn!("{}: {why}", s.name);
            }
            // A service the re-read config no longer has is kept, as a removed one,
            // until it has stopped as any removed service does (stop_timeout, then
            // KILL, its record and its remaining processes awaited).
            let gone = !self.slots.contains_key(&s.name);
            if gone {
                if s.svc.pid.is_none() && s.instance.is_none() {
                    continue; // its socket, if any, is dropped here: closed and removed
                }
                log::warn!("{}: not in the config any more; stopping it", s.name);
                let mut cfg = crate::config::ServiceConfig::new(&s.name, Vec::new(), "/".into());
                cfg.autostart = false;
                self.add_slot(cfg);
            }
            let Some(slot) = self.slots.get_mut(&s.name) else {
                continue;
            };
            slot.removed = gone;
            if let Some((r, w, lines, dropped)) = s.output {
                match (crate::sys::adopt_fd(r), crate::sys::adopt_fd(w)) {
                    (Ok(r), Ok(w)) => {
                        slot.output =
                            Some(Box::new(crate::logs::Output::adopt(r, w, lines, dropped)))
                    }
                    _ => log::warn!("{}: its output pipe was not handed over", s.name),
                }
            }
            if let Some((r, w)) = s.output_err {
                match (
                    crate::sys::adopt_fd(r),
                    crate::sys::adopt_fd(w),
                    &mut slot.output,
                ) {
                    (Ok(r), Ok(w), Some(out)) => out.adopt_err(r, w),
                    _ => log::warn!("{}: its stderr pipe was not handed over", s.name),
                }
            }
            slot.ready_pipe = s.ready_fd.and_then(|fd| crate::sys::adopt_fd(fd).ok());
            slot.exec = s.exec.and_then(|(fd, program, cwd)| {
                let fd = crate::sys::adopt_fd(fd).ok()?;
                Some(crate::sys::Exec::adopt(fd, program, cwd, s.exec_read))
            });
            slot.notify = notify;
            slot.kept = kept;
            slot.version = s.version;
            slot.ran_as = s.ran_as.map(Box::new);
            // What the image before wrote into its cgroups: a limit the config read
            // anew by the reexec no longer sets is set back at the next start. (An
            // older image did not say: the config's limits, as it would have written.)
            slot.limits_written = s.limits_written.unwrap_or(slot.cfg.resources);
            // Its checks go on where they were, for the same run (one the config no
            // longer checks is stopped by the next `sync_health`).
            if let Some(h) = s.health {
                slot.health.adopt(h, s.svc.pid);
            }
            // A run of an image that did not know `kill_mode` takes the config's.
            let s_instance = s.instance.map(|mut i| {
                i.kill_mode.get_or_insert(slot.cfg.kill_mode);
                i
            });
            slot.instance = s_instance.or_else(|| {
                s.svc.pid.map(|pid| crate::instance::Instance {
                    pid,
                    start_time: crate::proc::stat(pid).map(|p| p.start_time).unwrap_or(0),
                    cgroup: None,
                    exit: None,
                    guard: None,
                    lease: None,
                    reaped_at: None,
                    kill_mode: Some(slot.cfg.kill_mode),
                    left_at_exit: 0,
                    left_uncounted: false,
                    oom_at_start: None,
                    out_of_memory: None,
                })
            });
            // A leader not reaped yet is still this process's child (exec keeps the
            // pid): in the pid table and watched as at a spawn. One reaped already (its
            // run drains) is neither: its pid may name another process by now, and in
            // the table it would never be removed (nothing reaps it again), so that
            // supd could never finish a shutdown.
            match slot.instance.as_ref() {
                Some(i) if i.leader_gone() => {
                    self.draining.insert(s.name.clone());
                }
                Some(i) => {
                    self.pids.insert(i.pid, s.name.clone());
                    slot.leader = crate::sys::pidfd_open(i.pid).ok().map(|fd| (i.pid, fd));
                }
                None => {}
            }
            slot.svc = s.svc;
            if gone {
                self.apply(&s.name, crate::service::Event::Stop, Mono::now());
            }
        }
        // Guards of an older image know no grant's end: armed again below, once the
        // grants are back on the boards.
        let (leases, rearm) = crate::leases::Leases::from_handoff(h.leases);
        self.leases = leases;
        if let Some(w) = h.log_writer {
            self.log_writer.adopt(w);
        }
        let slots = &self.slots;
        self.control
            .restore_held(h.queued, |n| slots.contains_key(n));
        let leases = self.leases.granted();
        if !leases.is_empty() {
            self.starts.recheck();
        }
        for lease in leases {
            self.post_grant_end(&lease);
        }
        if rearm {
            self.rearm_guards();
        }
        self.tools.adopt(h.tools);
        self.adopt_syslog(h.syslog);
        self.arm_unguarded();
        self.check_draining(Mono::now());
        // What exited between the old image's last reap and now told nobody.
        self.owe_scan_now(Mono::now());
        log::info!(
            "took over from supd {}: {} services, {} running",
            h.from,
            self.slots.len(),
            self.pids.len()
        );
    }
}
