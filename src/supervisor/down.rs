//! Admin-down marks (`stop` survives a restart of supd): written atomically, and a
//! write that failed is tried again.

use super::*;

impl Supervisor {
    /// Records an operator's stop or start durably. On failure the marks are written
    /// again after a growing delay until they are (every later change rewrites them all),
    /// and the error is returned (and shown in `status`).
    pub fn set_down(&mut self, name: &str, down: bool, now: Mono) -> Result<(), String> {
        let changed = if down {
            self.down.insert(name.to_string())
        } else {
            self.down.remove(name)
        };
        if changed || self.down_retry.is_some() {
            self.write_down(now)
        } else {
            Ok(())
        }
    }

    /// Writes the admin-down marks; arms the retry on failure.
    fn write_down(&mut self, now: Mono) -> Result<(), String> {
        let dir = &self.cfg.supd.state_dir;
        match records::write_down(dir, &self.down) {
            Ok(()) => {
                if self.down_retry.take().is_some() {
                    log::info!("the admin-down marks are written");
                }
                Ok(())
            }
            Err(e) => {
                let why = format!(
                    "cannot write the admin-down marks in {}: {}",
                    dir.display(),
                    crate::tool_state::errno_text(&e)
                );
                let delay = self
                    .down_retry
                    .as_ref()
                    .map(|r| r.1.saturating_mul(2).min(crate::tool_state::RETRY_MAX))
                    .unwrap_or(crate::tool_state::RETRY_FIRST);
                log::error!("{why}; retrying in {}", crate::time::Human(delay));
                self.down_retry = Some((now.plus(delay), delay, why.clone()));
                Err(why)
            }
        }
    }

    /// Writes the admin-down marks again if their delay is over.
    pub fn retry_down(&mut self, now: Mono) {
        if self.down_retry.as_ref().is_some_and(|r| r.0 <= now) {
            let _ = self.write_down(now);
        }
    }
}
