//! The spawn plan: what the caller asks for (`SpawnSpec`), made into what the forked
//! child needs, prepared before the fork (`ChildPlan`: C strings, pointer arrays, fds
//! numbered above every fd the child `dup2`s onto), and that plan as one message to the
//! spawner and back (`plan_message`, `plan_from`).

use super::fds::{above, dev_null_fd, null_input, unsafe_borrow, CHILD_NOFILE};
use super::raw::cstring;
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
/// The PATH a service gets unless its `env` sets one, and the one a bare program name is
/// looked up in without a PATH of its own (`launch` gives it to every service).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

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
    pub limits: Vec<Rlimit>,
}

/// One entry of `limits = { nofile = 65536 }`: soft and hard values, `None` for
/// "unlimited".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimit {
    /// One of `config::LIMIT_NAMES`.
    pub name: String,
    pub soft: Option<u64>,
    pub hard: Option<u64>,
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

/// What the caller asks for: a child to start (`spawner::spawn`, `spawn_service`,
/// `begin_service`), made into its `ChildPlan` before the fork.
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
    /// Environment variables the child sets to its own pid (`WATCHDOG_PID`,
    /// `LISTEN_PID`).
    pub own_pid_env: Vec<String>,
    /// Fds the child gets as 3, 4, ... in this order (held sockets and stored fds:
    /// `kept.rs`); `ready_fd`'s number is above them.
    pub pass: Vec<OwnedFd>,
    /// The child is killed when supd dies (a health check: there is nothing for it to
    /// do without supd, and what it started is ended by the next supd from its record
    /// in `state_dir/checks`; a service must outlive supd, and does not set this).
    pub dies_with_supd: bool,
    /// The cgroup the child runs in (its directory: `cgroup::dir_fd`). It is forked
    /// into it (`clone3` with `CLONE_INTO_CGROUP`, Linux 5.7, cgroup2): no move at all.
    /// Where the kernel cannot (older, a v1 hierarchy, a cgroup that refuses), the child
    /// moves itself in, first thing, before its go-ahead: a move waits for the kernel
    /// (an RCU grace period, 8-30 ms when the machine was idle), the child waits, not
    /// supd's loop. A move refused is reported (`Exec::cgroup_refused`) and the child
    /// goes on in its process group.
    pub join: Option<OwnedFd>,
    /// The child is forked into `join`'s cgroup, where the kernel can (`sys::born_in`,
    /// and `cgroup::fit_to_be_born_in`); else it moves itself in.
    pub born_in: bool,
    /// Cgroups of cgroup v1 hierarchies the child moves itself into too, first thing,
    /// as into `join` (its limits' controllers on a hybrid host: `cgroup/limits.rs`).
    /// A refused move leaves the child where it was: the limit does not hold.
    pub also_join: Vec<OwnedFd>,
}

impl SpawnSpec {
    /// One of supd's own helper processes (`program`, this very image, with `args`):
    /// the default PATH and supd's log settings, `/` for its directory, supd's stdout
    /// and stderr, and `fd` as its fd 3.
    pub fn own_helper(program: &std::path::Path, args: Vec<String>, fd: RawFd) -> SpawnSpec {
        let mut env = vec![("PATH".into(), DEFAULT_PATH.into())];
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
            own_pid_env: Vec::new(),
            pass: Vec::new(),
            dies_with_supd: false,
            join: None,
            born_in: false,
            also_join: Vec::new(),
        }
    }
}

/// What the forked child needs, built before the fork: C strings and pointer arrays,
/// fds numbered above every fd the child `dup2`s onto.
pub(super) struct ChildPlan {
    /// Paths to try with `execve`, in order (one, or the PATH lookup of a bare name).
    pub(super) candidates: Vec<CString>,
    pub(super) _argv: Vec<CString>,
    pub(super) _envp: Vec<CString>,
    pub(super) argv_ptrs: Vec<*const libc::c_char>,
    pub(super) envp_ptrs: Vec<*const libc::c_char>,
    pub(super) cwd: CString,
    /// Sources for 0, 1 and 2 (`None`: supd's own, inherited).
    pub(super) stdio: [Option<OwnedFd>; 3],
    /// The readiness pipe's write end, moved above `floor`, and its number in the child.
    pub(super) ready: Option<(OwnedFd, i32)>,
    pub(super) user: Option<CString>,
    pub(super) group: Option<CString>,
    /// Files to give to the user (before root is dropped).
    pub(super) give: Vec<CString>,
    /// `env` sets HOME already (else the user's home directory is added).
    pub(super) has_home: bool,
    /// `NAME=` of each variable set to the child's own pid.
    pub(super) own_pid_env: Vec<String>,
    /// Sources of fds 3, 4, ... (`SpawnSpec::pass`), above `floor`.
    pub(super) pass: Vec<OwnedFd>,
    /// supd's pid when it dies with supd (see `SpawnSpec::dies_with_supd`).
    pub(super) dies_with: Option<libc::pid_t>,
    pub(super) nofile: Option<libc::rlimit>,
    pub(super) umask: Option<libc::mode_t>,
    pub(super) nice: Option<libc::c_int>,
    pub(super) limits: Vec<(nix::sys::resource::Resource, libc::rlimit)>,
    /// The cgroup the child is forked into, or moves itself into (`SpawnSpec::join`).
    pub(super) join: Option<OwnedFd>,
    /// Forked into it (`SpawnSpec::born_in`).
    pub(super) born_in: bool,
    /// Further cgroups it moves itself into (`SpawnSpec::also_join`).
    pub(super) also_join: Vec<OwnedFd>,
    /// Every fd the child uses as a source is at least this.
    pub(super) floor: RawFd,
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
pub(super) fn plan_message(p: &ChildPlan, go: RawFd, report: RawFd) -> (Vec<u8>, Vec<RawFd>) {
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
    w.int(p.own_pid_env.len() as i64);
    for k in &p.own_pid_env {
        w.bytes(k.as_bytes());
    }
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
    // 0: no cgroup; 1: the child moves itself in; 2: it is forked into it.
    w.int(match (&p.join, p.born_in) {
        (None, _) => 0,
        (Some(_), false) => 1,
        (Some(_), true) => 2,
    });
    fds.extend(p.join.as_ref().map(|f| f.as_raw_fd()));
    w.int(p.also_join.len() as i64);
    fds.extend(p.also_join.iter().map(|f| f.as_raw_fd()));
    w.int(p.pass.len() as i64);
    fds.extend(p.pass.iter().map(|f| f.as_raw_fd()));
    fds.extend([go, report]);
    (w.0, fds)
}

/// The spawner's side of [`plan_message`]: the plan, and its go-ahead and report fds.
pub(super) fn plan_from(
    msg: &[u8],
    fds: Vec<OwnedFd>,
) -> io::Result<(ChildPlan, OwnedFd, OwnedFd)> {
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
    let mut own_pid_env = Vec::new();
    for _ in 0..r.int()?.clamp(0, 16) {
        own_pid_env.push(String::from_utf8(r.bytes()?.to_vec()).map_err(|_| bad())?);
    }
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
    let (join, born_in) = match r.int()? {
        0 => (None, false),
        n => (Some(next_fd()?), n == 2),
    };
    let mut also_join = Vec::new();
    for _ in 0..r.int()? {
        also_join.push(next_fd()?);
    }
    let mut pass = Vec::new();
    for _ in 0..r.int()? {
        pass.push(next_fd()?);
    }
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
        pass,
        dies_with,
        nofile,
        umask,
        nice,
        limits,
        join,
        born_in,
        also_join,
        floor,
    };
    Ok((plan, go, report))
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
    pub(super) fn new(spec: SpawnSpec) -> io::Result<ChildPlan> {
        // Every source is above every fd the child `dup2`s onto: 0-2, the passed fds
        // from 3 up, the readiness fd.
        let floor =
            (spec.ready_fd.map(|(_, n)| n + 1).unwrap_or(3)).max(3 + spec.pass.len() as RawFd);
        fits_nofile(&spec.tuning.limits, floor, spec.pass.len())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
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
            .unwrap_or(DEFAULT_PATH);
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
            own_pid_env: spec.own_pid_env.iter().map(|k| format!("{k}=")).collect(),
            pass: (spec.pass.into_iter())
                .map(|fd| above(fd, floor))
                .collect::<io::Result<_>>()?,
            dies_with: spec
                .dies_with_supd
                .then(std::process::id)
                .map(|p| p as libc::pid_t),
            nofile: CHILD_NOFILE.get().copied().map(|l| room_for(l, floor)),
            umask: spec.tuning.umask.map(|m| m as libc::mode_t),
            nice: spec.tuning.nice,
            limits: spec
                .tuning
                .limits
                .iter()
                .map(resource)
                .collect::<io::Result<_>>()?,
            join: spec.join.map(|fd| above(fd, floor)).transpose()?,
            born_in: spec.born_in,
            also_join: (spec.also_join.into_iter())
                .map(|fd| above(fd, floor))
                .collect::<io::Result<_>>()?,
            floor,
        })
    }
}

impl ChildPlan {
    /// The cgroup to fork the child into, if it is to be born there.
    pub(super) fn born_in(&self) -> Option<RawFd> {
        self.join
            .as_ref()
            .filter(|_| self.born_in)
            .map(|f| f.as_raw_fd())
    }

    /// The fds the child uses: those it `dup2`s from, and its cgroup's.
    pub(super) fn sources(&self) -> Vec<RawFd> {
        let stdio = self.stdio.iter().flatten().map(|f| f.as_raw_fd());
        let ready = self.ready.iter().map(|(f, _)| f.as_raw_fd());
        let join = self
            .join
            .iter()
            .chain(&self.also_join)
            .chain(&self.pass)
            .map(|f| f.as_raw_fd());
        stdio.chain(ready).chain(join).collect()
    }
}

/// A run's open-files limit (supd's original), raised when the fds it is given (below
/// `floor`: 0-2, passed sockets and stored fds, the readiness fd) would leave it fewer
/// than 64 of its own: by their number, up to the hard limit. Else a large fd store could
/// not even be put in place (`dup2` refuses a number past the soft limit), or the program
/// could open nothing more.
fn room_for(mut l: libc::rlimit, floor: RawFd) -> libc::rlimit {
    let given = floor as libc::rlim_t;
    if l.rlim_cur != libc::RLIM_INFINITY && given + 64 > l.rlim_cur {
        l.rlim_cur = l.rlim_cur.saturating_add(given).min(l.rlim_max);
    }
    l
}

/// Whether a configured `nofile` soft limit leaves room for the fds below `floor` that
/// the child `dup2`s onto (0-2, the `passed` sockets and stored fds from 3, the
/// readiness fd): `dup2` refuses a number past it, and the start would fail with a
/// bare "Bad file descriptor".
fn fits_nofile(limits: &[Rlimit], floor: RawFd, passed: usize) -> Result<(), String> {
    let low = (limits.iter())
        .filter(|l| l.name == "nofile")
        .find_map(|l| l.soft.filter(|&n| n < floor as u64));
    match low {
        Some(n) => Err(format!(
            "its limits nofile = {n} is below the {floor} fds it is given (0-2, {passed} listen sockets and stored fds, its readiness fd): raise nofile to {floor} and more, or lower fd_store"
        )),
        None => Ok(()),
    }
}

/// A configured limit as `setrlimit` takes it.
fn resource(l: &Rlimit) -> io::Result<(nix::sys::resource::Resource, libc::rlimit)> {
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

#[cfg(test)]
mod tests {
    use super::super::fds::file_of_raw;
    use super::*;

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
                limits: vec![Rlimit {
                    name: "core".into(),
                    soft: Some(0),
                    hard: None,
                }],
            },
            own_pid_env: vec!["WATCHDOG_PID".into(), "LISTEN_PID".into()],
            pass: vec![
                OwnedFd::from(std::fs::File::open("/dev/null").expect("a file")),
                OwnedFd::from(std::fs::File::open("/").expect("a directory")),
            ],
            dies_with_supd: true,
            join: Some(OwnedFd::from(
                std::fs::File::open("/").expect("a directory"),
            )),
            born_in: true,
            also_join: vec![OwnedFd::from(
                std::fs::File::open("/tmp").expect("a directory"),
            )],
        };
        let plan = ChildPlan::new(spec).expect("plan");
        let (go, report) = nix::unistd::pipe().expect("pipe");
        let (msg, fds) = plan_message(&plan, go.as_raw_fd(), report.as_raw_fd());
        assert_eq!(
            fds.len(),
            9,
            "stdin, stdout, ready, join, also_join, 2 passed, go, report"
        );
        assert_eq!(
            plan.floor, 6,
            "above 0-2, the 2 passed fds (3, 4) and ready (5)"
        );
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
        assert_eq!(back.pass.len(), 2);
        // Each fd names the same file as supd's, numbered at or above the floor.
        let got = [
            back.stdio[0].as_ref().map(|f| f.as_raw_fd()),
            back.stdio[1].as_ref().map(|f| f.as_raw_fd()),
            back.ready.as_ref().map(|r| r.0.as_raw_fd()),
            back.join.as_ref().map(|f| f.as_raw_fd()),
            back.also_join.first().map(|f| f.as_raw_fd()),
            back.pass.first().map(|f| f.as_raw_fd()),
            back.pass.get(1).map(|f| f.as_raw_fd()),
            Some(go2.as_raw_fd()),
            Some(report2.as_raw_fd()),
        ];
        for (fd, inode) in got.iter().zip(&inodes) {
            let fd = fd.expect("present");
            assert!(fd >= plan.floor, "fd {fd} below the floor {}", plan.floor);
            assert_eq!(file_of_raw(fd), *inode);
        }
        drop((r, ready_r));
        // A run given many fds gets room for them, up to the hard limit.
        let l = |cur, max| libc::rlimit {
            rlim_cur: cur,
            rlim_max: max,
        };
        let got = |l: libc::rlimit| (l.rlim_cur, l.rlim_max);
        assert_eq!(got(room_for(l(1024, 4096), 6)), (1024, 4096));
        assert_eq!(got(room_for(l(1024, 4096), 1104)), (2128, 4096));
        assert_eq!(got(room_for(l(1024, 1500), 1104)), (1500, 1500));
        assert_eq!(got(room_for(l(1024, 4096), 970)), (1994, 4096));
        // A configured nofile below the fds a run is given is refused, saying so.
        let nofile = |soft| Rlimit {
            name: "nofile".into(),
            soft,
            hard: None,
        };
        assert!(fits_nofile(&[nofile(Some(20))], 34, 30).is_err_and(|e| e.contains("nofile = 20")));
        assert!(fits_nofile(&[nofile(Some(34))], 34, 30).is_ok());
        assert!(fits_nofile(&[nofile(None)], 34, 30).is_ok());
        assert!(fits_nofile(&[], 34, 30).is_ok());
        // A message cut short is refused, not read past its end.
        assert!(plan_from(&msg[..msg.len() / 2], Vec::new()).is_err());
    }
}
