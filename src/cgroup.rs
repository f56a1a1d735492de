//! One cgroup per service, where the machine lets supd have them: whatever a service
//! starts stays in its cgroup, even a daemon that left its process group and session,
//! and ending a run, or finding what is left of it, reads the cgroup alone (never a walk
//! over the host's processes).
//!
//! - cgroup v2, where the machine has a cgroup2 hierarchy supd may write: `cgroup.kill`
//!   ends all of a run at once, `cgroup.events` says whether any of it is left.
//! - Else a named cgroup v1 hierarchy of supd's own (`name=sup`, no controller: it only
//!   holds processes, as systemd's `name=systemd` did on cgroup v1 hosts), mounted on
//!   [`MOUNT_POINT`] where no mount of it is seen (root only; never unmounted): RHEL 7.
//!   Its cgroups have `cgroup.procs` alone: a run is ended member by member
//!   ([`kill_each`]) and is over when `cgroup.procs` is empty.
//! - Where neither is to be had (`cgroups = "off"`, the kernel refuses the mount),
//!   services are ended by process group, and supd(8) says they must not daemonize.
//!
//! Layout: `<supd's own cgroup>/sup-<id>/<service>.service`, with `<id>` derived from the
//! state directory, so that several supds in one cgroup (tests, one per user) never
//! share one. The root is written to `state_dir/cgroup`, so that a later supd finds what
//! a killed one left even from another cgroup.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub mod limits;

/// The file in `state_dir` that names the root of the services' cgroups.
const RECORD: &str = "cgroup";

/// The name of supd's own cgroup v1 hierarchy (the `name=` mount option).
const V1_NAME: &str = "sup";

/// The cgroup2 leaf under supd's own cgroup that supd, and whatever else was in its own
/// cgroup, moves into before it enables a controller there for the services' root
/// ([`vacate`]). Its own cgroup is still the one above it ([`own_cgroup_dir`]).
pub const LEAF: &str = "supd.leaf";

/// Where supd mounts its named cgroup v1 hierarchy when no mount of it is seen.
pub const MOUNT_POINT: &str = "/run/sup/cgroup";

/// Which hierarchy the services' cgroups are in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// cgroup2: `cgroup.events`, `cgroup.kill` (5.14), `CLONE_INTO_CGROUP` (5.7).
    V2,
    /// supd's named cgroup v1 hierarchy (`name=sup`): `cgroup.procs` alone.
    NamedV1,
}

/// The directory that holds one cgroup per service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroups {
    pub root: PathBuf,
    pub kind: Kind,
    /// The controllers the services' limits can be taken from (`limits.rs`).
    pub have: limits::Have,
}

impl Cgroups {
    /// Makes (or reuses) the root for `state_dir` under supd's own cgroup, in cgroup2
    /// where supd may write it, else in the named v1 hierarchy (mounted if need be), and
    /// records it. `Err` says why services will run without cgroups.
    pub fn setup(state_dir: &Path) -> Result<Cgroups, String> {
        let name = root_name(state_dir);
        let v2 = match forced_v1() {
            true => Err("SUP_TEST_CGROUP=v1 leaves cgroup2 aside".to_string()),
            false => own_cgroup_dir()
                .ok_or_else(|| "no cgroup2 hierarchy is mounted".to_string())
                .and_then(|own| make(&own.join(&name))),
        };
        let c = match v2 {
            Ok(root) => Cgroups {
                root,
                kind: Kind::V2,
                have: limits::have_here(Some(Kind::V2)),
            },
            Err(no_v2) => match named_v1_own_dir(true).and_then(|own| make(&own.join(&name))) {
                Ok(root) => Cgroups {
                    root,
                    kind: Kind::NamedV1,
                    have: limits::have_here(Some(Kind::NamedV1)),
                },
                Err(no_v1) => return Err(format!("{no_v2}, and {no_v1}")),
            },
        };
        c.record(state_dir);
        // What an earlier supd left empty in the v1 hierarchies holds its limits: gone,
        // a service's next start makes its cgroups there anew.
        c.remove_v1_roots();
        Ok(c)
    }

    /// Whether the cgroups are cgroup2 ones (`CLONE_INTO_CGROUP`, `cgroup.kill` and
    /// `cgroup.events` are v2's alone).
    pub fn is_v2(&self) -> bool {
        self.kind == Kind::V2
    }

    /// The hierarchy, in words for the log.
    pub fn describe(&self) -> &'static str {
        match self.kind {
            Kind::V2 => "cgroup v2",
            Kind::NamedV1 => "the named cgroup v1 hierarchy name=sup",
        }
    }

    /// Writes the root into `state_dir`, for a later supd's sweep.
    pub fn record(&self, state_dir: &Path) {
        let text = format!("{}\n", self.root.display());
        if let Err(e) =
            crate::records::atomic_write(&state_dir.join(RECORD), text.as_bytes(), false)
        {
            log::warn!(
                "cannot record the cgroup root in {}: {e}",
                state_dir.display()
            );
        }
    }

    /// The cgroup of `service`.
    pub fn service_dir(&self, service: &str) -> PathBuf {
        // The suffix keeps a service's name from meeting one of the cgroup's own files
        // ("cgroup.procs", "cpu.stat").
        self.root.join(format!("{service}.service"))
    }

    /// The cgroup of the health check commands of `service` ('+' is in no service's
    /// name): what a check leaves, even a daemon in a session of its own, is killed
    /// when it ends, and found by a later supd as a service's is.
    pub fn check_dir(&self, service: &str) -> PathBuf {
        self.root.join(format!("{service}+check.service"))
    }

    /// The services' cgroups (v2) there now: (id, directory name) each. A cgroup's id is
    /// its directory's inode number, which the directory listing gives without a stat.
    pub fn ids(&self) -> Vec<(u64, String)> {
        use std::os::unix::fs::DirEntryExt;
        let Ok(dir) = fs::read_dir(&self.root) else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok())
            .filter_map(|e| Some((e.ino(), e.file_name().into_string().ok()?)))
            .filter(|(_, n)| n.ends_with(".service"))
            .collect()
    }

    /// Removes the root once its services' cgroups are gone (supd's clean exit).
    pub fn remove(&self) {
        for dir in children(&self.root) {
            remove(&dir);
        }
        let _ = fs::remove_dir(&self.root);
        self.remove_v1_roots();
    }
}

/// Creates a service's cgroup if it is not there.
pub fn prepare(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Ok(()) => {
            made(dir);
            Ok(())
        }
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// The id of the cgroup open as `dir_fd` (v2: its directory's inode number), by one
/// fstat of the fd a start opens anyway.
pub fn id_of(dir_fd: &std::os::fd::OwnedFd) -> Option<u64> {
    nix::sys::stat::fstat(dir_fd).ok().map(|st| st.st_ino)
}

/// The cgroup `dir` itself, open for a child to be forked into or to write itself into
/// (`SpawnSpec::join`): a directory fd, which `clone3(CLONE_INTO_CGROUP)` takes and
/// under which the child opens `cgroup.procs` where it must move itself.
pub fn dir_fd(dir: &Path) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)?;
    Ok(f.into())
}

/// SIGKILLs every process of the cgroup: `cgroup.kill` (cgroup v2, Linux 5.14), else
/// [`kill_each`] (a cgroup v1 has neither `cgroup.kill` nor `cgroup.freeze`).
pub fn kill(dir: &Path) {
    // An empty cgroup (its last process exited: a zombie is no member) has nothing to
    // kill, and is left alone: `cgroup.kill` takes the lock of the whole hierarchy,
    // which each process moving into a cgroup holds for an RCU grace period, so in a
    // burst of starts a kill waits tens of milliseconds for it. Nothing can enter an
    // empty cgroup but by a move or a fork into it (`clone3`), and supd puts the next
    // run's first process in only once this run is over.
    if !populated(dir) {
        return;
    }
    if fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        mark_killed(dir);
        return;
    }
    kill_each(dir);
}

/// The cgroups this supd made (or made anew) and nothing killed since: on a kernel that
/// kills every child forked into a cgroup that `cgroup.kill` ever reached
/// (`sys::BornIn::UnlessKilled`), a child is forked only into one of these; any other
/// (one a previous image made or killed, one killed since) is made anew first
/// ([`fit_to_be_born_in`]). In memory: a new image (`reexec`) makes each anew once.
static MADE: std::sync::Mutex<std::collections::BTreeSet<PathBuf>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// How many children died at their birth in each cgroup ([`born_dead`]).
static BORN_DEAD: std::sync::Mutex<std::collections::BTreeMap<PathBuf, u32>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn made(dir: &Path) {
    if let Ok(mut m) = MADE.lock() {
        m.insert(dir.to_path_buf());
    }
}

/// `dir` was killed (or may have been): no child is forked into it until it is made
/// anew.
pub fn mark_killed(dir: &Path) {
    if let Ok(mut m) = MADE.lock() {
        m.remove(dir);
    }
}

/// A child forked into `dir` died before its program ran, killed: perhaps at its birth,
/// in a cgroup killed behind supd's back (an operator's `cgroup.kill`): `dir` is made
/// anew before the next. A second such death in the same cgroup, made anew in between,
/// says this kernel kills children forked into a cgroup for another reason (supd's own
/// cgroup was killed once, say): from then on children move themselves in.
pub fn born_dead(dir: &Path) {
    mark_killed(dir);
    let Ok(mut dead) = BORN_DEAD.lock() else {
        return;
    };
    let n = dead.entry(dir.to_path_buf()).or_insert(0);
    *n += 1;
    if *n >= 2 && crate::sys::born_in() != crate::sys::BornIn::Never {
        log::warn!(
            "children forked into {} die at birth even in a cgroup made anew: services' \
             processes move into their cgroups from now on",
            dir.display()
        );
        crate::sys::give_up_born_in();
    }
}

/// Whether a child may be forked into `dir` (`SpawnSpec::born_in`): where the kernel
/// can at all (`sys::born_in`), and on a kernel that kills every child forked into a
/// cgroup that was ever killed, if this supd made it and nothing killed it since (`suspect`: something other than supd may have, a leader-only run's guard),
/// else once it is made anew (removed and created again: about 60-100 µs, paid after a
/// kill, and once per cgroup after a `reexec`). A cgroup that cannot be removed (a
/// process of an earlier run is left in it: `kill_mode = "group"` or `"main"`) is kept,
/// and the child moves itself in instead.
pub fn fit_to_be_born_in(dir: &Path, suspect: bool) -> bool {
    match crate::sys::born_in() {
        crate::sys::BornIn::Always => return true,
        crate::sys::BornIn::Never => return false,
        crate::sys::BornIn::UnlessKilled => {}
    }
    let fit = MADE.lock().is_ok_and(|m| m.contains(dir));
    if fit && !suspect {
        return true;
    }
    match fs::remove_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(_) => return false,
    }
    mark_killed(dir);
    prepare(dir).is_ok()
}

/// How many times [`kill_each`] reads `cgroup.procs` for members it has not killed yet.
const KILL_PASSES: usize = 16;

/// `cgroup.kill` without the file (Linux before 5.14): the cgroup is frozen where the
/// kernel can (`cgroup.freeze`, 5.2: a frozen process cannot fork, and SIGKILL still
/// ends it), then every member `cgroup.procs` lists is SIGKILLed, and the list read
/// again until it names no process not killed yet, and thawed. A member that forked
/// before the freeze took hold is caught by a later pass, or by the caller's next
/// check (`populated`), which kills again: the run is over only once the cgroup is
/// empty. A pid in the cgroup names a process of the cgroup: the kill is exact.
pub fn kill_each(dir: &Path) {
    let frozen = fs::write(dir.join("cgroup.freeze"), "1").is_ok();
    let mut killed: Vec<i32> = Vec::new();
    for _ in 0..KILL_PASSES {
        let fresh: Vec<i32> = members(dir)
            .into_iter()
            .filter(|p| !killed.contains(p))
            .collect();
        if fresh.is_empty() {
            break;
        }
        for pid in fresh {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            killed.push(pid);
        }
    }
    if frozen {
        // The next run of the service joins this cgroup: it must not start frozen.
        let _ = fs::write(dir.join("cgroup.freeze"), "0");
    }
}

/// Whether any process is left in the cgroup (a missing cgroup has none): its
/// `cgroup.events`, or where that is missing (a cgroup v1 has none; nor has a missing
/// cgroup) its `cgroup.procs`.
pub fn populated(dir: &Path) -> bool {
    match fs::read_to_string(dir.join("cgroup.events")) {
        Ok(text) => text.lines().any(|l| l.trim() == "populated 1"),
        Err(_) => !members(dir).is_empty(),
    }
}

/// The processes in the cgroup.
pub fn members(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Moves every process of `own` (supd's own cgroup2 cgroup: supd, its helpers, what
/// else its starter put there) into its leaf [`LEAF`], so that `own` may enable
/// controllers for its children. cgroup2 lets no cgroup but the root have both
/// processes and domain controllers (memory, io) in its `cgroup.subtree_control`
/// (EBUSY), and a threaded one (pids, cpu) enabled there with processes in it makes it
/// a thread root whose children can take no domain controller (EOPNOTSUPP): under
/// systemd (`Delegate=yes`) or in a container, supd's own cgroup is such a cgroup, and
/// no memory_max or pids_max held. The root (no `cgroup.type`) needs no move.
pub fn vacate(own: &Path) -> Result<(), String> {
    if !own.join("cgroup.type").exists() {
        return Ok(());
    }
    let pids = members(own);
    if pids.is_empty() {
        return Ok(());
    }
    let leaf = own.join(LEAF);
    make(&leaf)?;
    for pid in &pids {
        if let Err(e) = fs::write(leaf.join("cgroup.procs"), pid.to_string()) {
            // A process that exited meanwhile is no problem.
            if e.raw_os_error() != Some(libc::ESRCH) {
                return Err(format!(
                    "cannot move process {pid} from {} into {}: {e} (cgroup2 lets a cgroup \
                     with processes enable no controller for its children)",
                    own.display(),
                    leaf.display()
                ));
            }
        }
    }
    log::info!(
        "moved the {} processes of {} (supd among them) into {}: cgroup2 lets a cgroup with \
         processes enable no controller for its children",
        pids.len(),
        own.display(),
        leaf.display()
    );
    Ok(())
}

/// Removes an empty cgroup (a populated one stays: rmdir refuses it).
pub fn remove(dir: &Path) {
    let _ = fs::remove_dir(dir);
}

/// The services' cgroups a previous supd of `state_dir` used: those under the recorded
/// root and under the roots this supd would use (in cgroup2 and, where it is mounted or
/// the recorded root is in it, in the named v1 hierarchy).
pub fn left_by_previous(state_dir: &Path) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(text) = fs::read_to_string(state_dir.join(RECORD)) {
        roots.push(PathBuf::from(text.trim()));
    }
    // A root recorded under the mount point is mounted again where this supd does not
    // see it mounted (the killed supd's mount namespace is gone, say).
    let mount = roots.iter().any(|r| r.starts_with(MOUNT_POINT));
    let name = root_name(state_dir);
    let owns = [own_cgroup_dir(), named_v1_own_dir(mount).ok()];
    for own in owns.into_iter().flatten() {
        let root = own.join(&name);
        if !roots.contains(&root) {
            roots.push(root);
        }
    }
    roots
        .iter()
        .filter(|r| r.is_absolute())
        .flat_map(|r| children(r))
        .collect()
}

/// The `*.service` cgroups under `root`.
fn children(root: &Path) -> Vec<PathBuf> {
    let Ok(dir) = fs::read_dir(root) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".service"))
        .map(|e| e.path())
        .collect()
}

/// The name of the root for `state_dir`.
fn root_name(state_dir: &Path) -> String {
    format!("sup-{:016x}", fnv1a(&absolute(state_dir)))
}

/// Makes (or reuses) the cgroup `dir`; `Err` says why not.
fn make(dir: &Path) -> Result<PathBuf, String> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(dir.to_path_buf()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(dir.to_path_buf()),
        Err(e) => Err(format!("cannot create {}: {e}", dir.display())),
    }
}

/// Whether tests force the named v1 hierarchy on a machine whose cgroup2 supd may write:
/// `SUP_TEST_CGROUP=v1` (for tests alone, as `SUP_SPAWNER_ANSWER_MS`: nobody sets it in
/// production). Read here only.
fn forced_v1() -> bool {
    std::env::var_os("SUP_TEST_CGROUP").is_some_and(|v| v == "v1")
}

/// This process's own cgroup as a directory: the cgroup2 mount joined with the `0::`
/// line of `/proc/self/cgroup` (supd's; tests ask it too), or the one above it where
/// that is supd's leaf ([`vacate`]: a later supd, a reexec, finds the same root).
pub fn own_cgroup_dir() -> Option<PathBuf> {
    let cgroup = fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (root, mount) = cgroup2_mount(&mountinfo)?;
    let dir = under_mount(own, &root, &mount);
    match (dir.file_name(), dir.parent()) {
        (Some(name), Some(up)) if name == LEAF => Some(up.to_path_buf()),
        _ => Some(dir),
    }
}

/// supd's own cgroup in the named v1 hierarchy as a directory: its mount joined with the
/// `N:name=sup:` line of `/proc/self/cgroup`. Where no mount of it is seen and `mount`
/// says so, it is mounted on [`MOUNT_POINT`] first (root only; it stays mounted: other
/// supds, and a later one, use it). `Err` says why there is none.
fn named_v1_own_dir(mount: bool) -> Result<PathBuf, String> {
    let mountinfo = || {
        fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))
    };
    let (root, point) = match named_v1_mount(&mountinfo()?) {
        Some(m) => m,
        None if !mount => return Err(format!("no name={V1_NAME} cgroup v1 hierarchy is mounted")),
        None => {
            mount_named_v1()?;
            named_v1_mount(&mountinfo()?).ok_or_else(|| {
                format!(
                    "the name={V1_NAME} cgroup v1 hierarchy mounted on {MOUNT_POINT} is not in /proc/self/mountinfo"
                )
            })?
        }
    };
    let cgroup = fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let own = cgroup.lines().find_map(in_named_v1).ok_or_else(|| {
        format!("/proc/self/cgroup has no line of the name={V1_NAME} cgroup v1 hierarchy")
    })?;
    Ok(under_mount(own, &root, &point))
}

/// Mounts the named v1 hierarchy on [`MOUNT_POINT`] (made if missing): no controller,
/// `name=sup`; the kernel makes the hierarchy at its first mount, and reuses it after.
fn mount_named_v1() -> Result<(), String> {
    let refused = |e: &dyn std::fmt::Display| {
        format!(
            "the named cgroup v1 hierarchy name={V1_NAME} cannot be mounted on {MOUNT_POINT}: {e}"
        )
    };
    if !nix::unistd::geteuid().is_root() {
        return Err(refused(&"mounting it needs root"));
    }
    fs::create_dir_all(MOUNT_POINT).map_err(|e| refused(&e))?;
    use nix::mount::MsFlags;
    nix::mount::mount(
        Some("cgroup"),
        MOUNT_POINT,
        Some("cgroup"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(format!("none,name={V1_NAME}").as_str()),
    )
    .map_err(|e| refused(&e))?;
    log::info!("mounted the named cgroup v1 hierarchy name={V1_NAME} on {MOUNT_POINT}");
    Ok(())
}

/// The path in a `/proc/self/cgroup` line of the named v1 hierarchy
/// (`N:name=sup:/path`), `None` for another hierarchy's.
fn in_named_v1(line: &str) -> Option<&str> {
    let mut f = line.splitn(3, ':');
    let (_, subsystems, path) = (f.next()?, f.next()?, f.next()?);
    let name = format!("name={V1_NAME}");
    subsystems.split(',').any(|s| s == name).then_some(path)
}

/// `own`, a cgroup path as `/proc/self/cgroup` says it, as a directory under the mount
/// point of a mount whose root (in the hierarchy) is `root`.
fn under_mount(own: &str, root: &str, mount: &str) -> PathBuf {
    let rel = own.strip_prefix(root).unwrap_or(own);
    Path::new(mount).join(rel.trim_start_matches('/'))
}

/// The root and mount point of the first cgroup2 mount in a mountinfo text.
fn cgroup2_mount(mountinfo: &str) -> Option<(String, String)> {
    find_mount(mountinfo, |fstype, _| fstype == "cgroup2")
}

/// The root and mount point of the first mount of the named v1 hierarchy in a mountinfo
/// text: a `cgroup` mount whose super options hold `name=sup`.
fn named_v1_mount(mountinfo: &str) -> Option<(String, String)> {
    let name = format!("name={V1_NAME}");
    find_mount(mountinfo, |fstype, opts| {
        fstype == "cgroup" && opts.split(',').any(|o| o == name)
    })
}

/// The root and mount point of the first mount in a mountinfo text whose file system
/// type and super options `pick` takes.
fn find_mount(mountinfo: &str, pick: impl Fn(&str, &str) -> bool) -> Option<(String, String)> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let (fstype, _source, opts) = (r.next()?, r.next()?, r.next().unwrap_or(""));
        if !pick(fstype, opts) {
            return None;
        }
        let f: Vec<&str> = left.split_whitespace().collect();
        Some((unescape(f.get(3)?), unescape(f.get(4)?)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn absolute(p: &Path) -> String {
    std::path::absolute(p)
        .unwrap_or_else(|_| p.to_path_buf())
        .to_string_lossy()
        .into_owned()
}

/// FNV-1a, 64 bits: a stable short name for a path.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_in_a_hybrid_layout() {
        let info = "25 30 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                    26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n\
                    27 25 0:25 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(
            cgroup2_mount(info),
            Some(("/".into(), "/sys/fs/cgroup/unified".into()))
        );
        let ns = "40 39 0:30 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(ns),
            Some(("/docker/abc".into(), "/sys/fs/cgroup".into()))
        );
        assert_eq!(cgroup2_mount("1 0 8:1 / / rw - ext4 /dev/vda rw\n"), None);
    }

    #[test]
    fn names_are_stable_and_apart() {
        assert_eq!(fnv1a("/var/lib/sup"), fnv1a("/var/lib/sup"));
        assert_ne!(fnv1a("/var/lib/sup"), fnv1a("/var/lib/sup2"));
        let c = Cgroups {
            root: "/sys/fs/cgroup/sup-1".into(),
            kind: Kind::V2,
            have: Default::default(),
        };
        assert_eq!(
            c.service_dir("cgroup.procs"),
            PathBuf::from("/sys/fs/cgroup/sup-1/cgroup.procs.service")
        );
    }

    #[test]
    fn finds_the_named_v1_hierarchy_and_its_line() {
        let info = "26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n\
                    27 25 0:25 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n\
                    28 25 0:26 / /run/sup/cgroup rw,nosuid - cgroup cgroup rw,name=sup\n";
        assert_eq!(
            named_v1_mount(info),
            Some(("/".into(), "/run/sup/cgroup".into()))
        );
        let others = "27 25 0:25 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n\
                      29 25 0:27 / /x rw - cgroup cgroup rw,name=super\n\
                      30 25 0:28 / /y rw - cgroup2 cgroup2 rw,name=sup\n";
        assert_eq!(named_v1_mount(others), None);
        assert_eq!(
            in_named_v1("9:name=sup:/sup-1/a.service"),
            Some("/sup-1/a.service")
        );
        assert_eq!(in_named_v1("10:cpu,name=sup:/"), Some("/"));
        assert_eq!(in_named_v1("8:name=systemd:/"), None);
        assert_eq!(in_named_v1("0::/"), None);
        assert_eq!(
            under_mount("/ns/sup-1", "/ns", "/run/sup/cgroup"),
            PathBuf::from("/run/sup/cgroup/sup-1")
        );
    }
}
