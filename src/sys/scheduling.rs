//! supd's own priority (`[supd] nice`, `realtime`), and the nice value its services and
//! checks get back: what reset-on-fork and the spawner's own value leave them.

use std::io;
use std::sync::atomic::{AtomicI32, AtomicU8, Ordering};
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
