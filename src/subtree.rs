//! What is left of a run that has no cgroup (`cgroups = "off"`, no writable cgroup2
//! hierarchy, or a cgroup that refused the service), found without a walk over the
//! host's processes.
//!
//! supd is a child subreaper and every service leader is its own child (the spawner
//! forks them with `CLONE_PARENT`). When a process exits, its children are reparented at
//! once to the nearest subreaper above it, so every process of a run is in supd's
//! subtree: a process of session S is below a process of S, or directly below supd.
//!
//! - Where the kernel lists a thread's children (`/proc/PID/task/TID/children`,
//!   `CONFIG_PROC_CHILDREN`: Debian's and RHEL's kernels have it), a run's session is
//!   found by a walk from supd's own children, passing over the live leaders of other
//!   runs (each the session of its own run) without a look, reading the stat of the
//!   rest and going down only into those of the session (and below them, into
//!   everything: a member may have started a process before it left the session). It
//!   costs supd's other children and the run's own subtree; never the host's processes.
//!   The kernel reads a children list a page at a time, by position, so a list that
//!   changes between two reads may show one child twice or not at all: supd's own list
//!   does not (only supd reaps its children, and not while it reads; new ones are added
//!   at its end), and a list of the run's processes fits one read unless one process
//!   has some 500 children. What a walk does not find: a process of the session below
//!   one that left the session and was then orphaned to supd.
//! - Where it does not, only the process group is known, and without a walk:
//!   `killpg(pgid, 0)` says whether a member is left, `killpg(pgid, SIGKILL)` ends them
//!   (`instance.rs`); what left the group is not found (supd(8)).

use crate::proc::Stat;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// How the runs without a cgroup are tracked: decided once, at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracking {
    /// By their session, found below supd through the children files.
    Session,
    /// By their process group alone; why.
    Group(&'static str),
}

static TRACKING: OnceLock<Tracking> = OnceLock::new();
static NOT_SUBREAPER: AtomicBool = AtomicBool::new(false);

/// Decides how runs without a cgroup are tracked (supd, once at start: `subreaper` says
/// whether supd is a subreaper or PID 1, without which orphans go elsewhere) and
/// returns it. `SUP_NO_PROC_CHILDREN` (for tests, as `SUP_SPAWNER_ANSWER_MS`: nobody
/// sets it in production) makes it act as on a kernel without the children files.
pub fn init(subreaper: bool) -> Tracking {
    NOT_SUBREAPER.store(!subreaper, Ordering::Relaxed);
    tracking()
}

/// How runs without a cgroup are tracked (as `init` decided; in a process that did not
/// call it, a test, as if it were a subreaper). A supd started as PID 1 before /proc is
/// mounted decides once it is.
pub fn tracking() -> Tracking {
    if let Some(t) = TRACKING.get() {
        return *t;
    }
    let t = detect(!NOT_SUBREAPER.load(Ordering::Relaxed));
    if t != NO_PROC {
        let _ = TRACKING.set(t);
    }
    t
}

const NO_PROC: Tracking = Tracking::Group("/proc is not mounted yet");

fn detect(subreaper: bool) -> Tracking {
    if !subreaper {
        Tracking::Group("supd is not a subreaper")
    } else if !std::path::Path::new("/proc/self/stat").exists() {
        NO_PROC
    } else if std::env::var_os("SUP_NO_PROC_CHILDREN").is_some() {
        Tracking::Group("SUP_NO_PROC_CHILDREN is set")
    } else if std::path::Path::new("/proc/thread-self/children").exists()
        || std::path::Path::new(&format!("/proc/self/task/{}/children", std::process::id()))
            .exists()
    {
        Tracking::Session
    } else {
        Tracking::Group("this kernel has no /proc/PID/task/TID/children")
    }
}

/// What the start-up log says of it.
pub fn describe(t: Tracking) -> String {
    match t {
        Tracking::Session => "a run without a cgroup is ended by its process group and session, found below supd (a subreaper) through /proc/PID/task/TID/children".into(),
        Tracking::Group(why) => format!("a run without a cgroup is ended by its process group alone ({why}): what leaves it can escape"),
    }
}

/// The live leaders of runs: a walk passes over them (each leads a session of its own,
/// and everything below it is of that run).
pub trait Leaders {
    fn is_leader(&self, pid: i32) -> bool;
}

impl<V> Leaders for std::collections::BTreeMap<i32, V> {
    fn is_leader(&self, pid: i32) -> bool {
        self.contains_key(&pid)
    }
}

impl Leaders for BTreeSet<i32> {
    fn is_leader(&self, pid: i32) -> bool {
        self.contains(&pid)
    }
}

/// What a walk looks up: the children of a process, and its stat.
pub trait Table {
    /// The children of every thread of `pid` (none when it is gone).
    fn children(&self, pid: i32) -> Vec<i32>;
    fn stat(&self, pid: i32) -> Option<Stat>;
}

/// The machine's: `/proc/PID/task/*/children` and `/proc/PID/stat`.
pub struct Proc;

impl Table for Proc {
    fn children(&self, pid: i32) -> Vec<i32> {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for t in tasks.filter_map(|e| e.ok()) {
            let Ok(text) = std::fs::read_to_string(t.path().join("children")) else {
                continue;
            };
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
        out
    }

    fn stat(&self, pid: i32) -> Option<Stat> {
        crate::proc::stat(pid)
    }
}

/// The live processes of session `sid` below `root` (supd), zombies left out, the
/// session's leader included while it lives. `skip` names the children of `root`
/// not looked at (the leaders of other runs). A child of `root` in another session is
/// not gone into; below a member, everything is.
pub fn session(table: &impl Table, root: i32, sid: i32, skip: impl Fn(i32) -> bool) -> Vec<Stat> {
    let mut found = Vec::new();
    let mut seen = BTreeSet::new();
    let mut todo: Vec<(i32, bool)> = (table.children(root).into_iter())
        .filter(|p| !skip(*p))
        .map(|p| (p, false))
        .collect();
    while let Some((pid, inside)) = todo.pop() {
        // A pid reused during the walk must not make it go round.
        if !seen.insert(pid) {
            continue;
        }
        let Some(s) = table.stat(pid) else {
            continue;
        };
        let member = s.session == sid;
        // A zombie has no children (they went to supd when it exited).
        if s.state == 'Z' || !(member || inside) {
            continue;
        }
        if member {
            found.push(s);
        }
        todo.extend(table.children(pid).into_iter().map(|c| (c, true)));
    }
    found
}

/// The live processes of run `sid`'s session, found below this process (supd), the
/// leaders of other runs passed over; its leader included while it lives
/// (`leader_live`: once it was reaped, a leader whose pid is `sid` leads another run,
/// whose session took the number the old one left).
pub fn session_of_run(sid: i32, leader_live: bool, leaders: &dyn Leaders) -> Vec<Stat> {
    let me = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    session(&Proc, me, sid, |p| {
        (p != sid || !leader_live) && leaders.is_leader(p)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    /// A process table: pid → (parent, session, state); each lookup recorded.
    struct Fake {
        procs: BTreeMap<i32, (i32, i32, char)>,
        looked: RefCell<Vec<i32>>,
    }

    impl Fake {
        fn new(procs: &[(i32, i32, i32, char)]) -> Fake {
            Fake {
                procs: procs
                    .iter()
                    .map(|&(p, pp, s, st)| (p, (pp, s, st)))
                    .collect(),
                looked: RefCell::new(Vec::new()),
            }
        }
    }

    impl Table for Fake {
        fn children(&self, pid: i32) -> Vec<i32> {
            self.looked.borrow_mut().push(pid);
            (self.procs.iter())
                .filter(|(_, (pp, _, _))| *pp == pid)
                .map(|(p, _)| *p)
                .collect()
        }

        fn stat(&self, pid: i32) -> Option<Stat> {
            self.looked.borrow_mut().push(pid);
            let &(ppid, session, state) = self.procs.get(&pid)?;
            Some(Stat {
                pid,
                state,
                ppid,
                pgrp: session,
                session,
                start_time: 1,
            })
        }
    }

    const SUPD: i32 = 100;

    /// supd (100) under init; 5,000 unrelated processes on the host; the run of session
    /// 200 (its leader, a child, a grandchild two levels down, an orphan reparented to
    /// supd with a child of its own, a zombie, a process that left the session with a
    /// member below it); 50 other runs with a subtree each; supd's own helpers. A
    /// leader that exited (`'Z'`) left its children to supd.
    fn machine(leader: char) -> (Fake, BTreeSet<i32>) {
        let up = if leader == 'Z' { SUPD } else { 200 };
        let mut p = vec![(1, 0, 1, 'S'), (SUPD, 1, 1, 'S')];
        for h in 0..5_000 {
            p.push((10_000 + h, 1, 10_000 + h, 'S'));
        }
        p.extend([
            (200, SUPD, 200, leader),
            (201, up, 200, 'S'),
            (202, 201, 200, 'S'),  // two levels down
            (210, SUPD, 200, 'S'), // an orphan of the run, reparented to supd
            (211, 210, 200, 'S'),
            (212, SUPD, 200, 'Z'), // an orphan that exited
            (220, up, 220, 'S'),   // left the session after forking 221
            (221, 220, 200, 'S'),
            (300, SUPD, 300, 'S'), // the spawner, in its session
            (301, SUPD, 301, 'S'), // a dead-man guard
        ]);
        let mut leaders = BTreeSet::from([200]);
        for r in 0..50 {
            let l = 1_000 + 10 * r;
            leaders.insert(l);
            p.extend([
                (l, SUPD, l, 'S'),
                (l + 1, l, l, 'S'),
                (l + 2, l + 1, l, 'S'),
            ]);
        }
        (Fake::new(&p), leaders)
    }

    fn pids(found: &[Stat]) -> Vec<i32> {
        let mut v: Vec<i32> = found.iter().map(|s| s.pid).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn a_walk_finds_the_session_below_supd_and_looks_at_nothing_else() {
        let (table, leaders) = machine('S');
        let sid = 200;
        let found = session(&table, SUPD, sid, |p| p != sid && leaders.is_leader(p));
        assert_eq!(pids(&found), [200, 201, 202, 210, 211, 221]);
        let looked = table.looked.borrow();
        // supd's children once; each non-leader child's stat; the run's subtree.
        let allowed = [SUPD, 200, 201, 202, 210, 211, 212, 220, 221, 300, 301];
        assert!(
            looked.iter().all(|p| allowed.contains(p)),
            "looked beyond supd's subtree and this run: {looked:?}"
        );
        // The children of supd and of the 7 processes of the run gone into (8); the stat
        // of supd's 5 children not passed over and of the 5 below them (10).
        assert_eq!(looked.len(), 18, "{looked:?}");
        assert!(!looked.iter().any(|p| *p >= 1_000 && *p < 1_500));
    }

    #[test]
    fn after_the_leader_exited_its_orphans_are_found_and_the_zombie_passed() {
        let (table, leaders) = machine('Z');
        let found = session(&table, SUPD, 200, |p| p != 200 && leaders.is_leader(p));
        // 221 is below 220, which left the session and is supd's child now: a walk
        // goes down only into supd's children of the session (supd(8) says so).
        assert_eq!(pids(&found), [201, 202, 210, 211]);
    }

    #[test]
    fn the_cost_does_not_grow_with_the_host() {
        let (small, leaders) = machine('S');
        session(&small, SUPD, 200, |p| p != 200 && leaders.is_leader(p));
        let mut big = machine('S').0;
        for h in 0..50_000 {
            big.procs.insert(100_000 + h, (1, 100_000 + h, 'S'));
        }
        session(&big, SUPD, 200, |p| p != 200 && leaders.is_leader(p));
        assert_eq!(small.looked.borrow().len(), big.looked.borrow().len());
    }

    #[test]
    fn the_machine_s_walk_finds_a_child_of_its_own_where_the_kernel_lists_them() {
        if tracking() != Tracking::Session {
            eprintln!("skipped: no /proc/PID/task/TID/children here");
            return;
        }
        // (A test of this module, not supd: its `expect`s end the test, not a supervisor.)
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("spawn sleep");
        let me = i32::try_from(std::process::id()).expect("a pid");
        let sid = crate::proc::stat(me).expect("own stat").session;
        let found = session(&Proc, me, sid, |_| false);
        let _ = child.kill();
        let _ = child.wait();
        let pid = i32::try_from(child.id()).expect("a pid");
        assert!(pids(&found).contains(&pid), "{found:?}");
    }
}
