//! A tool's helper processes: installs and prunes copied and deleted by a helper so a
//! large tree never blocks the loop, the leftovers of interrupted ones swept, and the
//! `--check` of a binary before `reexec` runs it. Which helpers run is the tools part's
//! (`tool_state.rs`); what they run, `tools.rs`'s.
//!
//! Every helper dies with supd (`PR_SET_PDEATHSIG`, and a helper whose supd died before
//! that was set sees another parent and exits): a killed supd leaves none working, and
//! the next one deletes their staging at start (`sweep_tools`). One that ends cleanly
//! kills and reaps them itself and deletes its installs' staging before it exits
//! (`end_helpers`). A `reexec` keeps them: the death signal comes with the end of the
//! parent's thread, which an exec does not end, and the new image takes them over.

use super::{bad_request, failed};
use crate::protocol::Error;
use crate::supervisor::{unix_ms, Supervisor};
use crate::sys::{self, SpawnSpec};
use crate::time::Mono;
use crate::tool_state::Task;
use crate::tools::{answer_pipe, copy, fork_copy, read_why, reap_by};
use crate::versions;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::Read;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

/// The first sweep of this process looked at every tool's directory.
static SWEPT_ALL: AtomicBool = AtomicBool::new(false);

/// How long supd, exiting, waits for the helpers it killed.
const HELPER_END_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

impl Supervisor {
    /// `install TOOL VERSION DIR`: checks, then a helper copies into a hidden staging
    /// directory (`copy.rs`: modes kept, special files refused unless `allow_special`);
    /// the client is answered when it ends. Two installs of one version at once are
    /// refused: the second would take the first one's staging directory.
    pub fn install(
        &mut self,
        tool: &str,
        version: &str,
        dir: &str,
        allow_special: bool,
        client: u64,
        id: &Value,
    ) -> Result<(), Error> {
        let src = PathBuf::from(dir);
        if !src.is_absolute() {
            return Err(bad_request(format!("'{dir}' is not an absolute path")));
        }
        if self.tools.installing(tool, version) {
            return Err(failed(format!(
                "an install of {tool} {version} is under way; wait for it to end"
            )));
        }
        let (tmp, leftover) =
            versions::prepare_install(&self.cfg.supd.tools_dir, tool, version, &src)
                .map_err(failed)?;
        if let Some(old) = leftover {
            log::info!(
                "{tool}: deleting {} left by an interrupted install",
                old.display()
            );
            self.delete_in_background(tool, vec![old]);
        }
        let opts = copy::Options { allow_special };
        let (pid, why) = match fork_copy(&src, &tmp, opts) {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_dir(&tmp);
                return Err(failed(format!("cannot start the copy: {e}")));
            }
        };
        self.tools.add_task(
            pid,
            Task::Install {
                tool: tool.into(),
                version: version.into(),
                client: Some((client, id.clone())),
                why: Some(Rc::new(why)),
            },
        );
        self.control.hold_client(client);
        Ok(())
    }

    /// Deletes hidden directories by a helper (`rm -rf`), never in the loop.
    pub(super) fn delete_in_background(&mut self, tool: &str, dirs: Vec<PathBuf>) {
        if dirs.is_empty() {
            return;
        }
        let mut args = vec!["-rf".to_string(), "--".to_string()];
        args.extend(dirs.iter().map(|p| p.to_string_lossy().into_owned()));
        match self.spawn_helper("/bin/rm", args, sys::Io::Null) {
            Ok(pid) => {
                self.tools.add_task(pid, Task::Prune { dirs });
            }
            Err(e) => log::warn!(
                "{tool}: cannot start rm for {dirs:?}: {e}; they stay hidden until the next start"
            ),
        }
    }

    /// Deletes what interrupted installs, prunes and switches left in the directory of
    /// each tool loaded since the last call (and, at the first call, of every tool in
    /// `tools_dir`), except what a helper of this supd (or of the image it took over
    /// from) is still working on: a live install's staging directory is never touched.
    /// Dead staging is renamed aside at once and deleted by a helper.
    pub fn sweep_tools(&mut self) {
        let fresh: Vec<String> = self.tools.to_sweep();
        let tools_dir = self.cfg.supd.tools_dir.clone();
        // Once per process, every tool's directory: an install of a tool no service
        // names (installed ahead of its config) leaves its staging there too.
        let unnamed: Vec<String> = if SWEPT_ALL.swap(true, Ordering::Relaxed) {
            Vec::new()
        } else {
            std::fs::read_dir(&tools_dir)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| versions::check_tool(n).is_ok() && !self.tools.is_loaded(n))
                .collect()
        };
        for tool in fresh.into_iter().chain(unnamed) {
            let busy: BTreeSet<PathBuf> = self.tools.busy_dirs(&tools_dir, &tool);
            let mut doomed = Vec::new();
            for p in versions::leftovers(&tools_dir, &tool) {
                if busy.contains(&p) {
                    log::debug!("{tool}: {} is in use by a helper; kept", p.display());
                    continue;
                }
                log::info!(
                    "{tool}: deleting {} left by an interrupted operation",
                    p.display()
                );
                match versions::hide_leftover(&p) {
                    Ok(Some(hidden)) => doomed.push(hidden),
                    Ok(None) => {}
                    Err(e) => log::warn!("{tool}: cannot move {} aside: {e}", p.display()),
                }
            }
            self.delete_in_background(&tool, doomed);
        }
    }

    /// `reexec [--binary PATH]`: the new program must answer the handshake first
    /// (handshake.rs), on the current config, within [`crate::handshake::DEADLINE`].
    pub fn begin_reexec(
        &mut self,
        binary: Option<PathBuf>,
        client: u64,
        id: &Value,
        now: Mono,
    ) -> Result<(), Error> {
        let binary = binary.unwrap_or_else(|| self.program.clone());
        let nonce = crate::handshake::nonce();
        let args = vec![
            "--handshake".to_string(),
            nonce.clone(),
            "--handoff-format".into(),
            crate::handshake::FORMAT.to_string(),
            "-c".into(),
            self.config_path.to_string_lossy().into_owned(),
        ];
        let cannot = |e: String| {
            failed(format!(
                "cannot run {}: {e}; supd keeps running",
                binary.display()
            ))
        };
        let program = crate::handshake::open(&binary).map_err(|e| cannot(e.to_string()))?;
        let (read, write) = answer_pipe().map_err(|e| cannot(e.to_string()))?;
        let pid = self
            .spawn_helper(&binary.to_string_lossy(), args, sys::Io::Fd(write))
            .map_err(cannot)?;
        self.tools.add_task(
            pid,
            Task::ReexecCheck {
                binary,
                client,
                id: id.clone(),
                nonce,
                answer: Rc::new(read),
                by: now.plus(crate::handshake::deadline()),
                timed_out: false,
                program: Rc::new(program),
            },
        );
        self.control.hold_client(client);
        Ok(())
    }

    /// When the next handshake that has not ended is cut short.
    pub fn handshake_deadline(&self) -> Option<Mono> {
        self.tools.handshake_deadline()
    }

    /// Kills the handshakes past their deadline (their exit, reaped as any helper's,
    /// refuses the reexec).
    pub fn cut_handshakes(&mut self, now: Mono) {
        for pid in self.tools.handshakes_past(now) {
            // Its own child, not reaped yet: the pid is still its.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    fn spawn_helper(
        &self,
        program: &str,
        args: Vec<String>,
        stdout: sys::Io,
    ) -> Result<i32, String> {
        crate::spawner::spawn(SpawnSpec {
            program: program.into(),
            args,
            env: vec![("PATH".into(), crate::launch::DEFAULT_PATH.into())],
            cwd: "/".into(),
            stdout,
            stderr: sys::Io::Inherit,
            creds: None,
            give: Vec::new(),
            ready_fd: None,
            tuning: Default::default(),
            own_pid_env: Vec::new(),
            pass: Vec::new(),
            // Nothing for it to do without supd: what it leaves is swept at the next start.
            dies_with_supd: true,
            join: None,
            born_in: false,
            also_join: Vec::new(),
        })
    }

    /// supd is about to exit: every helper (copies, deletes, checks, the reader of a
    /// reload) is killed and reaped, all within a bound, and the staging of every
    /// install cut short deleted. Helpers also die with supd by themselves; this makes
    /// it so before supd's exit, with nothing left for the next start. A helper that
    /// does not die (stuck in the kernel on a hung file system) is named and left: it
    /// dies when its system call returns, and its staging is swept at the next start.
    pub fn end_helpers(&mut self) {
        use nix::sys::signal::{kill, Signal};
        let tools_dir = self.cfg.supd.tools_dir.clone();
        let tasks = self.tools.take_tasks();
        let pids: Vec<i32> = tasks
            .keys()
            .copied()
            .chain(self.end_reload_reader())
            .collect();
        for &pid in &pids {
            let _ = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        }
        let deadline = std::time::Instant::now() + HELPER_END_WAIT;
        let mut gone = BTreeSet::new();
        for &pid in &pids {
            if reap_by(pid, deadline) {
                gone.insert(pid);
            } else {
                log::warn!(
                    "helper {pid} did not end within {HELPER_END_WAIT:?} of SIGKILL ({}); left behind: its staging is swept at the next start",
                    crate::proc::stat(pid).map_or_else(|| "state unknown".into(), |s| format!("state {}", s.state))
                );
            }
        }
        for (pid, task) in tasks {
            let Task::Install { tool, version, .. } = task else {
                continue;
            };
            let tmp = versions::install_tmp(&tools_dir, &tool, &version);
            if !gone.contains(&pid) {
                continue;
            }
            match std::fs::remove_dir_all(&tmp) {
                Ok(()) => log::info!(
                    "{tool}: the install of {version} was cut short by supd's exit; its staging is deleted"
                ),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => log::warn!(
                    "{tool}: cannot delete {}: {e}; it is swept at the next start",
                    tmp.display()
                ),
            }
        }
    }

    /// A helper process ended.
    pub fn task_done(&mut self, task: Task, exit: crate::service::Exit, now: Mono) {
        let ok = exit == crate::service::Exit::Code(0);
        match task {
            Task::Install {
                tool,
                version,
                client,
                why,
            } => {
                let tools_dir = self.cfg.supd.tools_dir.clone();
                let answer = if ok {
                    versions::finish_install(&tools_dir, &tool, &version)
                        .map(|()| json!({"tool": tool, "version": version, "path": versions::tool_dir(&tools_dir, &tool).join(&version)}))
                        .map_err(|e| failed(format!("cannot move the copy into place: {e}")))
                } else {
                    let reason = why.and_then(|f| read_why(&f));
                    Err(failed(match reason {
                        Some(r) => {
                            format!("cannot install {tool} {version}: {r}; nothing was installed")
                        }
                        None => format!(
                            "copying into {tool} {version} failed ({exit}); nothing was installed"
                        ),
                    }))
                };
                match &answer {
                    Ok(_) => log::info!("{tool}: installed {version}"),
                    Err(e) => {
                        log::warn!("{tool}: {}", e.message);
                        let tmp = versions::install_tmp(&tools_dir, &tool, &version);
                        match versions::hide_leftover(&tmp) {
                            Ok(Some(hidden)) => self.delete_in_background(&tool, vec![hidden]),
                            Ok(None) => {}
                            Err(e) => {
                                log::warn!("{tool}: cannot move {} aside: {e}", tmp.display())
                            }
                        }
                    }
                }
                let e = json!({"event": "install", "tool": tool, "version": version, "ok": answer.is_ok(),
                               "error": answer.as_ref().err().map(|e| e.message.clone()), "time": unix_ms()});
                self.control.broadcast(&crate::protocol::line(e));
                if let Some((client, id)) = client {
                    self.unpark(client, &id, answer, now);
                }
            }
            Task::Prune { dirs } => {
                if !ok {
                    log::warn!("deleting pruned versions failed ({exit}): {dirs:?}; they stay hidden until the next start");
                }
            }
            Task::ReexecCheck {
                binary,
                client,
                id,
                nonce,
                answer,
                timed_out,
                program,
                ..
            } => {
                let verdict = if timed_out {
                    Err(format!(
                        "it did not answer the handshake within {:?} and was killed",
                        crate::handshake::deadline()
                    ))
                } else if !ok {
                    Err(format!(
                        "its handshake failed ({exit}) on the current config"
                    ))
                } else {
                    let mut out = Vec::new();
                    let _ = (&*answer)
                        .take(crate::handshake::MAX_ANSWER as u64)
                        .read_to_end(&mut out);
                    crate::handshake::verify(&out, &nonce, crate::handshake::FORMAT)
                        .and_then(|nothing| {
                            let running: Vec<&std::path::Path> = (self.broken_files.iter())
                                .filter(|b| !b.has_copy())
                                .map(|b| b.file.as_path())
                                .collect();
                            crate::handshake::weigh(&nothing, &running)
                        })
                        .and_then(|()| crate::handshake::same_file(&program, &binary))
                };
                self.finish_reexec(binary, client, id, verdict, &program, now)
            }
        }
    }
}
