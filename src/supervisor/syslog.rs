//! The coordinator's side of `[supd] syslog` (`syslog.rs`): the listener bound at start,
//! taken over across `reexec`, moved by a reload; each message read put in the log of the
//! service that sent it, the way its captured output goes (the ring for `log`, `log -f`'s
//! followers, the log writer), or in supd's own log for an outsider.

use super::Supervisor;
use crate::syslog::listener::Listener;
use crate::time::Mono;
use std::os::fd::{BorrowedFd, RawFd};
use std::path::PathBuf;

impl Supervisor {
    /// The listener's fd, to poll, while there is one.
    pub(super) fn syslog_fd(&self) -> Option<BorrowedFd<'_>> {
        self.syslog.socket.as_ref().map(Listener::fd)
    }

    /// What a `reexec` carries (the handoff's `syslog`), naming its fd in `fds`.
    pub(super) fn carry_syslog<'a>(
        &'a self,
        fds: &mut Vec<BorrowedFd<'a>>,
    ) -> Option<(RawFd, PathBuf)> {
        self.syslog.socket.as_ref().map(|l| l.carry(fds))
    }

    /// Takes over the listener a previous image handed over, if the config still names
    /// its path (else it is closed and its file removed).
    pub(super) fn adopt_syslog(&mut self, carried: Option<(RawFd, PathBuf)>) {
        let Some((fd, path)) = carried else {
            return;
        };
        match crate::sys::adopt_fd(fd) {
            Ok(fd) => self.syslog.socket = Some(Listener::adopt(fd, path)),
            Err(e) => log::warn!(
                "syslog: the socket {} was not handed over ({e})",
                path.display()
            ),
        }
    }

    /// Makes the listener what `[supd] syslog` says: kept when it is at that path, else
    /// closed (its file removed) and bound anew there. At start, after a takeover and
    /// after a reload. A path another process serves is refused and said; supd goes on
    /// without a listener.
    pub fn open_syslog(&mut self) {
        let want = self.cfg.supd.syslog.clone();
        let held = self.syslog.socket.as_ref().map(|l| l.path().to_path_buf());
        if held == want {
            return;
        }
        if let Some(old) = self.syslog.socket.take() {
            log::info!("syslog: no longer listening on {}", old.path().display());
        }
        // Starts are not told while there is no listener: read them in again with it.
        self.syslog.cgroups = Default::default();
        let Some(path) = want else {
            return;
        };
        match Listener::bind(&path) {
            Ok(l) => {
                log::info!("syslog: listening on {}", path.display());
                self.syslog.socket = Some(l);
            }
            Err(e) => log::error!("syslog: {e}; no syslog listener"),
        }
    }

    /// Closes the listener and removes its file (supd's exit).
    pub(super) fn close_syslog(&mut self) {
        self.syslog.socket = None;
    }

    /// Reads what was sent (a bounded number of datagrams): each kept message goes to
    /// its sender's service, or to supd's own log; what the rate bound drops is counted
    /// and said at most once a second.
    pub(super) fn on_syslog(&mut self, now: Mono) {
        let Some(got) = self.syslog.socket.as_ref().map(Listener::drain) else {
            return;
        };
        for d in got {
            let pid = d.pid;
            if !self.syslog.limiter.admit(pid, now) {
                continue;
            }
            let msg = crate::syslog::parse(&d.data);
            match self.syslog_sender(pid, d.cgroup) {
                Some(name) => self.syslog_line(&name, msg.line()),
                None => log::info!(
                    "syslog from pid {pid} (no service's): [{}] {}",
                    msg.priority(),
                    msg.body()
                ),
            }
        }
        for (pid, n) in self.syslog.limiter.to_tell(now) {
            if pid == crate::syslog::OVERFLOW {
                log::warn!("syslog: dropped {n} messages from too many senders at once");
                continue;
            }
            let service = self.syslog_sender(pid, None);
            let service = service.as_deref().unwrap_or("none");
            log::warn!("syslog: dropped {n} messages from pid {pid} (service {service})");
        }
    }

    /// The service whose process `pid` is (or was: `cgroup`, the id its pidfd told), if
    /// any (`syslog::sender_service`).
    fn syslog_sender(&mut self, pid: i32, cgroup: Option<u64>) -> Option<String> {
        let by_id = cgroup.and_then(|id| self.syslog_cgroup(id));
        let root = (self.cgroups.as_ref())
            .and_then(|c| c.root.file_name())
            .map(|n| n.to_string_lossy().into_owned());
        crate::syslog::sender_service(
            pid,
            by_id.as_deref(),
            &|p| self.pids.get(&p).cloned(),
            root.as_deref(),
            &crate::proc::cgroup,
            &|p| crate::proc::stat(p).map(|s| s.session),
            &|n| self.slots.contains_key(n),
        )
    }

    /// The service whose cgroup (v2) has the id `id`. The services' cgroups are read in
    /// once, at the first message that needs them; each start after is told
    /// (`Syslog::started_in`).
    fn syslog_cgroup(&mut self, id: u64) -> Option<String> {
        let c = self.cgroups.as_ref().filter(|c| c.is_v2())?;
        if self.syslog.cgroups.service(id).is_none() && !self.syslog.cgroups.primed() {
            self.syslog.cgroups.prime(c.ids());
        }
        self.syslog.cgroups.service(id).map(str::to_string)
    }

    /// One syslog line of `name`'s, stamped now, where its captured output goes: its
    /// ring (`log`), its followers (`log -f`) and the log writer.
    fn syslog_line(&mut self, name: &str, text: String) {
        let Some(out) = self.slots.get_mut(name).and_then(|s| s.output.as_mut()) else {
            return;
        };
        let lines = [out.note(&text)];
        self.deliver(name, &lines, false);
    }
}
