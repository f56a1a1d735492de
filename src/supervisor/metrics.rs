//! The coordinator's side of the metrics part (`metrics.rs`, `metrics/file.rs`): the
//! data gathered from the slots and tools for `metrics`, and `[supd] metrics_file`
//! written when the part says it is due.

use super::{unix_ms, Supervisor};
use crate::metrics::file::Failed;
use crate::metrics::{self, SupdMetrics, ToolMetrics};
use crate::time::Mono;

/// The file's mode: node_exporter runs as a user of its own and must read it.
const FILE_MODE: u32 = 0o644;

impl Supervisor {
    /// The exposition text of every service, tool and supd itself, as of `now`.
    pub(super) fn metrics_text(&self, now: Mono) -> String {
        let services: Vec<_> = (self.slots.values())
            .map(|slot| self.status_of(slot, now))
            .collect();
        let tools: Vec<ToolMetrics> = (self.tools.iter())
            .map(|(name, t)| ToolMetrics {
                name,
                version: t.record.current.as_deref(),
                phase: t.record.phase.as_str(),
                probations: t.record.attempts.values().map(|&n| u64::from(n)).sum(),
                rollbacks: u64::from(t.record.rollbacks),
                bad_versions: t.record.bad.len() as u64,
            })
            .collect();
        let counts = self.metrics.counts();
        // The wall clock of supd's start, from how long it has run (CLOCK_MONOTONIC),
        // to the millisecond.
        let up_ms = now.since(self.started).as_millis() as u64;
        let supd = SupdMetrics {
            version: crate::VERSION,
            start_time_s: unix_ms().saturating_sub(up_ms) as f64 / 1000.0,
            service_restarts: counts.service_restarts,
            loop_stalls: counts.loop_stalls,
        };
        metrics::render(&services, &tools, &supd)
    }

    /// When `metrics_file` is to be written next: `None` while it says what is so.
    pub(super) fn metrics_deadline(&self) -> Option<Mono> {
        self.metrics.deadline(self.cfg.supd.metrics_file.is_some())
    }

    /// A reload moved `metrics_file` from `was`, or took it away: the file written
    /// there goes, as its values would stay as they are for good (and beside the new
    /// file, in node_exporter's textfile directory, say the same series twice, which
    /// fails its collector).
    pub(super) fn metrics_file_moved(&mut self, was: Option<std::path::PathBuf>) {
        let Some(was) = was.filter(|w| self.cfg.supd.metrics_file.as_ref() != Some(w)) else {
            return;
        };
        match std::fs::remove_file(&was) {
            Ok(()) => log::info!("metrics_file {}: removed (no longer the config's)", was.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => log::warn!(
                "cannot remove the former metrics_file {}: {}; remove it, or a scraper reads its values as they were",
                was.display(),
                crate::tool_state::errno_text(&e)
            ),
        }
    }

    /// Writes `metrics_file` if it is due (something changed, and the last write is
    /// old enough). A failure is logged once per kind until a write succeeds again, and
    /// stops nothing: the file is left as it was (its values, stale, are as of its last
    /// write; a scraper shows them as they were).
    pub(super) fn write_metrics_file(&mut self, now: Mono) {
        let Some(path) = self.cfg.supd.metrics_file.clone() else {
            return;
        };
        let Some(generation) = self.metrics.due(true, now) else {
            return;
        };
        let text = self.metrics_text(now);
        match crate::records::atomic_write_mode(&path, text.as_bytes(), true, FILE_MODE) {
            Ok(()) => {
                if self.metrics.wrote(generation, Mono::now()) {
                    log::info!("metrics_file {}: written again", path.display());
                }
            }
            Err(e) => {
                let retry = match self.metrics.failed(e.kind(), Mono::now()) {
                    Failed::Log => self.metrics_deadline(),
                    Failed::Quiet => return,
                };
                let next = retry.map(|at| crate::time::Human(at.since(now)).to_string());
                log::warn!(
                    "cannot write metrics_file {}: {}; supd goes on, the file keeps its last values; trying again in {} (this kind of error is said once)",
                    path.display(),
                    crate::tool_state::errno_text(&e),
                    next.as_deref().unwrap_or("a while")
                );
            }
        }
    }
}
