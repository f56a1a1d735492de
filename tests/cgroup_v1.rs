//! Where supd has no cgroup2 hierarchy it may write (RHEL 7), it tracks runs in a named
//! cgroup v1 hierarchy of its own (`name=sup`, mounted on /run/sup/cgroup), as it does
//! in v2: a daemon is found and ended at stop and at its leader's exit, a new supd ends
//! what a killed one's runs left, a clean exit removes the cgroups.
//!
//! Run with `SUP_TEST_CGROUP=v1` (supd sets cgroup2 aside) and each supd in a mount
//! namespace where the hierarchy is not mounted (`unshare -m`), so that supd mounts it
//! itself every time, and the mount goes with the namespace. The tests look at the
//! cgroups through `/proc/PID/root` of a process in that namespace. They need root and a
//! kernel that mounts a named v1 hierarchy, and say so where they skip.

mod common;
use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const MOUNT_POINT: &str = sup::cgroup::MOUNT_POINT;

/// Whether these tests cannot run here (said why): not root, or no named cgroup v1
/// hierarchy can be mounted (tried in a mount namespace of its own, which takes the
/// mount with it).
fn skip(sb: &Sandbox) -> bool {
    if !is_root() {
        eprintln!("skipped: needs root to mount a cgroup v1 hierarchy");
        return true;
    }
    let probe = sb.path("probe");
    fs::create_dir_all(&probe).expect("mkdir probe");
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "mount", "-t", "cgroup"])
        .args(["-o", "none,name=sup", "cgroup"])
        .arg(&probe)
        .output();
    match out {
        Ok(o) if o.status.success() => false,
        Ok(o) => {
            eprintln!(
                "skipped: a named cgroup v1 hierarchy cannot be mounted here: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            true
        }
        Err(e) => {
            eprintln!("skipped: no unshare(1): {e}");
            true
        }
    }
}

/// Starts supd (forced to cgroup v1) in a mount namespace of its own, copied from this
/// one with every mount of the named hierarchy taken away (on the mount point, and
/// wherever else one is: a chroot's supd mounts it on the chroot's /run/sup/cgroup).
fn start_fresh(sb: &mut Sandbox) {
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "while umount {MOUNT_POINT} 2>/dev/null; do :; done; \
             for m in $(awk '/ - cgroup .*name=sup/ {{print $5}}' /proc/self/mountinfo); do \
             umount \"$m\" 2>/dev/null; done; exec \"$0\" \"$@\""
        ))
        .arg(SUPD)
        .env("SUP_TEST_CGROUP", "v1");
    sb.start_with(cmd, &["-c"]);
}

/// Starts supd (forced to cgroup v1) in the mount namespace of process `pid`.
fn start_in(sb: &mut Sandbox, pid: i32) {
    let mut cmd = Command::new("nsenter");
    cmd.arg(format!("--mount=/proc/{pid}/ns/mnt"))
        .arg(SUPD)
        .env("SUP_TEST_CGROUP", "v1");
    sb.start_with(cmd, &["-c"]);
}

/// A process in the mount namespace of process `pid`, holding it after that process is
/// gone, through which the test sees that namespace's files; killed when dropped.
struct Holder(Child);

impl Holder {
    fn of(pid: i32) -> Holder {
        use std::io::BufRead;
        // It says so once it is in the namespace (a failed nsenter ends its output).
        let mut child = Command::new("nsenter")
            .arg(format!("--mount=/proc/{pid}/ns/mnt"))
            .args(["sh", "-c", "echo in; exec sleep 3600"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("nsenter");
        let mut line = String::new();
        let out = child.stdout.take().expect("its output");
        let holder = Holder(child);
        let _ = std::io::BufReader::new(out).read_line(&mut line);
        assert_eq!(line.trim(), "in", "nsenter never entered");
        let mine = fs::read_link("/proc/self/ns/mnt").expect("my mount namespace");
        let theirs = fs::read_link(format!("/proc/{pid}/ns/mnt")).expect("its namespace");
        assert_ne!(mine, theirs, "supd runs in a mount namespace of its own");
        holder
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    /// `path` as the namespace sees it.
    fn see(&self, path: &Path) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{}", self.pid(), path.display()))
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The cgroup root supd recorded, checked to be in the named v1 hierarchy.
fn v1_root(sb: &Sandbox) -> PathBuf {
    let text = fs::read_to_string(sb.path("state/cgroup"))
        .unwrap_or_else(|e| panic!("no cgroup record: {e}\n{}", sb.supd_log()));
    let root = PathBuf::from(text.trim());
    assert!(
        root.starts_with(MOUNT_POINT),
        "the services' cgroups are not in the named v1 hierarchy: {}\n{}",
        root.display(),
        sb.supd_log()
    );
    root
}

/// The cgroup of `pid` in the named v1 hierarchy (from `/proc/PID/cgroup`).
fn named_cgroup(pid: i32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, names, path) = (f.next()?, f.next()?, f.next()?);
        names
            .split(',')
            .any(|n| n == "name=sup")
            .then(|| path.to_string())
    })
}

/// A service that starts a daemon (fork, setsid, fork: it leaves the service's process
/// group and session), which writes its pid to `daemon`, then says it is ready.
fn daemonizing_service(sb: &Sandbox) -> String {
    let f = sb.path("daemon");
    let svc = sb.script(
        "svc",
        &format!(
            "rm -f {f}\nsetsid -f sh -c 'echo $$ > {f}.tmp; mv {f}.tmp {f}; exec sleep 3600'\n\
             while [ ! -s {f} ]; do :; done\necho >&3\nexec sleep 3600",
            f = f.display()
        ),
    );
    format!("[service.d]\ncommand = [\"{svc}\"]\nready = \"fd:3\"\nrestart = \"never\"\n")
}

/// The daemon of [`daemonizing_service`], checked to have left the leader's session and
/// to be in the service's cgroup of the named v1 hierarchy.
fn daemon_of(sb: &Sandbox, leader: i32) -> i32 {
    let daemon: i32 = fs::read_to_string(sb.path("daemon"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .expect("the daemon's pid");
    let st = sup::proc::stat(daemon).expect("the daemon runs");
    assert_ne!(st.session, leader, "the daemon left the session: {st:?}");
    let cgroup = named_cgroup(daemon).unwrap_or_default();
    assert!(
        cgroup.starts_with("/sup-") && cgroup.ends_with("/d.service"),
        "the daemon is not in the service's cgroup of the named v1 hierarchy: {cgroup:?}\n{}",
        sb.supd_log()
    );
    daemon
}

fn pid_of(v: &serde_json::Value) -> i32 {
    v["pid"].as_i64().expect("a pid") as i32
}

fn ended(pid: i32) -> bool {
    wait_exit(pid, DEADLINE).is_some() || !alive(pid)
}

#[test]
fn a_daemon_is_ended_at_stop_and_at_its_leaders_exit() {
    let mut sb = Sandbox::new();
    if skip(&sb) {
        return;
    }
    sb.config(&daemonizing_service(&sb));
    start_fresh(&mut sb);
    let leader = pid_of(&sb.wait_state("d", "running"));
    v1_root(&sb);
    let log = sb.supd_log();
    assert!(
        log.contains(&format!(
            "mounted the named cgroup v1 hierarchy name=sup on {MOUNT_POINT}"
        )) && log.contains("services run in cgroups (the named cgroup v1 hierarchy name=sup)"),
        "the log says where services run: {log}"
    );
    let daemon = daemon_of(&sb, leader);

    // stop
    sb.ok(serde_json::json!({"cmd": "stop", "service": "d"}));
    assert!(ended(daemon), "stop ends the daemon\n{}", sb.supd_log());

    // the leader's exit
    let mut w = sb.watch();
    sb.ok(serde_json::json!({"cmd": "start", "service": "d"}));
    let leader = pid_of(&w.state(&sb, "d", "running"));
    let daemon = daemon_of(&sb, leader);
    kill(Pid::from_raw(leader), Signal::SIGKILL).expect("kill the leader");
    w.until(&sb, |e| {
        e["event"] == "state" && e["service"] == "d" && e["from"] == "running"
    });
    assert!(
        ended(daemon),
        "the leader's exit ends the daemon\n{}",
        sb.supd_log()
    );
}

/// A supd killed with SIGKILL leaves a run with a daemon; the next supd ends it before
/// it starts the service again: found through the recorded root (from a mount namespace
/// where the hierarchy is not mounted yet: supd mounts it to look), and without the
/// record, under the root it would use itself.
#[test]
fn a_new_supd_ends_what_a_killed_ones_run_left() {
    let mut sb = Sandbox::new();
    if skip(&sb) {
        return;
    }
    sb.config(&daemonizing_service(&sb));
    start_fresh(&mut sb);
    let leader = pid_of(&sb.wait_state("d", "running"));
    v1_root(&sb);
    let daemon = daemon_of(&sb, leader);
    sb.stop_supd(Signal::SIGKILL);
    assert!(alive(daemon), "SIGKILL of supd leaves the run");
    start_fresh(&mut sb);
    let leader = pid_of(&sb.wait_state("d", "running"));
    assert!(
        ended(daemon),
        "a new supd ends what the killed one left (recorded root)\n{}",
        sb.supd_log()
    );

    let daemon = daemon_of(&sb, leader);
    let holder = Holder::of(sb.supd_pid());
    sb.stop_supd(Signal::SIGKILL);
    fs::remove_file(sb.path("state/cgroup")).expect("remove the record");
    start_in(&mut sb, holder.pid());
    sb.wait_state("d", "running");
    assert!(
        ended(daemon),
        "a new supd ends what the killed one left (its own root, no record)\n{}",
        sb.supd_log()
    );
}

/// A clean exit of supd removes the services' cgroups (the run's, its check's) and
/// their root from the named v1 hierarchy.
#[test]
fn a_clean_exit_removes_the_cgroups() {
    let mut sb = Sandbox::new();
    if skip(&sb) {
        return;
    }
    sb.config(&format!(
        "{}health = {{ command = [\"true\"], interval = \"100ms\" }}\n",
        daemonizing_service(&sb)
    ));
    start_fresh(&mut sb);
    let mut w = sb.watch();
    let leader = pid_of(&sb.wait_state("d", "running"));
    let root = v1_root(&sb);
    daemon_of(&sb, leader);
    // A check has run (its cgroup is made before it is forked).
    if sb.status("d")["health"] != "healthy" {
        w.until(&sb, |e| {
            e["event"] == "health" && e["service"] == "d" && e["to"] == "healthy"
        });
    }
    let holder = Holder::of(sb.supd_pid());
    let seen = holder.see(&root);
    for name in ["d.service", "d+check.service"] {
        assert!(
            seen.join(name).is_dir(),
            "no cgroup {name} under {}",
            root.display()
        );
    }
    sb.stop_supd(Signal::SIGTERM);
    assert!(
        !seen.exists(),
        "{} is left after a clean exit: {:?}\n{}",
        root.display(),
        fs::read_dir(&seen).map(|d| d.count()),
        sb.supd_log()
    );
}
