//! A service's cgroup limits (`memory_max`, `cpu_max`, ...) as files of its cgroups, and
//! what its cgroups say it uses (`status`'s `resources`) and how often the kernel
//! OOM-killed in it.
//!
//! Each controller is taken from cgroup v2 where the services' cgroups are cgroup2 ones
//! and supd's own cgroup offers it (`cgroup.controllers`: it is enabled in the
//! `cgroup.subtree_control` of supd's cgroup and of the services' root when a limit
//! needs it); else from that controller's cgroup v1 hierarchy where one is mounted
//! (hybrid hosts, RHEL 7), in a cgroup `<supd's own cgroup there>/sup-<id>/<service>.service`
//! which the run's first process joins before its program runs (and with it all it
//! starts). A limit whose controller is in neither is refused by the config check.
//!
//! The pure part, [`refusals`] and [`writes`], maps limits and what the machine has
//! ([`Have`]) to the files to write; the rest reads and writes them.

use crate::config::resources::ResourceLimits;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A controller a limit needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Controller {
    Memory,
    Cpu,
    Pids,
    Io,
}

impl Controller {
    /// Its name in cgroup v2 (`cgroup.controllers`).
    pub fn v2(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
            Controller::Pids => "pids",
            Controller::Io => "io",
        }
    }

    /// The name of its cgroup v1 hierarchy (a mount option, a `/proc/self/cgroup` word).
    pub fn v1(self) -> &'static str {
        match self {
            Controller::Io => "blkio",
            c => c.v2(),
        }
    }

    /// The controller a limit key needs.
    pub fn of_key(key: &str) -> Option<Controller> {
        match key {
            "memory_max" | "memory_high" => Some(Controller::Memory),
            "cpu_weight" | "cpu_max" => Some(Controller::Cpu),
            "pids_max" => Some(Controller::Pids),
            "io_weight" => Some(Controller::Io),
            _ => None,
        }
    }
}

/// The cgroup v1 hierarchies supd looks for: the limits' and cpuacct (CPU time, where
/// it is a hierarchy of its own).
pub const V1_HIERARCHIES: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "blkio"];

/// What the machine offers a supd's services.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Have {
    /// Controllers cgroup2 offers (the services' cgroups are cgroup2 ones).
    pub v2: BTreeSet<Controller>,
    /// Mounted cgroup v1 hierarchies by name, each with supd's own cgroup in it as a
    /// directory.
    pub v1: BTreeMap<String, PathBuf>,
    /// `cgroups = "off"`: nothing is offered.
    pub off: bool,
}

/// Where a file is: the service's cgroup2 cgroup, or its cgroup in a v1 hierarchy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Place {
    V2,
    V1(&'static str),
}

/// One file to write in one of a service's cgroups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub place: Place,
    pub file: &'static str,
    pub value: String,
}

impl Have {
    /// Where `c` is taken from, if anywhere: cgroup v2 first.
    pub fn place(&self, c: Controller) -> Option<Place> {
        if self.off {
            None
        } else if self.v2.contains(&c) {
            Some(Place::V2)
        } else if self.v1.contains_key(c.v1()) {
            Some(Place::V1(c.v1()))
        } else {
            None
        }
    }
}

/// The limits of `l` this machine cannot apply, each with why: the config check says
/// them at their keys.
pub fn refusals(l: &ResourceLimits, have: &Have) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    for key in l.set_keys() {
        let Some(c) = Controller::of_key(key) else {
            continue;
        };
        if have.place(c).is_none() {
            let why = if have.off {
                format!(
                    "cgroups are off ([supd] cgroups = \"off\"): no cgroup hierarchy has the {} controller for it",
                    c.v2()
                )
            } else {
                format!(
                    "no cgroup hierarchy here has the {} controller (neither cgroup2 nor a cgroup v1 hierarchy of it): remove the limit, or mount the controller",
                    c.v2()
                )
            };
            out.push((key, why));
        }
    }
    out
}

/// The files to write for `new`, over a cgroup that `old` was written to: each limit
/// `new` sets, and back to the kernel's default each that `old` set and `new` does not.
/// A limit whose controller the machine lacks is left out (the config check refused it).
pub fn writes(new: &ResourceLimits, old: &ResourceLimits, have: &Have) -> Vec<Write> {
    let mut out = Vec::new();
    let mut put = |c: Controller, pick: &dyn Fn(Place) -> Vec<(&'static str, String)>| {
        if let Some(place) = have.place(c) {
            for (file, value) in pick(place) {
                out.push(Write { place, file, value });
            }
        }
    };
    let one = |f: &'static str, v: String| vec![(f, v)];
    if let Some(v) = change(new.memory_max, old.memory_max) {
        put(Controller::Memory, &|p| match p {
            Place::V2 => one("memory.max", v.map_or("max".into(), |b| b.to_string())),
            Place::V1(_) => one(
                "memory.limit_in_bytes",
                v.map_or("-1".into(), |b| b.to_string()),
            ),
        });
    }
    if let Some(v) = change(new.memory_high, old.memory_high) {
        put(Controller::Memory, &|p| match p {
            Place::V2 => one("memory.high", v.map_or("max".into(), |b| b.to_string())),
            Place::V1(_) => one(
                "memory.soft_limit_in_bytes",
                v.map_or("-1".into(), |b| b.to_string()),
            ),
        });
    }
    if let Some(v) = change(new.cpu_weight, old.cpu_weight) {
        put(Controller::Cpu, &|p| match p {
            Place::V2 => one("cpu.weight", v.unwrap_or(100).to_string()),
            Place::V1(_) => one("cpu.shares", shares(v.unwrap_or(100)).to_string()),
        });
    }
    if let Some(v) = change(new.cpu_max, old.cpu_max) {
        put(Controller::Cpu, &|p| match p {
            Place::V2 => one(
                "cpu.max",
                match v {
                    Some(pct) => format!("{} {PERIOD_US}", quota_us(pct)),
                    None => format!("max {PERIOD_US}"),
                },
            ),
            Place::V1(_) => vec![
                ("cpu.cfs_period_us", PERIOD_US.to_string()),
                (
                    "cpu.cfs_quota_us",
                    v.map_or("-1".into(), |pct| quota_us(pct).to_string()),
                ),
            ],
        });
    }
    if let Some(v) = change(new.pids_max, old.pids_max) {
        put(Controller::Pids, &|_| {
            one("pids.max", v.map_or("max".into(), |n| n.to_string()))
        });
    }
    if let Some(v) = change(new.io_weight, old.io_weight) {
        put(Controller::Io, &|p| match p {
            Place::V2 => one("io.weight", format!("default {}", v.unwrap_or(100))),
            Place::V1(_) => one("blkio.weight", blkio_weight(v.unwrap_or(100)).to_string()),
        });
    }
    out
}

/// The cgroup v1 hierarchies a service with `l` joins: those its limits are taken from,
/// and cpuacct with them (its CPU time), in a fixed order.
pub fn v1_joins(l: &ResourceLimits, have: &Have) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for key in l.set_keys() {
        if let Some(Place::V1(h)) = Controller::of_key(key).and_then(|c| have.place(c)) {
            if !out.contains(&h) {
                out.push(h);
            }
        }
    }
    if !out.is_empty() && have.v1.contains_key("cpuacct") && !out.contains(&"cpuacct") {
        out.push("cpuacct");
    }
    out.sort();
    out
}

/// The cgroup2 controllers `l` needs enabled for the services' cgroups.
pub fn v2_needs(l: &ResourceLimits, have: &Have) -> BTreeSet<Controller> {
    (l.set_keys().into_iter())
        .filter_map(Controller::of_key)
        .filter(|&c| have.place(c) == Some(Place::V2))
        .collect()
}

/// The CFS period: 100 ms, the kernel's default.
const PERIOD_US: u64 = 100_000;

/// The quota per period for `pct` percent of one CPU.
fn quota_us(pct: u32) -> u64 {
    u64::from(pct) * PERIOD_US / 100
}

/// cgroup v1's `cpu.shares` for a v2 weight: 1024 is the default as 100 is (at least 2).
fn shares(weight: u32) -> u64 {
    (u64::from(weight) * 1024 / 100).max(2)
}

/// cgroup v1's `blkio.weight` (10 to 1000, default 500) for a v2 `io.weight` (1 to
/// 10000, default 100), as systemd maps them.
fn blkio_weight(weight: u32) -> u32 {
    (weight.saturating_mul(5)).clamp(10, 1000)
}

/// What to write for a limit that is `new` now and was `old`: `Some(Some(v))` to set
/// it, `Some(None)` to set it back to the default, `None` to leave it.
fn change<T: Copy>(new: Option<T>, old: Option<T>) -> Option<Option<T>> {
    match (new, old) {
        (Some(v), _) => Some(Some(v)),
        (None, Some(_)) => Some(None),
        (None, None) => None,
    }
}

/// supd's own cgroup in each mounted cgroup v1 hierarchy of [`V1_HIERARCHIES`], from a
/// mountinfo text and a `/proc/self/cgroup` text.
pub fn v1_own_dirs(mountinfo: &str, proc_cgroup: &str) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    for name in V1_HIERARCHIES {
        let has = |opts: &str| opts.split(',').any(|o| o == name);
        let Some((root, mount)) =
            super::find_mount(mountinfo, |fstype, opts| fstype == "cgroup" && has(opts))
        else {
            continue;
        };
        let own = proc_cgroup.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, subsystems, path) = (f.next()?, f.next()?, f.next()?);
            has(subsystems).then_some(path)
        });
        if let Some(own) = own {
            out.insert(name.to_string(), super::under_mount(own, &root, &mount));
        }
    }
    out
}

/// The controllers a `cgroup.controllers` text names.
fn v2_controllers(text: &str) -> BTreeSet<Controller> {
    let words: Vec<&str> = text.split_whitespace().collect();
    [
        Controller::Memory,
        Controller::Cpu,
        Controller::Pids,
        Controller::Io,
    ]
    .into_iter()
    .filter(|c| words.contains(&c.v2()))
    .collect()
}

/// What this machine offers the services of a supd whose services' cgroups are of
/// `kind` (`None`: cgroups are off, or none could be had).
pub fn have_here(kind: Option<super::Kind>) -> Have {
    let Some(kind) = kind else {
        return Have {
            off: true,
            ..Have::default()
        };
    };
    let v2 = match kind {
        super::Kind::V2 => super::own_cgroup_dir()
            .and_then(|own| fs::read_to_string(own.join("cgroup.controllers")).ok())
            .map(|t| v2_controllers(&t))
            .unwrap_or_default(),
        super::Kind::NamedV1 => BTreeSet::new(),
    };
    let v1 = match (
        fs::read_to_string("/proc/self/mountinfo"),
        fs::read_to_string("/proc/self/cgroup"),
    ) {
        (Ok(m), Ok(c)) => v1_own_dirs(&m, &c),
        _ => BTreeMap::new(),
    };
    Have { v2, v1, off: false }
}

/// What a supd started with `cgroups` (the `[supd]` key) would have, for the config
/// check, without making any cgroup: cgroup2 where one is mounted (and tests do not
/// force the named v1 hierarchy), else the named v1 one.
pub fn have_for_check(cgroups: bool) -> Have {
    if !cgroups {
        return have_here(None);
    }
    let kind = match super::forced_v1() || super::own_cgroup_dir().is_none() {
        true => super::Kind::NamedV1,
        false => super::Kind::V2,
    };
    have_here(Some(kind))
}

impl super::Cgroups {
    /// The service's cgroup in the v1 hierarchy `h` (under supd's own cgroup there).
    pub fn v1_dir(&self, h: &str, service: &str) -> Option<PathBuf> {
        let own = self.have.v1.get(h)?;
        let root = self.root.file_name()?;
        Some(own.join(root).join(format!("{service}.service")))
    }

    /// Gets the service's cgroups ready for a run with `new` (written over `old`, what
    /// this supd wrote before): its cgroup v1 cgroups made (those it no longer needs
    /// removed), its cgroup2 controllers enabled, the limits written. Returns the v1
    /// cgroups its first process joins, and what failed, in words (the run starts
    /// anyway: the config check refused what the machine lacks).
    pub fn apply(
        &self,
        service: &str,
        new: &ResourceLimits,
        old: &ResourceLimits,
    ) -> (Vec<PathBuf>, Vec<String>) {
        let mut problems = Vec::new();
        let mut joins: Vec<PathBuf> = Vec::new();
        let wanted = v1_joins(new, &self.have);
        for h in V1_HIERARCHIES {
            let Some(dir) = self.v1_dir(h, service) else {
                continue;
            };
            if !wanted.contains(&h) {
                // Empty once its last run is over: rmdir refuses a populated one.
                if !joins.contains(&dir) {
                    let _ = fs::remove_dir(&dir);
                }
                continue;
            }
            if joins.contains(&dir) {
                // cpu and cpuacct in one hierarchy.
                continue;
            }
            if let Some(parent) = dir.parent() {
                let _ = fs::create_dir(parent);
            }
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    problems.push(format!("cannot create {}: {e}", dir.display()));
                    continue;
                }
            }
            joins.push(dir);
        }
        for c in v2_needs(new, &self.have) {
            if let Err(why) = self.enable_v2(c) {
                problems.push(why);
            }
        }
        problems.extend(self.write(service, new, old));
        (joins, problems)
    }

    /// Writes `new` over `old` into the service's cgroups as they are (a reload: the
    /// run goes on); what failed, in words.
    pub fn write(&self, service: &str, new: &ResourceLimits, old: &ResourceLimits) -> Vec<String> {
        let mut problems = Vec::new();
        for w in writes(new, old, &self.have) {
            let dir = match w.place {
                Place::V2 => Some(self.service_dir(service)),
                Place::V1(h) => self.v1_dir(h, service),
            };
            let Some(path) = dir.map(|d| d.join(w.file)) else {
                continue;
            };
            if let Err(e) = fs::write(&path, &w.value) {
                problems.push(format!(
                    "cannot write {} to {}: {e}",
                    w.value,
                    path.display()
                ));
            }
        }
        problems
    }

    /// Moves every process of the service's run into its v1 cgroups `joins` (a reload
    /// that sets a limit the run had none of); what failed, in words.
    pub fn move_run(&self, service: &str, joins: &[PathBuf]) -> Vec<String> {
        let members = super::members(&self.service_dir(service));
        let mut problems = Vec::new();
        for dir in joins {
            for pid in &members {
                if let Err(e) = fs::write(dir.join("cgroup.procs"), pid.to_string()) {
                    // A process that exited meanwhile is no problem.
                    if e.raw_os_error() != Some(libc::ESRCH) {
                        problems.push(format!("cannot move {pid} into {}: {e}", dir.display()));
                    }
                }
            }
        }
        problems
    }

    /// Enables `c` for the services' cgroups: in supd's own cgroup's
    /// `cgroup.subtree_control` (where the root does not have it yet) and the root's.
    fn enable_v2(&self, c: Controller) -> Result<(), String> {
        let has = |dir: &Path, file: &str| {
            fs::read_to_string(dir.join(file))
                .is_ok_and(|t| t.split_whitespace().any(|w| w == c.v2()))
        };
        if has(&self.root, "cgroup.subtree_control") {
            return Ok(());
        }
        let enable = |dir: &Path| {
            fs::write(dir.join("cgroup.subtree_control"), format!("+{}", c.v2())).map_err(|e| {
                format!(
                    "cannot enable the {} controller in {}/cgroup.subtree_control: {e}",
                    c.v2(),
                    dir.display()
                )
            })
        };
        if !has(&self.root, "cgroup.controllers") {
            let parent = self.root.parent().unwrap_or(&self.root);
            super::vacate(parent)?;
            enable(parent)?;
        }
        enable(&self.root)
    }

    /// What the service's cgroups say it uses: cgroup2's files, and for what they lack
    /// its v1 cgroups' (those that exist: made for its limits).
    pub fn usage(&self, service: &str) -> crate::protocol::Resources {
        let dir = self.service_dir(service);
        let read = |p: PathBuf| fs::read_to_string(p).ok();
        let number = |p: PathBuf| read(p).and_then(|t| t.trim().parse::<u64>().ok());
        let mut u = crate::protocol::Resources::default();
        if self.is_v2() {
            u.cpu_usec = read(dir.join("cpu.stat")).and_then(|t| keyed(&t, "usage_usec"));
            u.memory_bytes = number(dir.join("memory.current"));
            u.memory_peak_bytes = number(dir.join("memory.peak"));
            u.tasks = number(dir.join("pids.current"));
        }
        let v1 = |h: &str, file: &str| self.v1_dir(h, service).and_then(|d| number(d.join(file)));
        if u.cpu_usec.is_none() {
            u.cpu_usec = v1("cpuacct", "cpuacct.usage").map(|ns| ns / 1000);
        }
        if u.memory_bytes.is_none() {
            u.memory_bytes = v1("memory", "memory.usage_in_bytes");
            u.memory_peak_bytes = v1("memory", "memory.max_usage_in_bytes");
        }
        if u.tasks.is_none() {
            u.tasks = v1("pids", "pids.current");
        }
        u
    }

    /// How many times the kernel OOM-killed a process in the service's memory cgroup:
    /// cgroup2's `memory.events` `oom_kill`, else the v1 cgroup's `memory.oom_control`
    /// `oom_kill` (Linux 4.13), else its `memory.failcnt` (a hint: the limit was hit).
    pub fn oom_kills(&self, service: &str) -> Option<u64> {
        let read = |p: PathBuf| fs::read_to_string(p).ok();
        match self.have.place(Controller::Memory)? {
            Place::V2 => read(self.service_dir(service).join("memory.events"))
                .and_then(|t| keyed(&t, "oom_kill")),
            Place::V1(h) => {
                let dir = self.v1_dir(h, service)?;
                read(dir.join("memory.oom_control"))
                    .and_then(|t| keyed(&t, "oom_kill"))
                    .or_else(|| {
                        read(dir.join("memory.failcnt")).and_then(|t| t.trim().parse().ok())
                    })
            }
        }
    }

    /// Removes the service's v1 cgroups (it is gone, or supd exits); populated ones stay.
    pub fn remove_v1(&self, service: &str) {
        for h in V1_HIERARCHIES {
            if let Some(dir) = self.v1_dir(h, service) {
                let _ = fs::remove_dir(dir);
            }
        }
    }

    /// Removes the v1 cgroups of services `keep` does not name: those of runs a
    /// previous supd left, once they are ended (at the start they still held them).
    pub fn remove_v1_unused(&self, keep: impl Fn(&str) -> bool) {
        let Some(root) = self.root.file_name() else {
            return;
        };
        for own in self.have.v1.values() {
            for dir in super::children(&own.join(root)) {
                let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if name.strip_suffix(".service").is_some_and(|n| !keep(n)) {
                    let _ = fs::remove_dir(&dir);
                }
            }
        }
    }

    /// Removes the v1 roots (`sup-<id>` in each hierarchy) once their services' are gone,
    /// and what an earlier supd left empty in them.
    pub fn remove_v1_roots(&self) {
        let Some(root) = self.root.file_name() else {
            return;
        };
        for own in self.have.v1.values() {
            let r = own.join(root);
            for dir in super::children(&r) {
                let _ = fs::remove_dir(dir);
            }
            let _ = fs::remove_dir(r);
        }
    }
}

/// What `status`, the log and `watch` say of an OOM kill under `l`.
pub fn oom_reason(l: &ResourceLimits) -> String {
    use crate::config::resources::bytes;
    match (l.memory_max, l.memory_high) {
        (Some(max), _) => format!(
            "killed by the kernel: out of memory (memory_max {})",
            bytes(max)
        ),
        (None, Some(high)) => {
            format!(
                "killed by the kernel: out of memory (memory_high {})",
                bytes(high)
            )
        }
        (None, None) => "killed by the kernel: out of memory".to_string(),
    }
}

/// The number after `key` in a `key value` lines text (cpu.stat, memory.events).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

#[cfg(test)]
mod tests;
