//! The thin edge to the kernel that needs `unsafe`: what runs in a forked child before
//! `exec`, and `pidfd_open`; and what the kernel lacks (a probe, once), with the
//! fallbacks of old kernels. Everything else uses nix's safe wrappers. Each `unsafe`
//! block says why it is sound.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};

/// Who the child runs as: names, looked up by the child itself after the fork (supd is
/// single-threaded, so its forked child may allocate and read the user database), so a
/// database that hangs holds back that child alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    /// The user (uid, group and supplementary groups, HOME).
    pub user: Option<String>,
    /// The group, instead of the user's (or of supd's, without a user).
    pub group: Option<String>,
}

/// What a service's process gets besides its program, fds and user: set by the child
/// after its go-ahead, before it drops root.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tuning {
    /// The file mode creation mask.
    pub umask: Option<u32>,
    /// The nice value (`setpriority`).
    pub nice: Option<i32>,
    /// Resource limits, set after supd's original open-files limit is given back (so a
    /// configured `nofile` wins).
    pub limits: Vec<crate::config::Rlimit>,
}

/// The nice value supd was started with, and the one it runs at now (`[supd] nice`).
static NICE: std::sync::Mutex<Option<(i32, i32)>> = std::sync::Mutex::new(None);

/// A process's nice value (`0`: this one's).
fn nice_of(pid: i32) -> Option<i32> {
    // -1 is also a valid nice value: errno, cleared before, tells a failure apart.
    nix::errno::Errno::clear();
    // SAFETY: getpriority takes integers and reads only a process's priority.
    let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, pid as libc::id_t) };
    (n != -1 || nix::errno::Errno::last_raw() == 0).then_some(n)
}

/// The nice value of the running spawner, which its children inherit; `i32::MIN`: none
/// started yet (one started now inherits supd's, as supd's own forks do).
static SPAWNER_NICE: AtomicI32 = AtomicI32::new(i32::MIN);

/// Notes the nice value of a spawner just started (`pid`): it keeps the one it had at its
/// fork while supd's changes (a reload of `[supd] nice` or `realtime`).
pub fn note_spawner_nice(pid: i32) {
    SPAWNER_NICE.store(nice_of(pid).unwrap_or(i32::MIN), Ordering::Relaxed);
}

/// Sets supd's own priority (`[supd] nice`, `None`: the one it was started with): its
/// nice value and, when it leads its session, its session's autogroup (where the
/// kernel has them, each session gets an equal share of the CPU, and each service
/// leads a session of its own: a burst of a thousand starting services would leave
/// supd a thousandth). Services and checks get the value supd was started with back
/// ([`child_nice`]); its own helpers keep supd's (0 under `realtime`).
pub fn set_own_nice(want: Option<i32>) {
    let mut nice = NICE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(now) = nice.map(|(_, n)| n).or_else(|| nice_of(0)) else {
        return;
    };
    // After a reexec, the value children get is the one the first image was started with.
    let started = nice.map(|(s, _)| s).unwrap_or_else(|| {
        std::env::var("SUP_CHILD_NICE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(now)
    });
    *nice = Some((started, now));
    // Unset and never set: supd's nice value and autogroup are left as they were given.
    if want.is_none() && now == started {
        return;
    }
    let target = want.unwrap_or(started);
    if target != now {
        // SAFETY: setpriority takes integers and changes only this process.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, target) } < 0 {
            log::warn!(
                "cannot set supd's nice value to {target}: {} (it stays at {now})",
                io::Error::last_os_error()
            );
            return;
        }
        *nice = Some((started, target));
    }
    if nix::unistd::getsid(None).ok() == Some(nix::unistd::getpid()) {
        match std::fs::write("/proc/self/autogroup", target.to_string()) {
            Ok(()) => {}
            // No autogroups here (or no /proc yet): the nice value is all there is.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EINVAL)) => {}
            Err(e) => log::warn!("cannot set the nice value of supd's autogroup to {target}: {e}"),
        }
    }
}

/// The nice value a service or check gets when it sets none: the one supd was started
/// with, set by the child, unless whichever process forks it (the spawner, or supd
/// itself) passes that very value on; `None`: it inherits it.
pub fn child_nice() -> Option<i32> {
    let (started, now) = (*NICE.lock().unwrap_or_else(|e| e.into_inner()))?;
    // With reset-on-fork, a child starts at nice 0: always under the real-time policy,
    // and under the normal one (where the kernel left the flag) when it is negative.
    // The spawner keeps the value it was forked with.
    let direct = match FORK_RESETS.load(Ordering::Relaxed) {
        RESETS_ALL => 0,
        RESETS_NEGATIVE if now < 0 => 0,
        _ => now,
    };
    let spawner = SPAWNER_NICE.load(Ordering::Relaxed);
    let inherited = direct == started && (spawner == i32::MIN || spawner == started);
    (!inherited).then_some(started)
}

/// What reset-on-fork does to the nice value of supd's children, as [`set_own_realtime`]
/// left supd: nothing, a negative one reset to 0, or any reset to 0 (a real-time parent).
static FORK_RESETS: AtomicU8 = AtomicU8::new(RESETS_NOTHING);
const RESETS_NOTHING: u8 = 0;
const RESETS_NEGATIVE: u8 = 1;
const RESETS_ALL: u8 = 2;

/// Notes what supd's policy does to its children's nice value (`FORK_RESETS`); true
/// when it is the one `[supd] realtime` sets.
fn note_policy() -> bool {
    let Some((policy, reset, prio)) = sched_policy(0) else {
        return false;
    };
    let realtime = matches!(policy, libc::SCHED_RR | libc::SCHED_FIFO);
    let resets = match (reset, realtime) {
        (false, _) => RESETS_NOTHING,
        (true, true) => RESETS_ALL,
        (true, false) => RESETS_NEGATIVE,
    };
    FORK_RESETS.store(resets, Ordering::Relaxed);
    policy == libc::SCHED_RR && reset && prio == REALTIME_PRIORITY
}

/// The real-time priority supd takes: the lowest, above every normal process and below
/// every other real-time one (a watchdog, the kernel's interrupt threads).
pub const REALTIME_PRIORITY: i32 = 1;

/// A process's scheduling policy (`SCHED_OTHER`, `SCHED_RR`, ...), whether its children
/// are reset to the normal policy, and its real-time priority; `None` when it cannot be
/// read (no such process).
pub fn sched_policy(pid: i32) -> Option<(i32, bool, i32)> {
    // SAFETY: sched_getscheduler takes a pid and returns an integer; it touches no memory.
    let policy = unsafe { libc::sched_getscheduler(pid) };
    if policy < 0 {
        return None;
    }
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid, writable sched_param that outlives the call.
    if unsafe { libc::sched_getparam(pid, &mut param) } < 0 {
        return None;
    }
    let reset = policy & libc::SCHED_RESET_ON_FORK != 0;
    Some((
        policy & !libc::SCHED_RESET_ON_FORK,
        reset,
        param.sched_priority,
    ))
}

/// Puts supd under the round-robin real-time policy at [`REALTIME_PRIORITY`] (`true`),
/// so that no burst of normal processes (a thousand services restarting at once, each
/// with a session and so a CPU share of its own) keeps it from answering; or back under
/// the normal policy (`false`, when it is the very one this sets: any other given by an
/// operator's `chrt` is left alone). Reset-on-fork is set with it: no child of supd, service,
/// check or helper, is ever started real-time. Kept across a reexec (exec keeps it).
pub fn set_own_realtime(want: bool) {
    let ours = note_policy();
    let (to, prio, what) = match (want, ours) {
        (true, false) => (
            libc::SCHED_RR | libc::SCHED_RESET_ON_FORK,
            REALTIME_PRIORITY,
            "the real-time policy (SCHED_RR, priority 1)",
        ),
        (false, true) => (libc::SCHED_OTHER, 0, "the normal policy"),
        _ => return,
    };
    let param = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: `param` is a valid sched_param that outlives the call, which changes only
    // this process's policy.
    let set = |policy| unsafe { libc::sched_setscheduler(0, policy, &param) } == 0;
    // Without CAP_SYS_NICE (real-time through RLIMIT_RTPRIO), the kernel lets a process
    // leave the real-time policy but not clear reset-on-fork: it stays set.
    let done = set(to) || (!want && set(to | libc::SCHED_RESET_ON_FORK));
    if !done {
        log::warn!(
            "cannot put supd under {what}: {} (it needs root, CAP_SYS_NICE, or an \
             RLIMIT_RTPRIO of 1 or more; and under a cgroup-v1 cpu hierarchy, a real-time \
             budget for its cgroup)",
            io::Error::last_os_error()
        );
    }
    note_policy();
}

/// `SUP_CHILD_NICE` for a re-executed image.
pub fn child_nice_env() -> Option<String> {
    NICE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .map(|(started, _)| started.to_string())
}

/// The open-files limit supd was started with, given back to every child.
static CHILD_NOFILE: std::sync::OnceLock<libc::rlimit> = std::sync::OnceLock::new();

/// Raises supd's own soft limit of open files to the hard limit: it holds a few fds per
/// service. Children get the original soft limit back (programs that use `select` break
/// beyond 1024).
pub fn raise_nofile() {
    let Ok((soft, hard)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    else {
        return;
    };
    // After a reexec, the limit to give children is the one the first image was given.
    let handed = std::env::var("SUP_CHILD_NOFILE").ok().and_then(|v| {
        let (s, h) = v.split_once(':')?;
        Some(libc::rlimit {
            rlim_cur: s.parse().ok()?,
            rlim_max: h.parse().ok()?,
        })
    });
    let _ = CHILD_NOFILE.set(handed.unwrap_or(libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    }));
    let want = hard.min(1 << 20);
    if want > soft {
        if let Err(e) =
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, want, hard)
        {
            log::warn!("cannot raise the open-files limit from {soft} to {want}: {e}");
        }
    }
}

/// Where a child's standard output or error goes.
pub enum Io {
    /// supd's own.
    Inherit,
    /// `/dev/null` (supd's own stream before `/dev` exists).
    Null,
    /// This fd (a pipe's write end).
    Fd(OwnedFd),
}

/// Everything `spawn` needs, prepared in the parent.
pub struct SpawnSpec {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: std::path::PathBuf,
    pub stdout: Io,
    pub stderr: Io,
    pub creds: Option<Account>,
    /// The write end of the readiness pipe and the fd number it must have in the child.
    pub ready_fd: Option<(RawFd, i32)>,
    /// Files the child gives to its user before it drops root (its notify socket, its
    /// runtime directory).
    pub give: Vec<std::path::PathBuf>,
    /// umask, nice and resource limits.
    pub tuning: Tuning,
    /// An environment variable the child sets to its own pid (`WATCHDOG_PID`).
    pub own_pid_env: Option<String>,
    /// The child is killed when supd dies (a health check: there is nothing for it to
    /// do without supd, and what it started is ended by the next supd from its record
    /// in `state_dir/checks`; a service must outlive supd, and does not set this).
    pub dies_with_supd: bool,
    /// The `cgroup.procs` of the cgroup the child moves itself into, first thing, before
    /// its go-ahead (`cgroup::procs_file`). A move waits for the kernel (an RCU grace
    /// period, 8-30 ms): the child waits, not supd's loop. A move refused is reported
    /// (`Exec::cgroup_refused`) and the child goes on in its process group.
    pub join: Option<OwnedFd>,
}

mod guard;
pub use guard::{board_end, board_file, board_record, spawn_guard, GuardTarget, BOARD_LEN};

/// The fds that keep a second supd out (the state lock, the listening socket): a forked
/// child closes them first thing, so that a child that has not reached `exec` yet never
/// keeps a new supd out after this one died.
static GUARDS: [AtomicI32; 3] = [AtomicI32::new(-1), AtomicI32::new(-1), AtomicI32::new(-1)];

/// Names the fd of the state lock (-1: none), for `spawn` to close in its children.
pub fn set_lock_fd(fd: RawFd) {
    GUARDS[0].store(fd, Ordering::Relaxed);
}

/// Names the fd of the state directory's own lock (`statedir::lock_dir`), likewise.
pub fn set_dir_lock_fd(fd: RawFd) {
    GUARDS[2].store(fd, Ordering::Relaxed);
}

/// Names the fd of the listening socket, likewise.
pub fn set_listener_fd(fd: RawFd) {
    GUARDS[1].store(fd, Ordering::Relaxed);
}

impl SpawnSpec {
    /// One of supd's own helper processes (`program`, this very image, with `args`):
    /// the default PATH and supd's log settings, `/` for its directory, supd's stdout
    /// and stderr, and `fd` as its fd 3.
    pub fn own_helper(program: &std::path::Path, args: Vec<String>, fd: RawFd) -> SpawnSpec {
        let mut env = vec![("PATH".into(), crate::launch::DEFAULT_PATH.into())];
        for k in ["SUP_LOG", "RUST_LOG"] {
            if let Ok(v) = std::env::var(k) {
                env.push((k.to_string(), v));
            }
        }
        SpawnSpec {
            program: program.to_string_lossy().into_owned(),
            args,
            env,
            cwd: "/".into(),
            stdout: Io::Inherit,
            stderr: Io::Inherit,
            creds: None,
            give: Vec::new(),
            ready_fd: Some((fd, 3)),
            tuning: Default::default(),
            own_pid_env: None,
            dies_with_supd: false,
            join: None,
        }
    }
}

/// Forks and execs `spec` with nothing to do in between, and waits for the exec
/// (helpers: copies, deletes, checks; programs of supd's own on local disks).
pub fn spawn(spec: SpawnSpec) -> Result<i32, String> {
    spawn_and_wait(spec, false)
}

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
    rest: Box<ExecRest>,
}

/// What an `Exec` knows about its child besides the pipe.
struct ExecRest {
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

/// A report record: the uid, then each gid the child holds.
const REPORT_TOOK: u32 = 1;
/// A report record: the stage that failed, its errno, then what the child found.
const REPORT_FAILED: u32 = 2;
/// A report record: the errno of the child's refused move into its cgroup (it goes on).
const REPORT_NO_CGROUP: u32 = 3;
/// The most of a report supd keeps (65536 groups and a message fit).
const REPORT_MAX: usize = 1 << 20;

impl Exec {
    /// The report of a child started by a previous image, handed over across `reexec`
    /// with its program and cwd (for messages; what its user and limits were is not
    /// carried: a failure then names its stage and errno only) and what that image had
    /// read of it already (`Exec::read_so_far`: a refused cgroup move is said before the
    /// exec).
    pub fn adopt(report: OwnedFd, program: String, cwd: String, got: Vec<u8>) -> Exec {
        Exec {
            report,
            rest: Box::new(ExecRest {
                program,
                cwd,
                creds: None,
                limits: Vec::new(),
                got,
                took: None,
                no_cgroup: None,
            }),
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

/// Forks `spec`; the child gets its own session and process group, then waits until
/// `admit(pid)` has run in the parent (it writes the pid record and puts the child in
/// its cgroup), and only then clears its signal mask, takes its fds, looks up its user,
/// drops root, enters its directory as its user and execs. So a service's program never
/// runs before it is recorded: if supd dies before `admit` is done, the child reads
/// end-of-file
/// instead of the go-ahead and exits without running anything. An `Err` from `admit`
/// ends the child the same way. Returns at once after the go-ahead, with the pid and
/// the `Exec` whose report says how the exec went: nothing the child does after its
/// release (a user database or a file system that hangs) can stall supd.
pub fn spawn_service(
    spec: SpawnSpec,
    admit: impl FnOnce(i32) -> Result<(), String>,
) -> Result<(i32, Exec), String> {
    spawn_through(spec, admit, false)
}

/// [`spawn`], forked by supd itself: for the spawner, which cannot fork itself.
pub fn spawn_direct(spec: SpawnSpec) -> Result<i32, String> {
    spawn_and_wait(spec, true)
}

/// Spawns `spec` (by supd itself when `direct`) and waits for its exec's outcome.
fn spawn_and_wait(spec: SpawnSpec, direct: bool) -> Result<i32, String> {
    let (pid, mut exec) = spawn_through(spec, |_| Ok(()), direct)?;
    let _ = nix::fcntl::fcntl(
        &exec.report,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
    );
    match exec.outcome() {
        Some(Err(failure)) => {
            reap_now(pid);
            Err(failure.why)
        }
        _ => Ok(pid),
    }
}

fn spawn_through(
    spec: SpawnSpec,
    admit: impl FnOnce(i32) -> Result<(), String>,
    direct: bool,
) -> Result<(i32, Exec), String> {
    let prepared = Prepared::new(spec)?;
    // Forked by the spawner (a small process: its fork copies little), else here.
    let asked = match direct {
        true => None,
        false => {
            let (msg, fds) = prepared.message();
            crate::spawner::fork(&msg, &fds)
        }
    };
    let (pid, pending) = match asked {
        Some(Ok(pid)) => (pid, prepared.pending()),
        Some(Err(e)) => return Err(format!("fork: {e}")),
        None => prepared.fork_here()?,
    };
    match pending.release(pid, admit) {
        Ok(exec) => Ok((pid, exec)),
        Err(why) => {
            // It reads end-of-file instead of its go-ahead and exits without running.
            reap_now(pid);
            Err(why)
        }
    }
}

/// A service's child as [`begin_service`] left it.
pub enum Begun {
    /// Forked by supd itself (there is no spawner): release it now.
    Forked(i32, Pending),
    /// Asked of the spawner: its pid comes with the ticket's answer.
    Asked(crate::spawner::Ticket, Pending),
}

/// Starts `spec` as [`spawn_service`] does, but without waiting for the spawner's fork:
/// the child is released with [`Pending::release`] once its pid is known (dropped
/// instead, it exits without running anything).
pub fn begin_service(spec: SpawnSpec) -> Result<Begun, String> {
    let prepared = Prepared::new(spec)?;
    let (msg, fds) = prepared.message();
    match crate::spawner::ask(&msg, &fds) {
        crate::spawner::Asked::Queued(ticket) => Ok(Begun::Asked(ticket, prepared.pending())),
        crate::spawner::Asked::NoSpawner => {
            let (pid, pending) = prepared.fork_here()?;
            Ok(Begun::Forked(pid, pending))
        }
    }
}

/// A child's plan and its pipes, before its fork.
struct Prepared {
    plan: ChildPlan,
    go_read: OwnedFd,
    report_write: OwnedFd,
    pending: Pending,
}

/// A child forked (or asked for) and held before its program: it waits for the
/// go-ahead, and exits without running anything if supd drops this instead.
pub struct Pending {
    go: OwnedFd,
    report: OwnedFd,
    rest: Box<ExecRest>,
}

impl Prepared {
    fn new(spec: SpawnSpec) -> Result<Prepared, String> {
        let rest = Box::new(ExecRest {
            program: spec.program.clone(),
            cwd: spec.cwd.to_string_lossy().into_owned(),
            creds: spec.creds.clone(),
            limits: spec.tuning.limits.iter().map(|l| l.name.clone()).collect(),
            got: Vec::new(),
            took: None,
            no_cgroup: None,
        });
        let program = spec.program.clone();
        let plan = ChildPlan::new(spec).map_err(|e| format!("{program}: {e}"))?;
        let (go_read, go) = pipe_above(plan.floor).map_err(|e| format!("pipe: {e}"))?;
        let (report, report_write) = pipe_above(plan.floor).map_err(|e| format!("pipe: {e}"))?;
        Ok(Prepared {
            plan,
            go_read,
            report_write,
            pending: Pending { go, report, rest },
        })
    }

    /// The spawner's request.
    fn message(&self) -> (Vec<u8>, Vec<RawFd>) {
        plan_message(
            &self.plan,
            self.go_read.as_raw_fd(),
            self.report_write.as_raw_fd(),
        )
    }

    /// The child's side of the pipes is its own (or in a request): supd's copies go.
    fn pending(self) -> Pending {
        self.pending
    }

    /// Forks the child here, in supd.
    fn fork_here(self) -> Result<(i32, Pending), String> {
        let guards = GUARDS.each_ref().map(|g| g.load(Ordering::Relaxed));
        let mut keep = self.plan.sources();
        keep.extend([self.go_read.as_raw_fd(), self.report_write.as_raw_fd()]);
        keep.sort_unstable();
        let own = [self.pending.go.as_raw_fd(), self.pending.report.as_raw_fd()];
        // SAFETY: supd is single-threaded, so the child holds no lock another thread
        // could own. The child runs `child_main` only: raw async-signal-safe system
        // calls on data prepared before the fork (no allocation), then `execve` or
        // `_exit`.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(format!("fork: {}", io::Error::last_os_error()));
        }
        if pid == 0 {
            child_main(
                &self.plan,
                &guards,
                &own,
                &keep,
                self.go_read.as_raw_fd(),
                self.report_write.as_raw_fd(),
            );
        }
        Ok((pid, self.pending))
    }
}

impl Pending {
    /// Runs `admit(pid)` (it records the child), then lets the child go on to its
    /// program. An `Err` from `admit`, or a go-ahead that cannot be written, is
    /// returned, and the child exits without running anything: it is not reaped here.
    pub fn release(
        self,
        pid: i32,
        admit: impl FnOnce(i32) -> Result<(), String>,
    ) -> Result<Exec, String> {
        admit(pid)?;
        if let Err(e) = nix::unistd::write(&self.go, &[1]) {
            return Err(format!("cannot release the child: {e}"));
        }
        drop(self.go);
        let _ = nix::fcntl::fcntl(
            &self.report,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        );
        Ok(Exec {
            report: self.report,
            rest: self.rest,
        })
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

const STAGE_EXEC: u32 = 0;
const STAGE_CWD: u32 = 1;
const STAGE_CREDS: u32 = 2;
const STAGE_FDS: u32 = 3;
const STAGE_NO_USER: u32 = 4;
const STAGE_NO_GROUP: u32 = 5;
const STAGE_NICE: u32 = 6;
/// The first of the limits' stages: limit number i fails as `STAGE_LIMIT + i`.
const STAGE_LIMIT: u32 = 100;

/// Waits for a child that is about to exit (refused, or its exec failed), so that it
/// leaves no zombie and the supervisor's reaping never sees a pid it did not record.
fn reap_now(pid: i32) {
    loop {
        match nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None) {
            Err(nix::errno::Errno::EINTR) => continue,
            _ => return,
        }
    }
}

/// A pipe whose both ends are close-on-exec and numbered at least `floor`.
fn pipe_above(floor: RawFd) -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    Ok((above(r, floor)?, above(w, floor)?))
}

/// `fd`, or a close-on-exec copy of it numbered at least `floor`: the child's `dup2`s
/// onto 0-2 and the readiness fd then never overwrite a source still to be used.
fn above(fd: OwnedFd, floor: RawFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() >= floor {
        return Ok(fd);
    }
    let n = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(floor))?;
    // SAFETY: fcntl just returned this new fd, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// What the forked child needs, built before the fork: C strings and pointer arrays,
/// fds numbered above every fd the child `dup2`s onto.
struct ChildPlan {
    /// Paths to try with `execve`, in order (one, or the PATH lookup of a bare name).
    candidates: Vec<CString>,
    _argv: Vec<CString>,
    _envp: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
    cwd: CString,
    /// Sources for 0, 1 and 2 (`None`: supd's own, inherited).
    stdio: [Option<OwnedFd>; 3],
    /// The readiness pipe's write end, moved above `floor`, and its number in the child.
    ready: Option<(OwnedFd, i32)>,
    user: Option<CString>,
    group: Option<CString>,
    /// Files to give to the user (before root is dropped).
    give: Vec<CString>,
    /// `env` sets HOME already (else the user's home directory is added).
    has_home: bool,
    /// `NAME=` of a variable set to the child's own pid.
    own_pid_env: Option<String>,
    /// supd's pid when it dies with supd (see `SpawnSpec::dies_with_supd`).
    dies_with: Option<libc::pid_t>,
    nofile: Option<libc::rlimit>,
    umask: Option<libc::mode_t>,
    nice: Option<libc::c_int>,
    limits: Vec<(nix::sys::resource::Resource, libc::rlimit)>,
    /// The `cgroup.procs` the child writes itself into (see `SpawnSpec::join`).
    join: Option<OwnedFd>,
    /// Every fd the child uses as a source is at least this.
    floor: RawFd,
}

/// The resources a limit may name, for the spawner's message (by number).
const RESOURCES: [nix::sys::resource::Resource; 8] = {
    use nix::sys::resource::Resource as R;
    [
        R::RLIMIT_NOFILE,
        R::RLIMIT_NPROC,
        R::RLIMIT_CORE,
        R::RLIMIT_MEMLOCK,
        R::RLIMIT_AS,
        R::RLIMIT_FSIZE,
        R::RLIMIT_STACK,
        R::RLIMIT_CPU,
    ]
};

/// A child's plan as one message to the spawner, with the fds it names (sent along):
/// its stdio and readiness sources, then its go-ahead and report pipes.
fn plan_message(p: &ChildPlan, go: RawFd, report: RawFd) -> (Vec<u8>, Vec<RawFd>) {
    let mut w = Wire(Vec::with_capacity(4096));
    let mut fds = Vec::new();
    w.int(i64::from(p.floor));
    w.list(&p.candidates);
    w.list(&p._argv);
    w.list(&p._envp);
    w.bytes(p.cwd.as_bytes());
    for src in &p.stdio {
        w.int(i64::from(src.is_some()));
        fds.extend(src.as_ref().map(|f| f.as_raw_fd()));
    }
    w.opt_int(p.ready.as_ref().map(|(_, n)| i64::from(*n)));
    fds.extend(p.ready.as_ref().map(|(f, _)| f.as_raw_fd()));
    for c in [&p.user, &p.group] {
        w.opt_bytes(c.as_ref().map(|c| c.as_bytes()));
    }
    w.list(&p.give);
    w.int(i64::from(p.has_home));
    w.opt_bytes(p.own_pid_env.as_ref().map(|s| s.as_bytes()));
    w.opt_int(p.dies_with.map(i64::from));
    w.opt_int(p.nofile.map(|l| l.rlim_cur as i64));
    w.opt_int(p.nofile.map(|l| l.rlim_max as i64));
    w.opt_int(p.umask.map(i64::from));
    w.opt_int(p.nice.map(i64::from));
    w.int(p.limits.len() as i64);
    for (r, l) in &p.limits {
        let n = RESOURCES.iter().position(|x| x == r).unwrap_or(0);
        w.int(n as i64);
        w.int(l.rlim_cur as i64);
        w.int(l.rlim_max as i64);
    }
    w.int(i64::from(p.join.is_some()));
    fds.extend(p.join.as_ref().map(|f| f.as_raw_fd()));
    fds.extend([go, report]);
    (w.0, fds)
}

/// The spawner's side of [`plan_message`]: the plan, and its go-ahead and report fds.
fn plan_from(msg: &[u8], fds: Vec<OwnedFd>) -> io::Result<(ChildPlan, OwnedFd, OwnedFd)> {
    let mut r = Unwire(msg);
    let mut fds = fds.into_iter();
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "a malformed spawn request");
    let floor = RawFd::try_from(r.int()?).map_err(|_| bad())?;
    let mut next_fd = || -> io::Result<OwnedFd> { above(fds.next().ok_or_else(bad)?, floor) };
    let candidates = r.list()?;
    let argv = r.list()?;
    let envp = r.list()?;
    let cwd = r.cstring()?;
    let mut stdio: [Option<OwnedFd>; 3] = [None, None, None];
    for src in &mut stdio {
        if r.int()? != 0 {
            *src = Some(next_fd()?);
        }
    }
    let ready = match r.opt_int()? {
        Some(n) => Some((next_fd()?, i32::try_from(n).map_err(|_| bad())?)),
        None => None,
    };
    let user = r.opt_cstring()?;
    let group = r.opt_cstring()?;
    let give = r.list()?;
    let has_home = r.int()? != 0;
    let own_pid_env = match r.opt_bytes()? {
        Some(b) => Some(String::from_utf8(b.to_vec()).map_err(|_| bad())?),
        None => None,
    };
    let dies_with = r.opt_int()?.map(|p| p as libc::pid_t);
    let nofile = match (r.opt_int()?, r.opt_int()?) {
        (Some(c), Some(m)) => Some(libc::rlimit {
            rlim_cur: c as libc::rlim_t,
            rlim_max: m as libc::rlim_t,
        }),
        _ => None,
    };
    let umask = r.opt_int()?.map(|m| m as libc::mode_t);
    let nice = r.opt_int()?.map(|n| n as libc::c_int);
    let mut limits = Vec::new();
    for _ in 0..r.int()? {
        let res = *RESOURCES.get(r.int()? as usize).ok_or_else(bad)?;
        let (cur, max) = (r.int()?, r.int()?);
        limits.push((
            res,
            libc::rlimit {
                rlim_cur: cur as libc::rlim_t,
                rlim_max: max as libc::rlim_t,
            },
        ));
    }
    let join = match r.int()? {
        0 => None,
        _ => Some(next_fd()?),
    };
    let go = next_fd()?;
    let report = next_fd()?;
    let ptrs = |v: &Vec<CString>| -> Vec<*const libc::c_char> {
        (v.iter().map(|a| a.as_ptr()))
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let plan = ChildPlan {
        argv_ptrs: ptrs(&argv),
        envp_ptrs: ptrs(&envp),
        candidates,
        _argv: argv,
        _envp: envp,
        cwd,
        stdio,
        ready,
        user,
        group,
        give,
        has_home,
        own_pid_env,
        dies_with,
        nofile,
        umask,
        nice,
        limits,
        join,
        floor,
    };
    Ok((plan, go, report))
}

/// The spawner forks a child of supd (`CLONE_PARENT`: supd is its parent, reaps it and
/// gets its SIGCHLD) that runs `msg`'s plan, as `spawn_service` would have; `own` are the
/// spawner's sockets, closed in the child. Returns the child's pid.
pub fn fork_for_supd(msg: &[u8], fds: Vec<OwnedFd>, own: &[RawFd]) -> io::Result<i32> {
    let (plan, go, report) = plan_from(msg, fds)?;
    let mut keep = plan.sources();
    keep.extend([go.as_raw_fd(), report.as_raw_fd()]);
    keep.sort_unstable();
    // SAFETY: clone without CLONE_VM is a fork whose child has the spawner's parent
    // (supd) for its parent; the spawner is single-threaded, so the child holds no lock
    // another thread could own, and it runs `child_main` only (as a forked child of
    // supd does) on the plan decoded above, then execs or exits. glibc's fork handlers
    // are not run: neither the spawner nor the child uses anything they reset.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        child_main(&plan, &[], own, &keep, go.as_raw_fd(), report.as_raw_fd());
    }
    Ok(pid as i32)
}

/// A message being written: integers and length-prefixed bytes.
struct Wire(Vec<u8>);

impl Wire {
    fn int(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_ne_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.int(b.len() as i64);
        self.0.extend_from_slice(b);
    }
    fn opt_int(&mut self, v: Option<i64>) {
        self.int(i64::from(v.is_some()));
        self.int(v.unwrap_or(0));
    }
    fn opt_bytes(&mut self, b: Option<&[u8]>) {
        self.int(i64::from(b.is_some()));
        self.bytes(b.unwrap_or(&[]));
    }
    fn list(&mut self, v: &[CString]) {
        self.int(v.len() as i64);
        for c in v {
            self.bytes(c.as_bytes());
        }
    }
}

/// A message being read back.
struct Unwire<'a>(&'a [u8]);

impl Unwire<'_> {
    fn bad() -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, "a malformed spawn request")
    }
    fn int(&mut self) -> io::Result<i64> {
        let (head, rest) = self.0.split_at_checked(8).ok_or_else(Self::bad)?;
        self.0 = rest;
        let mut b = [0u8; 8];
        b.copy_from_slice(head);
        Ok(i64::from_ne_bytes(b))
    }
    fn bytes(&mut self) -> io::Result<&[u8]> {
        let n = usize::try_from(self.int()?).map_err(|_| Self::bad())?;
        let (b, rest) = self.0.split_at_checked(n).ok_or_else(Self::bad)?;
        self.0 = rest;
        Ok(b)
    }
    fn cstring(&mut self) -> io::Result<CString> {
        CString::new(self.bytes()?).map_err(|_| Self::bad())
    }
    fn opt_int(&mut self) -> io::Result<Option<i64>> {
        let some = self.int()? != 0;
        let v = self.int()?;
        Ok(some.then_some(v))
    }
    fn opt_bytes(&mut self) -> io::Result<Option<&[u8]>> {
        let some = self.int()? != 0;
        let b = self.bytes()?;
        Ok(some.then_some(b))
    }
    fn opt_cstring(&mut self) -> io::Result<Option<CString>> {
        match self.opt_bytes()? {
            Some(b) => CString::new(b).map(Some).map_err(|_| Self::bad()),
            None => Ok(None),
        }
    }
    fn list(&mut self) -> io::Result<Vec<CString>> {
        let n = self.int()?;
        if !(0..=(1 << 20)).contains(&n) {
            return Err(Self::bad());
        }
        (0..n).map(|_| self.cstring()).collect()
    }
}

impl ChildPlan {
    fn new(spec: SpawnSpec) -> io::Result<ChildPlan> {
        let floor = spec.ready_fd.map(|(_, n)| n + 1).unwrap_or(3).max(3);
        let mut argv = vec![cstring(&spec.program)?];
        for a in &spec.args {
            argv.push(cstring(a)?);
        }
        let mut envp = Vec::with_capacity(spec.env.len());
        for (k, v) in &spec.env {
            envp.push(cstring(&format!("{k}={v}"))?);
        }
        let path = spec
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str())
            .unwrap_or(crate::launch::DEFAULT_PATH);
        let candidates = candidates(&spec.program, path)?;
        let io_fd = |io: Io, write: bool| -> io::Result<Option<OwnedFd>> {
            let fd = match io {
                Io::Inherit => return Ok(None),
                Io::Fd(fd) => fd,
                Io::Null => match dev_null_fd(write) {
                    Some(fd) => fd,
                    None => return Ok(None),
                },
            };
            above(fd, floor).map(Some)
        };
        let stdin = above(null_input()?, floor)?;
        let stdio = [
            Some(stdin),
            io_fd(spec.stdout, true)?,
            io_fd(spec.stderr, true)?,
        ];
        let ready = match spec.ready_fd {
            Some((fd, n)) => {
                let dup = nix::fcntl::fcntl(
                    unsafe_borrow(fd),
                    nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(floor),
                )?;
                // SAFETY: fcntl just returned this new fd, and nothing else owns it.
                Some((unsafe { OwnedFd::from_raw_fd(dup) }, n))
            }
            None => None,
        };
        let argv_ptrs = argv
            .iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let envp_ptrs = envp
            .iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        Ok(ChildPlan {
            candidates,
            _argv: argv,
            _envp: envp,
            argv_ptrs,
            envp_ptrs,
            cwd: cstring(&spec.cwd.to_string_lossy())?,
            stdio,
            ready,
            user: match spec.creds.as_ref().and_then(|c| c.user.as_deref()) {
                Some(u) => Some(cstring(u)?),
                None => None,
            },
            group: match spec.creds.as_ref().and_then(|c| c.group.as_deref()) {
                Some(g) => Some(cstring(g)?),
                None => None,
            },
            give: (spec.give.iter())
                .map(|p| cstring(&p.to_string_lossy()))
                .collect::<io::Result<_>>()?,
            has_home: spec.env.iter().any(|(k, _)| k == "HOME"),
            own_pid_env: spec.own_pid_env.as_ref().map(|k| format!("{k}=")),
            dies_with: spec
                .dies_with_supd
                .then(std::process::id)
                .map(|p| p as libc::pid_t),
            nofile: CHILD_NOFILE.get().copied(),
            umask: spec.tuning.umask.map(|m| m as libc::mode_t),
            nice: spec.tuning.nice,
            limits: spec
                .tuning
                .limits
                .iter()
                .map(resource)
                .collect::<io::Result<_>>()?,
            join: spec.join.map(|fd| above(fd, floor)).transpose()?,
            floor,
        })
    }
}

impl ChildPlan {
    /// The fds the child uses: those it `dup2`s from, and its cgroup's.
    fn sources(&self) -> Vec<RawFd> {
        let stdio = self.stdio.iter().flatten().map(|f| f.as_raw_fd());
        let ready = self.ready.iter().map(|(f, _)| f.as_raw_fd());
        let join = self.join.iter().map(|f| f.as_raw_fd());
        stdio.chain(ready).chain(join).collect()
    }
}

/// A configured limit as `setrlimit` takes it.
fn resource(l: &crate::config::Rlimit) -> io::Result<(nix::sys::resource::Resource, libc::rlimit)> {
    use nix::sys::resource::Resource as R;
    let r = match l.name.as_str() {
        "nofile" => R::RLIMIT_NOFILE,
        "nproc" => R::RLIMIT_NPROC,
        "core" => R::RLIMIT_CORE,
        "memlock" => R::RLIMIT_MEMLOCK,
        "as" => R::RLIMIT_AS,
        "fsize" => R::RLIMIT_FSIZE,
        "stack" => R::RLIMIT_STACK,
        "cpu" => R::RLIMIT_CPU,
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no resource limit named '{other}'"),
            ))
        }
    };
    let value = |v: Option<u64>| v.map_or(libc::RLIM_INFINITY, |n| n as libc::rlim_t);
    Ok((
        r,
        libc::rlimit {
            rlim_cur: value(l.soft),
            rlim_max: value(l.hard),
        },
    ))
}

/// The paths `execve` tries for `program`: itself when it names a path, otherwise each
/// directory of `path` joined with it (as `execvp` does, but prepared before the fork).
fn candidates(program: &str, path: &str) -> io::Result<Vec<CString>> {
    if program.contains('/') {
        return Ok(vec![cstring(program)?]);
    }
    if program.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "empty program name",
        ));
    }
    let mut out = Vec::new();
    for dir in path.split(':') {
        let dir = if dir.is_empty() { "." } else { dir };
        out.push(cstring(&format!("{dir}/{program}"))?);
    }
    Ok(out)
}

/// The forked child: runs only async-signal-safe system calls, and never returns. First
/// it drops every fd it does not need (`keep` is sorted): the guards at once, the
/// parent's ends of its pipes (else it would never see end-of-file), and the rest, so
/// that a child still waiting holds nothing of supd's.
fn child_main(
    p: &ChildPlan,
    guards: &[RawFd],
    own: &[RawFd],
    keep: &[RawFd],
    go: RawFd,
    report: RawFd,
) -> ! {
    // SAFETY (whole function): each call is a plain async-signal-safe system call on
    // integers or on pointers into memory prepared before the fork, which this child's
    // copy of the address space still holds; the child ends in execve or _exit and never
    // returns into Rust code of the parent. After its go-ahead it also allocates, reads
    // the user database and (refused) stats its path: sound because supd has one
    // thread, so no lock in this copy of it is held by another.
    unsafe {
        for &fd in guards.iter().chain(own) {
            if fd >= 0 {
                libc::close(fd);
            }
        }
        close_all_but(3, keep);
        libc::setsid();
        if let Some(join) = &p.join {
            join_cgroup(join.as_raw_fd(), report);
        }
        // Wait for the parent's go-ahead: end-of-file means supd died or refused.
        let mut byte = 0u8;
        loop {
            let n = libc::read(go, (&mut byte as *mut u8).cast(), 1);
            if n == 1 {
                break;
            }
            if n < 0 && errno_now() == libc::EINTR {
                continue;
            }
            libc::_exit(127);
        }
        // supd ignores SIGPIPE (a gone client is an error, not a death), and as PID 1
        // SIGTTIN and SIGTTOU; its children get the defaults back. Every other disposition was reset once in supd itself
        // (`reset_dispositions`), and the mask supd blocks for its signalfd is cleared.
        for sig in [libc::SIGPIPE, libc::SIGTTIN, libc::SIGTTOU] {
            libc::signal(sig, libc::SIG_DFL);
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        if let Some(limit) = p.nofile.as_ref() {
            libc::setrlimit(libc::RLIMIT_NOFILE, limit);
        }
        for (i, (resource, limit)) in p.limits.iter().enumerate() {
            if libc::setrlimit(*resource as _, limit) < 0 {
                fail(report, STAGE_LIMIT + i as u32);
            }
        }
        if let Some(mask) = p.umask {
            libc::umask(mask);
        }
        if let Some(n) = p.nice {
            if libc::setpriority(libc::PRIO_PROCESS, 0, n) < 0 {
                fail(report, STAGE_NICE);
            }
        }
        for (target, src) in p.stdio.iter().enumerate() {
            if let Some(fd) = src {
                if libc::dup2(fd.as_raw_fd(), target as RawFd) < 0 {
                    fail(report, STAGE_FDS);
                }
            }
        }
        if let Some((fd, n)) = &p.ready {
            if libc::dup2(fd.as_raw_fd(), *n) < 0 {
                fail(report, STAGE_FDS);
            }
        }
        let ids = account(p, report);
        let mut envp = p.envp_ptrs.as_ptr();
        let with_home: Vec<*const libc::c_char>;
        // Allocating here is sound: supd has one thread, so no lock of the allocator
        // can be held by another in this copy of it.
        let own_pid: Option<CString> = p
            .own_pid_env
            .as_ref()
            .and_then(|k| CString::new(format!("{k}{}", libc::getpid())).ok());
        let home = ids.home.as_ref().filter(|_| !p.has_home);
        if home.is_some() || own_pid.is_some() {
            let n = p.envp_ptrs.len() - 1;
            with_home = p.envp_ptrs[..n]
                .iter()
                .copied()
                .chain(home.map(|h| h.as_ptr()))
                .chain(own_pid.as_ref().map(|c| c.as_ptr()))
                .chain([std::ptr::null()])
                .collect();
            envp = with_home.as_ptr();
        }
        if let Some(uid) = ids.uid {
            for file in &p.give {
                libc::chown(file.as_ptr(), uid, ids.gid.unwrap_or(u32::MAX));
            }
        }
        if let Some(gid) = ids.gid {
            if libc::setgroups(ids.groups.len(), ids.groups.as_ptr()) < 0 || libc::setgid(gid) < 0 {
                fail(report, STAGE_CREDS);
            }
        }
        if let Some(uid) = ids.uid {
            if libc::setuid(uid) < 0 {
                fail(report, STAGE_CREDS);
            }
        }
        // Set after the change of user, which clears it; a supd that died before this
        // line is seen in the parent pid, which is then no longer its.
        if let Some(supd) = p.dies_with {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != supd {
                libc::_exit(127);
            }
        }
        // Who it became, for supd to remember (it never reads the user database).
        let who = p.user.as_ref().zip(ids.uid).map(|(name, uid)| {
            let mut gids = ids.groups.clone();
            gids.extend(ids.gid.filter(|g| !ids.groups.contains(g)));
            crate::access::Who {
                name: name.to_string_lossy().into_owned(),
                uid,
                gids,
            }
        });
        if let Some(who) = &who {
            let mut body = Vec::with_capacity(4 * (who.gids.len() + 1));
            for id in std::iter::once(who.uid).chain(who.gids.iter().copied()) {
                body.extend_from_slice(&id.to_ne_bytes());
            }
            write_record(report, REPORT_TOOK, &body);
        }
        // Entered as the service's user: a directory it may not enter is refused here,
        // not left as a cwd it cannot use.
        let cwd = std::path::Path::new(std::ffi::OsStr::from_bytes(p.cwd.to_bytes()));
        if libc::chdir(p.cwd.as_ptr()) < 0 {
            let errno = errno_now();
            if let (libc::EACCES, Some(who)) = (errno, &who) {
                let found = crate::access::diagnose(cwd, cwd, who, crate::access::Want::Enter);
                fail_found(report, STAGE_CWD, errno, found);
            }
            fail_with(report, STAGE_CWD, errno);
        }
        // As execvp: the first candidate that runs wins; one that exists but may not be
        // run (EACCES) is reported over the ones that do not exist.
        let mut denied = None;
        let mut errno = libc::ENOENT;
        for path in &p.candidates {
            libc::execve(path.as_ptr(), p.argv_ptrs.as_ptr(), envp);
            errno = errno_now();
            match errno {
                libc::EACCES => denied = denied.or(Some(path)),
                libc::ENOENT | libc::ENOTDIR => {}
                _ => break,
            }
        }
        if denied.is_some() && (errno == libc::ENOENT || errno == libc::ENOTDIR) {
            errno = libc::EACCES;
        }
        if let (libc::EACCES, Some(path), Some(who)) = (errno, denied, &who) {
            // As its user, what on the way refuses it (names of owners looked up here,
            // in the child, never in supd).
            let path = std::path::Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
            let found = crate::access::diagnose(path, cwd, who, crate::access::Want::Exec);
            fail_found(report, STAGE_EXEC, errno, found);
        }
        fail_with(report, STAGE_EXEC, errno)
    }
}

/// Who the child becomes, looked up in the child.
struct Ids {
    uid: Option<libc::uid_t>,
    gid: Option<libc::gid_t>,
    groups: Vec<libc::gid_t>,
    /// `HOME=` and the user's home directory.
    home: Option<CString>,
}

/// Looks up the child's user and group (in the forked child: reads the user database,
/// allocates; sound because supd has one thread). Reports and exits when one is unknown.
fn account(p: &ChildPlan, report: RawFd) -> Ids {
    let mut ids = Ids {
        uid: None,
        gid: None,
        groups: Vec::new(),
        home: None,
    };
    // SAFETY: getpwnam and getgrnam take C strings prepared before the fork and return
    // pointers into static storage, read at once; getgrouplist writes at most `n`
    // entries into a buffer of that length.
    unsafe {
        if let Some(u) = &p.user {
            *libc::__errno_location() = 0;
            let pw = libc::getpwnam(u.as_ptr());
            if pw.is_null() {
                fail_with(report, STAGE_NO_USER, errno_now());
            }
            ids.uid = Some((*pw).pw_uid);
            ids.gid = Some((*pw).pw_gid);
            if !(*pw).pw_dir.is_null() {
                let dir = std::ffi::CStr::from_ptr((*pw).pw_dir).to_bytes();
                ids.home = CString::new([b"HOME=".as_slice(), dir].concat()).ok();
            }
        }
        if let Some(g) = &p.group {
            *libc::__errno_location() = 0;
            let gr = libc::getgrnam(g.as_ptr());
            if gr.is_null() {
                fail_with(report, STAGE_NO_GROUP, errno_now());
            }
            ids.gid = Some((*gr).gr_gid);
        }
        if let (Some(u), Some(gid)) = (&p.user, ids.gid) {
            let mut n: libc::c_int = 64;
            loop {
                ids.groups = vec![0; n as usize];
                let before = n;
                if libc::getgrouplist(u.as_ptr(), gid, ids.groups.as_mut_ptr(), &mut n) >= 0 {
                    ids.groups.truncate(n as usize);
                    break;
                }
                if n <= before {
                    n = before * 2;
                }
                if n > 65536 {
                    ids.groups = vec![gid];
                    break;
                }
            }
        } else if let Some(gid) = ids.gid {
            ids.groups = vec![gid];
        }
    }
    ids
}

/// Closes every fd from `from` up but those of `keep` (sorted; negative ones ignored).
fn close_all_but(from: RawFd, keep: &[RawFd]) {
    let mut low = from;
    for &k in keep.iter().filter(|k| **k >= from) {
        if k > low {
            close_range(low, k - 1);
        }
        low = low.max(k + 1);
    }
    close_range(low, RawFd::MAX);
}

/// What this kernel lacks, learned once by a probe and remembered (a forked child reads
/// its parent's answer, so the probe runs in the parent: `probe_kernel`).
const UNKNOWN: u8 = 0;
const PRESENT: u8 = 1;
const MISSING: u8 = 2;
static CLOSE_RANGE: AtomicU8 = AtomicU8::new(UNKNOWN);
static PIDFD: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Learns once which of the newer system calls this kernel has (`close_range`, Linux
/// 5.9; pidfds, 5.3), so that forked children, which must not probe and log, take the
/// right path at once. Cheap: two system calls that change nothing. Called first thing
/// by supd (before any fork); says once what is missing.
pub fn probe_kernel() {
    if CLOSE_RANGE.load(Ordering::Relaxed) == UNKNOWN {
        // SAFETY: close_range on an empty range (from the largest fd number) closes
        // nothing; it takes integers only. It fails with ENOSYS where it is missing.
        let r = unsafe {
            libc::syscall(
                libc::SYS_close_range,
                libc::c_uint::MAX,
                libc::c_uint::MAX,
                0 as libc::c_uint,
            )
        };
        let missing = r < 0 && errno_now() == libc::ENOSYS;
        CLOSE_RANGE.store(if missing { MISSING } else { PRESENT }, Ordering::Relaxed);
        if missing {
            log::info!(
                "no close_range (Linux before 5.9): children close their fds as /proc/self/fd lists them"
            );
        }
    }
    if PIDFD.load(Ordering::Relaxed) == UNKNOWN {
        if let Ok(fd) = pidfd_open(std::process::id() as i32) {
            drop(fd);
        }
    }
}

/// Closes fds `low..=high`: `close_range` where the kernel has it, else (Linux before
/// 5.9) each fd `/proc/self/fd` lists in the range, else (no /proc: an init before it
/// mounts it) every number up to the open-files limit. Async-signal-safe: raw system
/// calls and a buffer on the stack, for forked children.
fn close_range(low: RawFd, high: RawFd) {
    if low > high {
        return;
    }
    if CLOSE_RANGE.load(Ordering::Relaxed) != MISSING {
        // SAFETY: close_range takes integers and only closes this process's fds.
        let r = unsafe {
            libc::syscall(
                libc::SYS_close_range,
                low as libc::c_uint,
                high as libc::c_uint,
                0 as libc::c_uint,
            )
        };
        if r == 0 {
            return;
        }
    }
    close_listed(low, high);
}

/// `close_range` without the system call: the fds `/proc/self/fd` lists (read with
/// `getdents64` into a stack buffer, no allocation), or every number up to the soft
/// open-files limit where /proc is not there.
fn close_listed(low: RawFd, high: RawFd) {
    // SAFETY (whole function): open, getdents64, close and getrlimit on integers, a
    // static C string, and buffers on this stack that outlive each call; the records
    // getdents64 wrote are read within the `n` bytes it reported, each record's length
    // taken from its own header.
    unsafe {
        let dir = libc::open(
            c"/proc/self/fd".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if dir < 0 {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
            let top = (lim.rlim_cur.min(1 << 20) as RawFd).min(high.saturating_add(1));
            for fd in low..top {
                libc::close(fd);
            }
            return;
        }
        // u64s: the records' 8-byte fields are aligned.
        let mut buf = [0u64; 512];
        loop {
            let n = libc::syscall(
                libc::SYS_getdents64,
                dir,
                buf.as_mut_ptr(),
                std::mem::size_of_val(&buf),
            );
            if n <= 0 {
                break;
            }
            let bytes = buf.as_ptr().cast::<u8>();
            let mut off = 0usize;
            // struct linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, name.
            while off + 19 < n as usize {
                let reclen = u16::from_ne_bytes([*bytes.add(off + 16), *bytes.add(off + 17)]);
                let mut fd: i64 = 0;
                let mut digits = 0;
                let mut i = off + 19;
                while i < off + reclen as usize && (*bytes.add(i)).is_ascii_digit() {
                    fd = fd * 10 + (*bytes.add(i) - b'0') as i64;
                    digits += 1;
                    i += 1;
                }
                // Closing fds below the directory's position does not disturb it: it
                // lists fds by number.
                if digits > 0 && fd >= low as i64 && fd <= high as i64 && fd != dir as i64 {
                    libc::close(fd as RawFd);
                }
                if reclen == 0 {
                    break;
                }
                off += reclen as usize;
            }
        }
        libc::close(dir);
    }
}

/// This thread's errno.
fn errno_now() -> i32 {
    // SAFETY: __errno_location returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() }
}

/// Writes the failed stage and the current errno to the report pipe and exits.
fn fail(report: RawFd, stage: u32) -> ! {
    fail_with(report, stage, errno_now())
}

/// Writes `stage` and `errno` to the report pipe and exits (in the child; no
/// allocation).
fn fail_with(report: RawFd, stage: u32, errno: i32) -> ! {
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
fn fail_found(report: RawFd, stage: u32, errno: i32, found: Option<String>) -> ! {
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

/// Moves the calling child into the cgroup whose `cgroup.procs` is `procs` ("0" names
/// the writer), and closes it; a refusal is reported, and the child goes on (no
/// allocation: it runs before the go-ahead).
fn join_cgroup(procs: RawFd, report: RawFd) {
    // SAFETY: writes one byte from a static, then closes an fd this child owns.
    let n = loop {
        let n = unsafe { libc::write(procs, b"0".as_ptr().cast(), 1) };
        if n < 0 && errno_now() == libc::EINTR {
            continue;
        }
        break n;
    };
    let errno = if n == 1 { 0 } else { errno_now().max(1) };
    // SAFETY: `procs` is this child's copy, used no more (its plan is never dropped).
    unsafe { libc::close(procs) };
    if errno != 0 {
        let mut msg = [0u8; 12];
        msg[..4].copy_from_slice(&REPORT_NO_CGROUP.to_ne_bytes());
        msg[4..8].copy_from_slice(&4u32.to_ne_bytes());
        msg[8..].copy_from_slice(&errno.to_ne_bytes());
        write_all(report, &msg);
    }
}

/// Writes one record (its kind, its length, `body`) to the report pipe (in the child).
fn write_record(report: RawFd, kind: u32, body: &[u8]) {
    let mut msg = Vec::with_capacity(8 + body.len());
    msg.extend_from_slice(&kind.to_ne_bytes());
    msg.extend_from_slice(&(body.len() as u32).to_ne_bytes());
    msg.extend_from_slice(body);
    write_all(report, &msg);
}

/// Writes all of `bytes` to `fd` (a pipe that may take a large record in parts).
fn write_all(fd: RawFd, mut bytes: &[u8]) {
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

/// Standard input for a service: `/dev/null`, or, before `/dev` exists (an init that has
/// not mounted it yet), the read end of a pipe whose write end is closed: end-of-file at
/// once, as from `/dev/null`.
fn null_input() -> io::Result<OwnedFd> {
    if let Some(fd) = dev_null_fd(false) {
        return Ok(fd);
    }
    let (read, _write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    Ok(read)
}

/// `/dev/null` for reading or writing, or `None` before `/dev` exists (an init whose
/// first one-shots have not mounted it yet); callers choose what stands in for it.
fn dev_null_fd(write: bool) -> Option<OwnedFd> {
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .open("/dev/null")
        .ok()
        .map(OwnedFd::from)
}

/// The local time zone's offset from UTC, in seconds, at `unix_secs` (for `supctl
/// watch`'s times); 0 where it cannot be known.
pub fn utc_offset(unix_secs: i64) -> i64 {
    let t = unix_secs as libc::time_t;
    // SAFETY: `tm` is plain data that localtime_r fills (zeroed is a valid value of it);
    // both pointers are to locals that outlive the call; localtime_r is the reentrant
    // form and keeps no pointer to them.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return 0;
        }
        tm.tm_gmtoff as i64
    }
}

/// As PID 1: ignores SIGTTIN and SIGTTOU, so that a write to (or read from) a terminal
/// supd does not own never stops the init. Children get the defaults back.
pub fn ignore_tty_stops() {
    for sig in [libc::SIGTTIN, libc::SIGTTOU] {
        // SAFETY: sets a disposition to SIG_IGN; no handler, no memory is involved.
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
}

/// Resets every signal's disposition to the default, except SIGPIPE (ignored, so a write
/// to a gone client is an error, not a death). Called once at start: supd installs no
/// handlers (it reads signals from a signalfd), so children, which inherit dispositions,
/// start clean without a reset loop between fork and exec. Ignored dispositions inherited
/// from whoever started supd (`nohup`, a shell) are cleared here.
pub fn reset_dispositions() {
    // A kernel `sigaction` for SIG_DFL is all zeros (handler 0, no flags, empty mask),
    // whatever the architecture's field order: 32 zero bytes cover every layout.
    let default_action = [0u64; 4];
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP || sig == libc::SIGPIPE {
            continue;
        }
        // SAFETY: rt_sigaction reads `default_action`, which lives for the call, and
        // writes nothing (old action pointer is null). The raw syscall is used because
        // glibc refuses signals 32 and 33, which a parent may have left ignored.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                default_action.as_ptr(),
                std::ptr::null_mut::<u64>(),
                8usize,
            );
        }
    }
}

/// Marks every fd from 3 up close-on-exec: what supd inherited from whoever started it
/// (a shell's saved fds, a leaked pipe) must not reach its services. Called first thing.
pub fn cloexec_inherited() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range takes integers and only changes fd flags; it touches no memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return;
    }
    // Kernels before 5.11: one fcntl per open fd.
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<RawFd> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd >= 3)
        .collect();
    for fd in fds {
        // SAFETY: F_SETFD on an fd number only changes its flags; a closed number fails
        // harmlessly with EBADF.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// The POSIX access ACL of `path` (its `system.posix_acl_access` extended attribute,
/// following symbolic links), raw; `None` when it has none or it cannot be read.
pub fn posix_acl(path: &std::path::Path) -> Option<Vec<u8>> {
    let p = CString::new(path.as_os_str().as_bytes()).ok()?;
    let name = c"system.posix_acl_access";
    let mut buf = vec![0u8; 4096];
    // SAFETY: getxattr reads two NUL-terminated strings that live across the call and
    // writes at most `buf.len()` bytes into `buf`, which is that long.
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n <= 0 {
        return None;
    }
    buf.truncate(n as usize);
    Some(buf)
}

/// A pidfd for `pid`: readable once that process has exited, whoever its parent is.
/// Fails with ENOSYS, without a system call once the kernel said so, on kernels before
/// 5.3 (callers then go by pid and start time: `proc::kill_if_same`).
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    if PIDFD.load(Ordering::Relaxed) == MISSING {
        return Err(io::Error::from_raw_os_error(libc::ENOSYS));
    }
    // SAFETY: pidfd_open takes two integers and returns a new fd or -1; nothing is
    // borrowed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOSYS) if PIDFD.swap(MISSING, Ordering::Relaxed) != MISSING => {
                log::info!(
                    "no pidfds (Linux before 5.3): processes are told apart by pid and start time, and awaited by a timer"
                );
            }
            Some(libc::ESRCH) => PIDFD.store(PRESENT, Ordering::Relaxed),
            // Another refusal (EMFILE) says nothing about the kernel.
            _ => {}
        }
        return Err(e);
    }
    PIDFD.store(PRESENT, Ordering::Relaxed);
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends `sig` to the process of a pidfd: exact even if its pid was taken by another
/// process meanwhile (Linux 5.1).
pub fn pidfd_send_signal(fd: &OwnedFd, sig: i32) -> io::Result<()> {
    // SAFETY: pidfd_send_signal takes an fd we own, a signal number and a null info
    // pointer (the kernel fills in the default); nothing is borrowed beyond the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Raw fd of anything that has one, for a pre-exec `dup2`.
pub fn raw(fd: &impl AsRawFd) -> RawFd {
    fd.as_raw_fd()
}

/// A C string for a path or name; interior NULs become an error instead of a panic.
pub fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "contains a NUL byte"))
}

/// Takes ownership of an fd number handed over by a previous supd image.
pub fn adopt_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // Refuse what is not an open fd: fcntl(F_GETFD) fails with EBADF.
    nix::fcntl::fcntl(unsafe_borrow(fd), nix::fcntl::FcntlArg::F_GETFD)?;
    // SAFETY: the handoff names this fd as ours (the previous image left it open across
    // exec for us), it is open (checked above), and nothing else in this process owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn unsafe_borrow(fd: RawFd) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: used only for the one fcntl call above, on an fd this process holds for its
    // whole life (it was kept open across exec for us).
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

/// Keeps `fd` open across `exec` (`keep`), or closes it there again.
pub fn keep_across_exec(fd: &impl std::os::fd::AsFd, keep: bool) -> io::Result<()> {
    let flags = if keep {
        nix::fcntl::FdFlag::empty()
    } else {
        nix::fcntl::FdFlag::FD_CLOEXEC
    };
    nix::fcntl::fcntl(fd.as_fd(), nix::fcntl::FcntlArg::F_SETFD(flags))?;
    Ok(())
}

/// The open-files limit children get, as `SUP_CHILD_NOFILE` for a re-executed image.
pub fn child_nofile_env() -> Option<String> {
    CHILD_NOFILE
        .get()
        .map(|l| format!("{}:{}", l.rlim_cur, l.rlim_max))
}

/// Replaces this process's image with `argv[0]`, environment kept. Returns only on
/// failure, with the reason.
pub fn exec(argv: &[String]) -> String {
    let args: Result<Vec<CString>, _> = argv.iter().map(|a| cstring(a)).collect();
    let args = match args {
        Ok(a) if !a.is_empty() => a,
        _ => return "bad program name or arguments".into(),
    };
    match nix::unistd::execv(&args[0], &args) {
        Ok(never) => match never {},
        Err(e) => format!("cannot execute {}: {}", argv[0], e.desc()),
    }
}

/// Sends `sig` (then SIGCONT, unless it is SIGKILL) to every process but supd and init,
/// from a forked child: `kill(-1)` spares the caller, and supd must not be the caller
/// when it is not PID 1. Returns the child's pid (reap it).
pub fn fork_kill_all(sig: i32) -> io::Result<i32> {
    // SAFETY: supd is single-threaded; the child calls only kill and _exit, which are
    // async-signal-safe, and touches no memory of the parent.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            // SAFETY: plain syscalls on integers in the forked child, then _exit without
            // running any of the parent's destructors or atexit handlers.
            unsafe {
                libc::kill(-1, sig);
                if sig != libc::SIGKILL {
                    libc::kill(-1, libc::SIGCONT);
                }
                libc::_exit(0)
            }
        }
        child => Ok(child),
    }
}

/// Runs `work` in a forked child, which keeps only the fds in `keep` and ends with
/// `_exit` of what `work` returns (101 if it panics). Returns the child's pid (reap it).
///
/// For work that must not stall the loop (reading a large config): supd is
/// single-threaded, so the child's copy of the heap is consistent and `work` may
/// allocate; it never returns into the parent's code (no destructors, no atexit
/// handlers, no flush of the parent's buffers).
pub fn fork_worker(keep: RawFd, work: impl FnOnce() -> i32) -> io::Result<i32> {
    let parent = std::process::id() as i32;
    // SAFETY: supd has one thread (no lock of another thread is copied held); the child
    // runs `work` and then `_exit`s, below.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            // It dies with supd, and holds none of supd's sockets, pipes or locks (the
            // guards first: a new supd must never find them held).
            for g in &GUARDS {
                let fd = g.load(Ordering::Relaxed);
                if fd >= 0 && fd != keep {
                    // SAFETY: closes an fd number of this (child) process.
                    unsafe { libc::close(fd) };
                }
            }
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            // Named apart from supd in `ps` (and for tests that tell helpers from
            // services' children not yet exec'd).
            // SAFETY: PR_SET_NAME reads a NUL-terminated string from a static.
            unsafe { libc::prctl(libc::PR_SET_NAME, c"supd-worker".as_ptr()) };
            if nix::unistd::getppid().as_raw() != parent {
                // supd died before the death signal was set.
                // SAFETY: ends the child at once.
                unsafe { libc::_exit(1) }
            }
            // Below supd's priority: on a busy machine the loop keeps its CPU.
            // SAFETY: setpriority takes integers and changes only this process.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
            if keep > 3 {
                close_range(3, keep - 1);
            }
            close_range(keep + 1, RawFd::MAX);
            let status =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or(101);
            // SAFETY: ends the child without unwinding into or running the parent's code.
            unsafe { libc::_exit(status) }
        }
        child => Ok(child),
    }
}

/// The file (device, inode) an fd number names now, if it is open: tells a file still
/// held from a new one that took its number.
pub fn file_of_raw(fd: RawFd) -> Option<(u64, u64)> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a whole `struct stat` into the buffer it is given, which is
    // only read after it says it did; an fd number that is not open is refused (EBADF),
    // not used.
    let rc = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, so the buffer is initialised.
    let st = unsafe { st.assume_init() };
    Some((st.st_dev, st.st_ino))
}

/// Takes fd number `fd` out of an epoll set. The caller has just checked that the number
/// still names the file it registered (`file_of_raw`): nix's `delete` wants a borrowed
/// fd, which a bare number is not.
pub fn epoll_delete_raw(epoll: &nix::sys::epoll::Epoll, fd: RawFd) {
    // SAFETY: EPOLL_CTL_DEL reads no event (a null pointer is allowed since Linux
    // 2.6.9) and only looks the number up; a number not in the set is refused (ENOENT).
    let rc = unsafe {
        libc::epoll_ctl(
            epoll.0.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            fd,
            std::ptr::null_mut(),
        )
    };
    if rc != 0 {
        log::debug!("epoll: fd {fd}: {}", io::Error::last_os_error());
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

    /// What the spawner rebuilds from supd's message is the plan supd made, field by
    /// field, with the fds it names in their places.
    #[test]
    fn a_plan_crosses_to_the_spawner_whole() {
        let (r, w) = nix::unistd::pipe().expect("pipe");
        let (ready_r, ready_w) = nix::unistd::pipe().expect("pipe");
        let spec = SpawnSpec {
            program: "prog".into(),
            args: vec!["--a".into(), "b c".into()],
            env: vec![("PATH".into(), "/x:/y".into()), ("K".into(), "v".into())],
            cwd: "/srv".into(),
            stdout: Io::Fd(w),
            stderr: Io::Inherit,
            creds: Some(Account {
                user: Some("www".into()),
                group: Some("web".into()),
            }),
            ready_fd: Some((ready_w.as_raw_fd(), 5)),
            give: vec!["/run/n.sock".into(), "/run/redis".into()],
            tuning: Tuning {
                umask: Some(0o027),
                nice: Some(-3),
                limits: vec![crate::config::Rlimit {
                    name: "core".into(),
                    soft: Some(0),
                    hard: None,
                }],
            },
            own_pid_env: Some("WATCHDOG_PID".into()),
            dies_with_supd: true,
            join: Some(OwnedFd::from(
                std::fs::File::open("/").expect("a directory"),
            )),
        };
        let plan = ChildPlan::new(spec).expect("plan");
        let (go, report) = nix::unistd::pipe().expect("pipe");
        let (msg, fds) = plan_message(&plan, go.as_raw_fd(), report.as_raw_fd());
        assert_eq!(fds.len(), 6, "stdin, stdout, ready, join, go, report");
        let dups: Vec<OwnedFd> = fds
            .iter()
            .map(|fd| nix::unistd::dup(unsafe_borrow(*fd)).expect("dup"))
            .collect();
        let inodes: Vec<_> = fds.iter().map(|fd| file_of_raw(*fd)).collect();
        let (back, go2, report2) = plan_from(&msg, dups).expect("decoded");
        assert_eq!(back.candidates, plan.candidates);
        assert_eq!(
            (back._argv.clone(), back._envp.clone()),
            (plan._argv.clone(), plan._envp.clone())
        );
        assert_eq!(back.argv_ptrs.len(), plan.argv_ptrs.len());
        assert_eq!(back.cwd, plan.cwd);
        assert_eq!(
            (back.user.clone(), back.group.clone(), back.give.clone()),
            (plan.user.clone(), plan.group.clone(), plan.give.clone())
        );
        assert_eq!(
            (back.has_home, back.own_pid_env.clone(), back.dies_with),
            (plan.has_home, plan.own_pid_env.clone(), plan.dies_with)
        );
        assert_eq!(
            (back.umask, back.nice, back.floor),
            (plan.umask, plan.nice, plan.floor)
        );
        let limits = |p: &ChildPlan| -> Vec<_> {
            p.limits
                .iter()
                .map(|(r, l)| (*r, l.rlim_cur, l.rlim_max))
                .collect()
        };
        assert_eq!(limits(&back), limits(&plan));
        assert_eq!(back.stdio[2].is_none(), plan.stdio[2].is_none());
        assert_eq!(back.ready.as_ref().map(|r| r.1), Some(5));
        // Each fd names the same file as supd's, numbered at or above the floor.
        let got = [
            back.stdio[0].as_ref().map(|f| f.as_raw_fd()),
            back.stdio[1].as_ref().map(|f| f.as_raw_fd()),
            back.ready.as_ref().map(|r| r.0.as_raw_fd()),
            back.join.as_ref().map(|f| f.as_raw_fd()),
            Some(go2.as_raw_fd()),
            Some(report2.as_raw_fd()),
        ];
        for (fd, inode) in got.iter().zip(&inodes) {
            let fd = fd.expect("present");
            assert!(fd >= plan.floor, "fd {fd} below the floor {}", plan.floor);
            assert_eq!(file_of_raw(fd), *inode);
        }
        drop((r, ready_r));
        // A message cut short is refused, not read past its end.
        assert!(plan_from(&msg[..msg.len() / 2], Vec::new()).is_err());
    }
}
