//! The child: its fork (by supd itself, or by the spawner with `CLONE_PARENT`), its hold
//! until supd has recorded it (`Pending::release`), and its life between fork and exec
//! (`child_main`: raw system calls only, then its user, its directory, its program).

use super::fds::{close_all_but, pipe_above, GUARDS};
use super::plan::{plan_from, plan_message, ChildPlan, SpawnSpec};
use super::raw::errno_now;
use super::report::{
    fail, fail_found, fail_with, write_all, write_record, Exec, ExecRest, REPORT_NO_CGROUP,
    REPORT_TOOK, STAGE_CREDS, STAGE_CWD, STAGE_EXEC, STAGE_FDS, STAGE_LIMIT, STAGE_NICE,
    STAGE_NO_GROUP, STAGE_NO_USER,
};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
/// Forks `spec` here, in supd itself, and waits for its exec's outcome: for the spawner,
/// which cannot fork itself (everything else is spawned through it: `spawner::spawn`).
pub fn spawn_direct(spec: SpawnSpec) -> Result<i32, String> {
    let (pid, pending) = Prepared::new(spec)?.fork_here()?;
    let exec = pending.release_or_reap(pid, |_| Ok(()))?;
    wait_exec(pid, exec)
}

/// Waits for the exec of a child released with nothing to do in between (a helper, a
/// check's command, the spawner): its pid once its program runs; why not, once the
/// child that could not run it is reaped.
pub fn wait_exec(pid: i32, mut exec: Exec) -> Result<i32, String> {
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

/// A child's plan and its pipes, before its fork: sent to the spawner
/// (`Prepared::message`, then `Prepared::pending`), or forked here (`fork_here`).
pub struct Prepared {
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
    pub fn new(spec: SpawnSpec) -> Result<Prepared, String> {
        let rest = Box::new(ExecRest::new(
            spec.program.clone(),
            spec.cwd.to_string_lossy().into_owned(),
            spec.creds.clone(),
            spec.tuning.limits.iter().map(|l| l.name.clone()).collect(),
        ));
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

    /// The spawner's request: the plan's message and the fds it names.
    pub fn message(&self) -> (Vec<u8>, Vec<RawFd>) {
        plan_message(
            &self.plan,
            self.go_read.as_raw_fd(),
            self.report_write.as_raw_fd(),
        )
    }

    /// The child's side of the pipes is its own (or in a request): supd's copies go.
    pub fn pending(self) -> Pending {
        self.pending
    }

    /// Forks the child here, in supd.
    pub fn fork_here(self) -> Result<(i32, Pending), String> {
        let guards = GUARDS.each_ref().map(|g| g.load(Ordering::Relaxed));
        let mut keep = self.plan.sources();
        keep.extend([self.go_read.as_raw_fd(), self.report_write.as_raw_fd()]);
        keep.sort_unstable();
        let own = [self.pending.go.as_raw_fd(), self.pending.report.as_raw_fd()];
        let cgroup = self.plan.born_in();
        let (pid, placed) = fork_into(false, cgroup).map_err(|e| format!("fork: {e}"))?;
        if pid == 0 {
            child_main(
                &self.plan,
                placed,
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

    /// [`Pending::release`], and a child refused is reaped at once (it exits without
    /// running anything): for a caller that waits, not the loop that reaps.
    pub fn release_or_reap(
        self,
        pid: i32,
        admit: impl FnOnce(i32) -> Result<(), String>,
    ) -> Result<Exec, String> {
        self.release(pid, admit).inspect_err(|_| reap_now(pid))
    }
}

/// Waits for a child that is about to exit (refused, or its exec failed), so that it
/// leaves no zombie and the supervisor's reaping never sees a pid it did not record.
pub fn reap_now(pid: i32) {
    loop {
        match nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None) {
            Err(nix::errno::Errno::EINTR) => continue,
            _ => return,
        }
    }
}

/// The spawner forks a child of supd (`CLONE_PARENT`: supd is its parent, reaps it and
/// gets its SIGCHLD) that runs `msg`'s plan, as `spawn_service` would have; `own` are the
/// spawner's sockets, closed in the child. Returns the child's pid.
pub fn fork_for_supd(msg: &[u8], fds: Vec<OwnedFd>, own: &[RawFd]) -> io::Result<i32> {
    let (plan, go, report) = plan_from(msg, fds)?;
    let mut keep = plan.sources();
    keep.extend([go.as_raw_fd(), report.as_raw_fd()]);
    keep.sort_unstable();
    let (pid, placed) = fork_into(true, plan.born_in())?;
    if pid == 0 {
        child_main(
            &plan,
            placed,
            &[],
            own,
            &keep,
            go.as_raw_fd(),
            report.as_raw_fd(),
        );
    }
    Ok(pid)
}

/// `clone3`'s arguments (linux/sched.h: `struct clone_args` up to its `cgroup` field,
/// `CLONE_ARGS_SIZE_VER2`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// linux/sched.h: the child starts in the cgroup `CloneArgs::cgroup` names (Linux 5.7).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Set once `clone3` with `CLONE_INTO_CGROUP` proved missing (ENOSYS: no clone3, or a
/// seccomp filter that hides it; E2BIG: a kernel before 5.7 that knows a shorter
/// `clone_args`): every later fork goes the old way at once.
static NO_CLONE_INTO_CGROUP: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Whether a child can be forked into its cgroup (`SpawnSpec::born_in`), as the probe
/// at start found ([`probe_born_in`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BornIn {
    /// Not known yet, or no: no clone3, no `CLONE_INTO_CGROUP` (Linux before 5.7), a
    /// seccomp filter that hides it, a v1 hierarchy. The child moves itself in.
    Never,
    /// Yes.
    Always,
    /// Yes, but the kernel kills a child forked into a cgroup that `cgroup.kill` ever
    /// reached (seen on Linux 6.18: the fork compares the kill count of the parent's
    /// cgroup with that of the child's): such a cgroup is made anew first
    /// (`cgroup::fit_to_be_born_in`).
    UnlessKilled,
}

static BORN_IN: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Children move themselves into their cgroups from now on (`cgroup::born_dead`).
pub fn give_up_born_in() {
    BORN_IN.store(0, Ordering::Relaxed);
}

/// What [`probe_born_in`] found.
pub fn born_in() -> BornIn {
    match BORN_IN.load(Ordering::Relaxed) {
        1 => BornIn::Always,
        2 => BornIn::UnlessKilled,
        _ => BornIn::Never,
    }
}

/// Learns once, in a cgroup `probe` made for it (and removed), whether a child can be
/// forked into a cgroup, and whether it survives that in a cgroup `cgroup.kill` reached:
/// a child forked into `probe` exits at once, and how it ended says; first into the
/// cgroup new (a kernel that compares the kill count of the parent's cgroup with the
/// child's kills it there if supd's own cgroup was ever killed: then never), then once
/// the cgroup was killed.
pub fn probe_born_in(probe: &std::path::Path) -> BornIn {
    // One left by a supd killed during its probe.
    let _ = std::fs::remove_dir(probe);
    let found = probe_in(probe);
    let _ = std::fs::remove_dir(probe);
    BORN_IN.store(
        match found {
            BornIn::Never => 0,
            BornIn::Always => 1,
            BornIn::UnlessKilled => 2,
        },
        Ordering::Relaxed,
    );
    found
}

fn probe_in(probe: &std::path::Path) -> BornIn {
    use std::os::unix::fs::OpenOptionsExt;
    if std::fs::create_dir(probe).is_err() {
        return BornIn::Never;
    }
    let Ok(dir) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(probe)
    else {
        return BornIn::Never;
    };
    if !born_and_exited(dir.as_raw_fd()) {
        return BornIn::Never;
    }
    // Without `cgroup.kill` (Linux before 5.14) there is no kill to remember.
    if std::fs::write(probe.join("cgroup.kill"), "1").is_err() || born_and_exited(dir.as_raw_fd()) {
        return BornIn::Always;
    }
    BornIn::UnlessKilled
}

/// Whether a child forked into the cgroup `dir` (not by a plain fork) ran and exited.
fn born_and_exited(dir: RawFd) -> bool {
    let Ok((pid, placed)) = fork_into(false, Some(dir)) else {
        return false;
    };
    if pid == 0 {
        // Forked into the probe or (no clone3 into a cgroup) a plain fork: either way
        // the child ends at once.
        // SAFETY: the forked child runs nothing of the parent's.
        unsafe { libc::_exit(0) };
    }
    let ended = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
    placed && matches!(ended, Ok(nix::sys::wait::WaitStatus::Exited(_, 0)))
}

/// Forks (as the spawner, `parent`: with `CLONE_PARENT`, a child of supd), into the
/// cgroup whose directory is `cgroup` where the kernel can: the child is born there and
/// never moves, so it never waits for the grace period a move waits for (8-30 ms on a
/// machine that was idle, most of a restart). `(pid, placed)`: `pid` is 0 in the child;
/// `placed` says the child is in its cgroup already. Where the kernel cannot (before
/// 5.7, a v1 hierarchy, a cgroup that refuses a process: threaded, "domain invalid"),
/// a plain fork, and the child moves itself in (`join_cgroup`) and reports a refusal.
fn fork_into(parent: bool, cgroup: Option<RawFd>) -> io::Result<(i32, bool)> {
    let with_parent = if parent { libc::CLONE_PARENT as u64 } else { 0 };
    if let Some(dir) = cgroup.filter(|_| !NO_CLONE_INTO_CGROUP.load(Ordering::Relaxed)) {
        let args = CloneArgs {
            flags: with_parent | CLONE_INTO_CGROUP,
            // With CLONE_PARENT clone3 takes none (EINVAL): the child signals its
            // parent, supd, with the caller's own exit signal, which is SIGCHLD.
            exit_signal: if parent { 0 } else { libc::SIGCHLD as u64 },
            cgroup: dir as u64,
            ..CloneArgs::default()
        };
        // SAFETY: clone3 without CLONE_VM (and with no stack given) is a fork: the
        // child returns here on its copy of the caller's stack. The caller (supd or the
        // spawner) is single-threaded, so the child holds no lock another thread could
        // own; it runs `child_main` only, on a plan prepared before the fork, then execs
        // or exits. `args` lives across the call, and its size is passed with it.
        // glibc's fork handlers are not run: neither caller nor child uses anything
        // they reset.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &args as *const CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        if pid >= 0 {
            return Ok((pid as i32, true));
        }
        if matches!(errno_now(), libc::ENOSYS | libc::E2BIG) {
            NO_CLONE_INTO_CGROUP.store(true, Ordering::Relaxed);
        }
    }
    // SAFETY: as above, with clone's older call (flags, then no stack and no tids):
    // a fork, and with CLONE_PARENT one whose child is the caller's parent's.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (with_parent | libc::SIGCHLD as u64) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((pid as i32, false))
}

/// The forked child: runs only async-signal-safe system calls, and never returns. First
/// it drops every fd it does not need (`keep` is sorted): the guards at once, the
/// parent's ends of its pipes (else it would never see end-of-file), and the rest, so
/// that a child still waiting holds nothing of supd's.
fn child_main(
    p: &ChildPlan,
    placed: bool,
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
        if let Some(dir) = &p.join {
            if !placed {
                join_cgroup(dir.as_raw_fd(), report);
            }
            // The program gets no fd of supd's.
            libc::close(dir.as_raw_fd());
        }
        for dir in &p.also_join {
            move_into(dir.as_raw_fd());
            libc::close(dir.as_raw_fd());
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
        // The passed fds (held sockets, stored fds) as 3, 4, ... (sd_listen_fds(3)),
        // then the readiness fd, numbered above them.
        for (i, fd) in p.pass.iter().enumerate() {
            if libc::dup2(fd.as_raw_fd(), 3 + i as RawFd) < 0 {
                fail(report, STAGE_FDS);
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
        let me = libc::getpid();
        let own_pid: Vec<CString> = (p.own_pid_env.iter())
            .filter_map(|k| CString::new(format!("{k}{me}")).ok())
            .collect();
        let home = ids.home.as_ref().filter(|_| !p.has_home);
        if home.is_some() || !own_pid.is_empty() {
            let n = p.envp_ptrs.len() - 1;
            with_home = p.envp_ptrs[..n]
                .iter()
                .copied()
                .chain(home.map(|h| h.as_ptr()))
                .chain(own_pid.iter().map(|c| c.as_ptr()))
                .chain([std::ptr::null()])
                .collect();
            envp = with_home.as_ptr();
        }
        if let Some(uid) = ids.uid {
            // Not following a link: a `listen` socket's directory may be the user's,
            // who could put a link to a file of root's where the socket was.
            for file in &p.give {
                libc::lchown(file.as_ptr(), uid, ids.gid.unwrap_or(u32::MAX));
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
                let found = super::acl::diagnose(cwd, cwd, who, crate::access::Want::Enter);
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
            let found = super::acl::diagnose(path, cwd, who, crate::access::Want::Exec);
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

/// Moves the calling child into the cgroup whose directory is `dir` (writing "0", the
/// writer, into its `cgroup.procs`); a refusal is reported, and the child goes on (no
/// allocation: it runs before the go-ahead).
fn join_cgroup(dir: RawFd, report: RawFd) {
    // SAFETY: opens a file under a directory fd this child owns by a static C string,
    // writes one byte from a static into it and closes it.
    let procs = unsafe {
        libc::openat(
            dir,
            c"cgroup.procs".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        )
    };
    let n = if procs < 0 {
        -1
    } else {
        loop {
            // SAFETY: as above.
            let n = unsafe { libc::write(procs, b"0".as_ptr().cast(), 1) };
            if n < 0 && errno_now() == libc::EINTR {
                continue;
            }
            break n;
        }
    };
    let errno = if n == 1 { 0 } else { errno_now().max(1) };
    if procs >= 0 {
        // SAFETY: `procs` was opened above and is used no more.
        unsafe { libc::close(procs) };
    }
    if errno != 0 {
        let mut msg = [0u8; 12];
        msg[..4].copy_from_slice(&REPORT_NO_CGROUP.to_ne_bytes());
        msg[4..8].copy_from_slice(&4u32.to_ne_bytes());
        msg[8..].copy_from_slice(&errno.to_ne_bytes());
        write_all(report, &msg);
    }
}

/// Moves the calling child into the cgroup v1 cgroup whose directory is `dir`
/// (`SpawnSpec::also_join`); a refusal leaves it where it was (no allocation: it runs
/// before the go-ahead).
fn move_into(dir: RawFd) {
    // SAFETY: opens a file under a directory fd this child owns by a static C string,
    // writes one byte from a static into it and closes it.
    unsafe {
        let procs = libc::openat(
            dir,
            c"cgroup.procs".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        );
        if procs < 0 {
            return;
        }
        while libc::write(procs, b"0".as_ptr().cast(), 1) < 0 && errno_now() == libc::EINTR {}
        libc::close(procs);
    }
}
