//! A node's fetch of a version's artifact, run in a child process (`sup-lease fleet
//! fetch`): how it is configured, the job the node watches (its progress lines read back
//! as they come), the backoff after a failure, and the child's tie to its node.

use super::record::Transfer;
use crate::time::Boot;
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

/// How a node fetches: where it stages, what it trusts, which supd installs.
#[derive(Clone, Debug)]
pub struct FetchConfig {
    /// The program to run as `PROGRAM fleet fetch ...` (this one).
    pub program: PathBuf,
    pub staging: PathBuf,
    pub ca_file: Option<PathBuf>,
    pub socket: PathBuf,
}

/// A fetch under way in a child process.
pub(super) struct Job {
    pub(super) child: Child,
    pub(super) version: String,
    /// What it wrote on its standard output so far, less its progress lines, and the
    /// start of a line not ended yet.
    pub(super) said: String,
    pub(super) partial: Vec<u8>,
    /// How far it is, as it said last.
    pub(super) progress: Option<Transfer>,
}

/// The line a fetch run by a node writes on its standard output, at most once a second,
/// to say how its download goes.
pub fn progress_line(bytes: u64, total: Option<u64>) -> String {
    match total {
        Some(t) => format!("progress {bytes} {t}\n"),
        None => format!("progress {bytes} -\n"),
    }
}

/// A progress line read back (None: not one).
pub fn parse_progress(line: &str) -> Option<Transfer> {
    let mut w = line.strip_prefix("progress ")?.split_whitespace();
    let bytes = w.next()?.parse().ok()?;
    let total = match w.next()? {
        "-" => None,
        t => Some(t.parse().ok()?),
    };
    Some(Transfer { bytes, total })
}

impl Job {
    /// Reads what the fetch wrote since the last look (its standard output does not
    /// block): progress lines update `progress`, the rest is kept as what it said.
    pub(super) fn drain(&mut self) {
        use std::io::Read;
        let Some(out) = self.child.stdout.as_mut() else {
            return;
        };
        let mut buf = [0u8; 4096];
        loop {
            match out.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // WouldBlock: nothing more for now; any other error: nothing to read.
                Err(_) => break,
            }
        }
        while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            match parse_progress(line.trim_end()) {
                Some(p) => self.progress = Some(p),
                None if self.said.len() < 4096 => self.said.push_str(&line),
                None => {}
            }
        }
    }

    /// What it said, the start of a line not ended included (at the end).
    pub(super) fn said(&mut self) -> String {
        let rest = String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned();
        let mut said = std::mem::take(&mut self.said);
        said.push_str(&rest);
        said
    }
}

/// The last fetch that failed, and when the next may start.
pub(super) struct Failure {
    pub(super) version: String,
    pub(super) reason: String,
    pub(super) count: u32,
    pub(super) retry_at: Boot,
}

/// The wait before fetch number `count + 1`, after `count` failures: 1s doubling, at most
/// 5 minutes.
pub fn fetch_backoff(count: u32) -> Duration {
    let secs = 1u64 << count.saturating_sub(1).min(9);
    Duration::from_secs(secs.min(300))
}

/// The environment variable that gives a fetch the pid of the node that started it.
pub const PARENT_ENV: &str = "SUP_FLEET_PARENT";

/// In a fetch started by a node: asks the kernel to end this process (SIGKILL) when the
/// node's process ends, and says whether it has ended already (then the fetch must not
/// start). A fetch run by hand (no `SUP_FLEET_PARENT`) is left alone.
pub fn parent_gone() -> bool {
    let Some(parent) = std::env::var(PARENT_ENV)
        .ok()
        .and_then(|p| p.parse::<i32>().ok())
    else {
        return false;
    };
    if let Err(e) = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL) {
        log::warn!("cannot tie the fetch to its node's process: {e}");
    }
    // The parent may have died before the call above: then this process was re-parented.
    nix::unistd::getppid().as_raw() != parent
}
