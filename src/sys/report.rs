//! The exec report: the pipe on which a child says how its exec went (the uid and groups
//! it took, a refused cgroup move, or the stage that failed and why). The child writes
//! it (raw, after the fork); supd reads it in its loop (`Exec`).

use super::plan::Account;
use super::raw::errno_now;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
/// Why a child could not run its program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecFailure {
    pub why: String,
    /// Refused for want of permission (EACCES) to enter its directory or run its
    /// program, as its user: not the program's fault, and no retry will mend it.
    pub denied: bool,
}

/// A child between its release and its exec: the report pipe tells how the exec went,
/// read by the loop when it is readable. The child writes records (a kind, a length,
/// that many bytes): the uid and groups it took (`REPORT_TOOK`, when it has a user),
/// what failed (`REPORT_FAILED`: stage, errno, and what it found as its user when it
/// was refused); end-of-file without a failure: its program runs.
pub struct Exec {
    pub report: OwnedFd,
    /// The rest, boxed: a service keeps its `Exec` only until its program runs, and
    /// every slot has room for one.
    pub(super) rest: Box<ExecRest>,
}

/// What an `Exec` knows about its child besides the pipe.
pub(super) struct ExecRest {
    program: String,
    cwd: String,
    creds: Option<Account>,
    /// The names of the limits the child sets, in order (a failed one is reported by
    /// its index).
    limits: Vec<String>,
    /// What the child wrote so far (read until end-of-file).
    got: Vec<u8>,
    /// The uid and groups the child took, once reported.
    took: Option<(u32, Vec<u32>)>,
    /// Why the child's move into its cgroup was refused, once reported.
    no_cgroup: Option<i32>,
}

impl ExecRest {
    /// What a child's report is read with: its program, cwd, user and group, and the
    /// names of its limits (for messages), nothing read yet.
    pub(super) fn new(
        program: String,
        cwd: String,
        creds: Option<Account>,
        limits: Vec<String>,
    ) -> ExecRest {
        ExecRest {
            program,
            cwd,
            creds,
            limits,
            got: Vec::new(),
            took: None,
            no_cgroup: None,
        }
    }
}

/// A report record: the uid, then each gid the child holds.
pub(super) const REPORT_TOOK: u32 = 1;
/// A report record: the stage that failed, its errno, then what the child found.
const REPORT_FAILED: u32 = 2;
/// A report record: the errno of the child's refused move into its cgroup (it goes on).
pub(super) const REPORT_NO_CGROUP: u32 = 3;
/// The most of a report supd keeps (65536 groups and a message fit).
const REPORT_MAX: usize = 1 << 20;

impl Exec {
    /// The report of a child started by a previous image, handed over across `reexec`
    /// with its program and cwd (for messages; what its user and limits were is not
    /// carried: a failure then names its stage and errno only) and what that image had
    /// read of it already (`Exec::read_so_far`: a refused cgroup move is said before the
    /// exec).
    pub fn adopt(report: OwnedFd, program: String, cwd: String, got: Vec<u8>) -> Exec {
        let mut rest = ExecRest::new(program, cwd, None, Vec::new());
        rest.got = got;
        Exec {
            report,
            rest: Box::new(rest),
        }
    }

    /// What was read of the report so far (its end not yet), for a handoff.
    pub fn read_so_far(&self) -> &[u8] {
        &self.rest.got
    }

    /// Its program and cwd, for a handoff.
    pub fn names(&self) -> (String, String) {
        (self.rest.program.clone(), self.rest.cwd.clone())
    }

    /// How the exec went: `None` while it is under way; `Some(Ok)` once the program
    /// runs; `Some(Err(why))` when the child could not run it (it then exits with 127).
    pub fn outcome(&mut self) -> Option<Result<(), ExecFailure>> {
        let mut chunk = [0u8; 4096];
        loop {
            match nix::unistd::read(&self.report, &mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    let room = REPORT_MAX.saturating_sub(self.rest.got.len());
                    self.rest.got.extend_from_slice(&chunk[..n.min(room)]);
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => return None,
                Err(e) => {
                    return Some(Err(ExecFailure {
                        why: format!("{}: reading how its exec went: {e}", self.rest.program),
                        denied: false,
                    }))
                }
            }
        }
        let got = std::mem::take(&mut self.rest.got);
        let mut rest = got.as_slice();
        let mut failed = None;
        while let Some((kind, body, next)) = record(rest) {
            rest = next;
            let words: Vec<u32> = body
                .chunks_exact(4)
                .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
                .collect();
            match (kind, words.split_first()) {
                (REPORT_TOOK, Some((&uid, gids))) => self.rest.took = Some((uid, gids.to_vec())),
                (REPORT_NO_CGROUP, Some((&errno, _))) => self.rest.no_cgroup = Some(errno as i32),
                (REPORT_FAILED, _) if body.len() >= 8 => {
                    let stage = words[0];
                    let errno = words[1] as i32;
                    let found = String::from_utf8_lossy(&body[8..]).into_owned();
                    let why = if found.is_empty() {
                        self.describe(stage, errno)
                    } else {
                        found
                    };
                    failed = Some(ExecFailure {
                        why,
                        denied: errno == libc::EACCES
                            && (stage == STAGE_EXEC || stage == STAGE_CWD),
                    });
                }
                _ => {}
            }
        }
        Some(failed.map_or(Ok(()), Err))
    }

    /// Why the child could not move itself into its cgroup, once its report was read
    /// to its end (`SpawnSpec::join`): it then runs in its process group only.
    pub fn cgroup_refused(&self) -> Option<io::Error> {
        self.rest.no_cgroup.map(io::Error::from_raw_os_error)
    }

    /// Who the child became, once it said (a service with a user): its user's name
    /// and the uid and groups it took, with the group it was configured with.
    pub fn took(&self) -> Option<(Option<String>, crate::access::Who)> {
        let creds = self.rest.creds.as_ref()?;
        let (uid, gids) = self.rest.took.clone()?;
        let who = crate::access::Who {
            name: creds.user.clone()?,
            uid,
            gids,
        };
        Some((creds.group.clone(), who))
    }

    /// The user the child runs as, for messages ("root" when it keeps supd's).
    pub fn user(&self) -> Option<&str> {
        self.rest.creds.as_ref().and_then(|c| c.user.as_deref())
    }

    fn describe(&self, stage: u32, errno: i32) -> String {
        let err = io::Error::from_raw_os_error(errno);
        let user = self
            .rest
            .creds
            .as_ref()
            .and_then(|c| c.user.as_deref())
            .unwrap_or("");
        let group = self
            .rest
            .creds
            .as_ref()
            .and_then(|c| c.group.as_deref())
            .unwrap_or("");
        let who = if user.is_empty() { "root" } else { user };
        match (stage, errno) {
            (STAGE_CWD, libc::EACCES) => {
                format!("user '{who}' may not enter its cwd {}", self.rest.cwd)
            }
            (STAGE_EXEC, libc::EACCES) => {
                format!("user '{who}' may not execute {}", self.rest.program)
            }
            (STAGE_CWD, _) => format!("cwd {}: {err}", self.rest.cwd),
            (STAGE_NO_USER, 0) => format!("unknown user '{user}'"),
            (STAGE_NO_USER, _) => format!("cannot look up user '{user}': {err}"),
            (STAGE_NO_GROUP, 0) => format!("unknown group '{group}'"),
            (STAGE_NO_GROUP, _) => format!("cannot look up group '{group}': {err}"),
            (STAGE_CREDS, _) => format!("cannot take its user and groups: {err}"),
            (STAGE_FDS, _) => format!("cannot set up its fds: {err}"),
            (STAGE_NICE, _) => format!("cannot set its nice value: {err}"),
            (s, _) if s >= STAGE_LIMIT => {
                let name = self.rest.limits.get((s - STAGE_LIMIT) as usize);
                format!(
                    "cannot set its limit {}: {err}",
                    name.map(String::as_str).unwrap_or("?")
                )
            }
            _ => format!("{}: {err}", self.rest.program),
        }
    }
}

/// The first record of a report and what follows it; `None` at its end (or at a record
/// cut short).
fn record(bytes: &[u8]) -> Option<(u32, &[u8], &[u8])> {
    let (head, rest) = bytes.split_at_checked(8)?;
    let kind = u32::from_ne_bytes([head[0], head[1], head[2], head[3]]);
    let len = u32::from_ne_bytes([head[4], head[5], head[6], head[7]]) as usize;
    let (body, rest) = rest.split_at_checked(len)?;
    Some((kind, body, rest))
}

pub(super) const STAGE_EXEC: u32 = 0;
pub(super) const STAGE_CWD: u32 = 1;
pub(super) const STAGE_CREDS: u32 = 2;
pub(super) const STAGE_FDS: u32 = 3;
pub(super) const STAGE_NO_USER: u32 = 4;
pub(super) const STAGE_NO_GROUP: u32 = 5;
pub(super) const STAGE_NICE: u32 = 6;
/// The first of the limits' stages: limit number i fails as `STAGE_LIMIT + i`.
pub(super) const STAGE_LIMIT: u32 = 100;

/// Writes the failed stage and the current errno to the report pipe and exits.
pub(super) fn fail(report: RawFd, stage: u32) -> ! {
    fail_with(report, stage, errno_now())
}

/// Writes `stage` and `errno` to the report pipe and exits (in the child; no
/// allocation).
pub(super) fn fail_with(report: RawFd, stage: u32, errno: i32) -> ! {
    let mut msg = [0u8; 16];
    msg[..4].copy_from_slice(&REPORT_FAILED.to_ne_bytes());
    msg[4..8].copy_from_slice(&8u32.to_ne_bytes());
    msg[8..12].copy_from_slice(&stage.to_ne_bytes());
    msg[12..].copy_from_slice(&errno.to_ne_bytes());
    write_all(report, &msg);
    // SAFETY: exits without running any destructor of the parent's.
    unsafe { libc::_exit(127) }
}

/// Writes `stage`, `errno` and what the child found as its user (when it found
/// something) to the report pipe and exits (in the child, which may allocate here).
pub(super) fn fail_found(report: RawFd, stage: u32, errno: i32, found: Option<String>) -> ! {
    let Some(found) = found else {
        fail_with(report, stage, errno)
    };
    let mut body = Vec::with_capacity(8 + found.len());
    body.extend_from_slice(&stage.to_ne_bytes());
    body.extend_from_slice(&errno.to_ne_bytes());
    body.extend_from_slice(found.as_bytes());
    write_record(report, REPORT_FAILED, &body);
    // SAFETY: exits without running any destructor of the parent's.
    unsafe { libc::_exit(127) }
}

/// Writes one record (its kind, its length, `body`) to the report pipe (in the child).
pub(super) fn write_record(report: RawFd, kind: u32, body: &[u8]) {
    let mut msg = Vec::with_capacity(8 + body.len());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&(body.len() as u32).to_ne_bytes());
    msg.extend_from_slice(body);
    write_all(report, &msg);
}

/// Writes all of `bytes` to `fd` (a pipe that may take a large record in parts).
pub(super) fn write_all(fd: RawFd, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: writes at most `bytes.len()` bytes from a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 && errno_now() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused cgroup move is reported before the exec: what one image read of the
    /// report goes to the next with it across `reexec`, or the refusal is lost and the
    /// run taken for one in its cgroup.
    #[test]
    fn a_report_read_in_part_crosses_a_reexec_whole() {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_NONBLOCK).expect("pipe");
        let mut msg = Vec::new();
        msg.extend_from_slice(&REPORT_NO_CGROUP.to_ne_bytes());
        msg.extend_from_slice(&4u32.to_ne_bytes());
        msg.extend_from_slice(&libc::EBUSY.to_ne_bytes());
        nix::unistd::write(&w, &msg).expect("write");
        let mut before = Exec::adopt(r, "prog".into(), "/".into(), Vec::new());
        assert!(
            before.outcome().is_none(),
            "no end yet: the exec is under way"
        );
        let carried = before.read_so_far().to_vec();
        let mut after = Exec::adopt(before.report, "prog".into(), "/".into(), carried);
        drop(w); // the exec went through
        assert!(matches!(after.outcome(), Some(Ok(()))));
        assert_eq!(
            after.cgroup_refused().and_then(|e| e.raw_os_error()),
            Some(libc::EBUSY)
        );
    }
}
