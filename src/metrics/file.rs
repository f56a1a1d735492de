//! The metrics part: supd's own counts (restarts of services, stalls of its loop) and
//! when `[supd] metrics_file` is written.
//!
//! What "changed" means: a generation number, bumped by the coordinator at each event
//! that changes what the file says other than by the clock (a state change, and with it
//! every start, exit and restart; a health verdict; a tool's record; a reload; a service
//! added or removed). Values that move by themselves (uptime, CPU time, memory) bump
//! nothing: they are as of the last write. So an idle supd has no deadline here and
//! never wakes for the file. A change writes at once when the last write is at least
//! [`INTERVAL`] old, else once at the last write + [`INTERVAL`] (one deadline, however
//! many changes come meanwhile). A write that fails is tried again after twice the wait
//! (up to [`RETRY_MAX`]); each kind of failure is logged once until a write succeeds.
//!
//! Pure: time is a parameter; the coordinator (`supervisor/metrics.rs`) writes the file.
//! Across `reexec`: the counts ([`Carried`]); the new image writes the file at once.

use crate::time::Mono;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The least time between two writes of the file.
pub const INTERVAL: Duration = Duration::from_secs(10);
/// The longest wait before a failed write is tried again.
pub const RETRY_MAX: Duration = Duration::from_secs(600);
/// A turn of the event loop longer than this is a stall.
pub const STALL: Duration = Duration::from_millis(100);

/// The part's state.
#[derive(Debug)]
pub struct MetricsFile {
    /// Bumped by every change.
    generation: u64,
    /// The generation last written (`None`: not written by this image yet).
    written: Option<u64>,
    /// When the file was last written or tried.
    last_try: Option<Mono>,
    /// The wait after `last_try`: [`INTERVAL`], doubled by each failure.
    wait: Duration,
    /// The kinds of failure logged since the last write that succeeded.
    logged: Vec<std::io::ErrorKind>,
    counts: Carried,
}

impl Default for MetricsFile {
    fn default() -> Self {
        MetricsFile {
            generation: 0,
            written: None,
            last_try: None,
            wait: INTERVAL,
            logged: Vec::new(),
            counts: Carried::default(),
        }
    }
}

/// supd's own counts, carried across `reexec`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Carried {
    /// Automatic restarts of services.
    pub service_restarts: u64,
    /// Turns of the loop longer than [`STALL`].
    pub loop_stalls: u64,
}

/// What a failed write asks of the coordinator.
#[derive(Debug, PartialEq, Eq)]
pub enum Failed {
    /// A kind of failure not logged since the last success: log it.
    Log,
    /// Logged already: say nothing.
    Quiet,
}

impl MetricsFile {
    /// Something the file shows changed.
    pub fn changed(&mut self) {
        self.generation += 1;
    }

    /// When the file is to be written (`on`: a `metrics_file` is set): `None` while it
    /// says what is so.
    pub fn deadline(&self, on: bool) -> Option<Mono> {
        if !on || self.written == Some(self.generation) {
            return None;
        }
        Some(self.last_try.map_or(Mono(0), |t| t.plus(self.wait)))
    }

    /// The generation to write now, if the file is due.
    pub fn due(&self, on: bool, now: Mono) -> Option<u64> {
        self.deadline(on)
            .filter(|d| *d <= now)
            .map(|_| self.generation)
    }

    /// Generation `generation` was written at `now`. True when writes had failed
    /// before (the recovery is worth a line in the log).
    pub fn wrote(&mut self, generation: u64, now: Mono) -> bool {
        self.written = Some(generation);
        self.last_try = Some(now);
        self.wait = INTERVAL;
        let recovered = !self.logged.is_empty();
        self.logged.clear();
        recovered
    }

    /// A write failed at `now` with `kind`: tried again after twice the wait.
    pub fn failed(&mut self, kind: std::io::ErrorKind, now: Mono) -> Failed {
        self.last_try = Some(now);
        self.wait = (self.wait * 2).min(RETRY_MAX);
        if self.logged.contains(&kind) {
            Failed::Quiet
        } else {
            self.logged.push(kind);
            Failed::Log
        }
    }

    /// A turn of the event loop took `took`.
    pub fn turn(&mut self, took: Duration) {
        if took > STALL {
            self.counts.loop_stalls += 1;
        }
    }

    /// supd restarted services `n` times.
    pub fn restarted(&mut self, n: u64) {
        self.counts.service_restarts += n;
    }

    pub fn counts(&self) -> Carried {
        self.counts
    }

    /// The counts a previous image carried.
    pub fn adopt(&mut self, carried: Carried) {
        self.counts = carried;
    }
}
