//! The coordinator side of the state directory (`statedir.rs`): when it changes under
//! supd, it is made anew, locked again and every record supd holds written into it.

use super::Supervisor;
use crate::records;
use crate::statedir::{lock, same_file, LockError, LOCK};

impl Supervisor {
    /// The state directory changed under supd: if it was removed or replaced, it is made
    /// anew, its lock taken again, and every record supd holds written into it; a pid
    /// record removed alone is written again too.
    pub fn on_state_dir(&mut self) {
        if let Some(w) = &self.state_watch {
            w.drain();
        }
        let dir = self.cfg.supd.state_dir.clone();
        // A removal may still be under way: a lock lost once is taken again at every
        // event until it holds.
        let replaced = match &self.lock {
            Some(l) => !same_file(l, &dir.join(LOCK)),
            None => self.lock_lost,
        };
        if replaced {
            log::warn!(
                "{} was removed or replaced while supd ran; making it anew and taking its lock again",
                dir.display()
            );
            if let Err(e) = records::create_dirs(&dir, records::STATE_DIR) {
                log::error!("cannot create {}: {e}", dir.display());
            }
            self.lock = None;
            crate::sys::set_lock_fd(-1);
            self.lock_lost = true;
            match lock(&dir, std::time::Duration::ZERO) {
                Ok(l) if same_file(&l, &dir.join(LOCK)) => {
                    crate::sys::set_lock_fd(std::os::fd::AsRawFd::as_raw_fd(&*l));
                    self.lock = Some(l);
                    self.lock_lost = false;
                    log::info!("{}: locked again", dir.display());
                }
                // Gone again meanwhile, or not lockable: the next event tries again.
                Ok(_) => {}
                Err(LockError::Cannot(e)) => {
                    log::error!("{e}; trying again at the next change of {}", dir.display())
                }
                Err(e) => log::error!("{e}: it took {} while it was gone", dir.display()),
            }
            self.rewrite_held_records();
        }
        self.rewrite_pid_records();
        if let Some(w) = &self.state_watch {
            w.rewatch();
        }
    }

    /// Writes again what supd holds besides pid records: down marks, tool records, the
    /// cgroup root.
    fn rewrite_held_records(&mut self) {
        let dir = self.cfg.supd.state_dir.clone();
        if let Err(e) = records::write_down(&dir, &self.down) {
            log::error!("cannot write the down marks again: {e}");
        }
        for (tool, t) in self.tools.iter() {
            if let Err(e) = crate::versions::save_record(&dir, tool, &t.record) {
                log::error!("{tool}: cannot write its record again: {e}");
            }
        }
        if let Some(c) = &self.cgroups {
            c.record(&dir);
        }
    }
}
