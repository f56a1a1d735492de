//! Who is alive: every process carrying a sandbox's tag, read from `/proc/PID/environ`.
//!
//! supd runs with `SUPF_TAG` and `SUPF_GEN` (its generation: the how-many-th supd of the
//! test) in its environment, so a child it forked and has not exec'd yet carries them
//! too. Each service gets the same two through its config's `env` (resolved by supd
//! before the fork, so an instance always carries the generation that started it), and
//! the test service exports `SUPF_INST` (its leader's pid) before it forks anything, so
//! every process of one instance that has exec'd, escaped daemons included, names that
//! instance (a fork not exec'd yet still has its shell's first environment: its process
//! group names the instance).

use std::fmt;
use std::fs;

/// One tagged process.
#[derive(Clone, Debug)]
pub struct Tagged {
    pub pid: i32,
    pub pgrp: i32,
    pub ppid: i32,
    pub state: char,
    pub comm: String,
    pub gen: u64,
    /// `SUP_SERVICE`, set by supd for a service; none for supd and its unexec'd forks.
    pub service: Option<String>,
    /// `SUPF_INST`: the pid of the instance's leader (none before the script set it).
    pub inst: Option<i32>,
    /// `SUPF_VAR`: the variant of the config that started it.
    pub var: Option<String>,
    /// `SUP_VERSION`, for a tool's services.
    pub version: Option<String>,
}

impl fmt::Display for Tagged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {} ({}, state {}, pgrp {}, ppid {}) gen {}",
            self.pid, self.comm, self.state, self.pgrp, self.ppid, self.gen
        )?;
        match &self.service {
            Some(s) => write!(f, " service {s}")?,
            None => write!(f, " (supd or a fork of it not yet exec'd)")?,
        }
        if let Some(i) = self.inst {
            write!(f, " instance {i}")?;
        }
        if let Some(v) = &self.var {
            write!(f, " variant {v}")?;
        }
        if let Some(v) = &self.version {
            write!(f, " version {v}")?;
        }
        Ok(())
    }
}

/// Every live (not zombie) process carrying `SUPF_TAG=tag`.
pub fn tagged(tag: u64) -> Vec<Tagged> {
    let want = format!("SUPF_TAG={tag}");
    let mut out = Vec::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // Read whole: a fork read piecemeal while it execs shows the first variables
        // only (the tag and generation without SUP_SERVICE, as if supd's own fork).
        let Some(env) = sup::proc::environ(pid) else {
            continue;
        };
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        if !vars.contains(&want.as_bytes()) {
            continue;
        }
        let get = |key: &str| {
            let prefix = format!("{key}=");
            vars.iter()
                .find_map(|v| v.strip_prefix(prefix.as_bytes()))
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        let Some(st) = sup::proc::stat(pid) else {
            continue;
        };
        if st.state == 'Z' || st.state == 'X' {
            continue;
        }
        out.push(Tagged {
            pid,
            pgrp: st.pgrp,
            ppid: st.ppid,
            state: st.state,
            comm: fs::read_to_string(format!("/proc/{pid}/comm"))
                .map(|c| c.trim().to_string())
                .unwrap_or_default(),
            gen: get("SUPF_GEN").and_then(|g| g.parse().ok()).unwrap_or(0),
            service: get("SUP_SERVICE"),
            inst: get("SUPF_INST").and_then(|i| i.parse().ok()),
            var: get("SUPF_VAR"),
            version: get("SUP_VERSION"),
        });
    }
    out
}

/// What /proc says of a pid, tagged or not: for a failure message.
pub fn describe(pid: i32) -> String {
    let Some(st) = sup::proc::stat(pid) else {
        return format!("no process {pid}");
    };
    let env = sup::proc::environ(pid).map_or("unreadable".into(), |e| e.len().to_string());
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    format!(
        "/proc: {} state {} pgrp {} ppid {}, environ {env} bytes",
        comm.trim(),
        st.state,
        st.pgrp,
        st.ppid
    )
}

/// SIGKILLs each of `pids` and waits (pidfds opened before the signal, so a reused pid is
/// never waited for) until each has exited or `deadline` has passed; returns those that
/// had not exited by then.
pub fn kill_and_wait(pids: &[i32], deadline: std::time::Duration) -> Vec<i32> {
    use std::os::fd::AsFd;
    let fds: Vec<(i32, std::os::fd::OwnedFd)> = pids
        .iter()
        .filter_map(|p| sup::sys::pidfd_open(*p).ok().map(|fd| (*p, fd)))
        .collect();
    for (p, _) in &fds {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let end = std::time::Instant::now() + deadline;
    let mut stuck = Vec::new();
    for (p, fd) in &fds {
        let left = end.saturating_duration_since(std::time::Instant::now());
        let ms = nix::poll::PollTimeout::try_from(left.as_millis() as i32)
            .unwrap_or(nix::poll::PollTimeout::MAX);
        let mut set = [nix::poll::PollFd::new(
            fd.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        if !matches!(nix::poll::poll(&mut set, ms), Ok(n) if n > 0) {
            stuck.push(*p);
        }
    }
    stuck
}
