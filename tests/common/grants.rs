//! Grants as sup-lease sends them, and what the dead-man guards do with them: the tests
//! of the guards (lease_deadman, lease_board) freeze supd, send grants and look at the
//! guards supd forked and what they hold.

use super::*;
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// How long after a grant's end (plus its kill grace) a guarded run may still be seen:
/// the guard's wake-up, its SIGKILL, the exit and this test's look, on a loaded machine.
/// (What these tests tell apart is at least 10 s later: a stop_timeout, a 20 s grant, or
/// never.)
pub const SLACK: Duration = Duration::from_secs(2);

/// When a run granted at `from` for `valid_for`, with `grace`, must be gone by.
pub fn late(from: Instant, valid_for: Duration, grace: Duration) -> Instant {
    from + valid_for + grace + SLACK
}

pub fn pid_of(status: &Value) -> i32 {
    status["pid"].as_i64().expect("pid") as i32
}

/// Waits until `pid` has exited, at `end` at the latest.
pub fn gone_by(pid: i32, end: Instant) -> bool {
    wait_exit(pid, end.saturating_duration_since(Instant::now())).is_some()
}

/// SIGSTOPs supd, and SIGCONTs it when dropped (a failed assertion included).
pub struct Frozen(pub i32);

impl Frozen {
    pub fn new(pid: i32) -> Frozen {
        signal(pid, Signal::SIGSTOP);
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, Signal::SIGCONT);
    }
}

pub fn signal(pid: i32, sig: Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).expect("signal");
}

/// A grant of `lease` that ends at `valid_for` from now, with its kill grace, as
/// sup-lease sends it (`until_boot_ms`, on CLOCK_BOOTTIME).
pub fn grant(lease: &str, term: u64, valid_for: Duration, grace: Duration) -> Value {
    let until = sup::time::Boot::now().plus(valid_for);
    json!({"cmd": "lease-grant", "lease": lease, "holder": "n1", "term": term,
           "valid_for": format!("{}ms", valid_for.as_millis()),
           "until_boot_ms": until.as_ms(),
           "kill_grace": format!("{}ms", grace.as_millis())})
}

/// A `lease-grant` with `stopping`, as a holder that stepped down sends at each renewal.
pub fn stopping(lease: &str, term: u64, valid_for: Duration, grace: Duration) -> Value {
    let mut g = grant(lease, term, valid_for, grace);
    g["stopping"] = json!(true);
    g
}

/// supd's forked guards: processes with supd's command line, other than supd.
pub fn guards(sb: &Sandbox) -> Vec<i32> {
    let config = sb.path("sup.toml");
    let argv = [SUPD, "-c", config.to_str().expect("utf-8 path")];
    let supd = sb.supd_pid();
    processes_with_cmdline(&argv)
        .into_iter()
        .filter(|p| *p != supd)
        .collect()
}

/// A script that starts a child of its own (its pid in the file `child`), says it is
/// ready on fd 3, and waits.
pub fn with_child_script(sb: &Sandbox, name: &str, child: &Path) -> String {
    sb.script(
        name,
        &format!(
            "sleep 3600 &\necho $! > {c}.tmp; mv {c}.tmp {c}\necho >&3\nexec sleep 3600",
            c = child.display()
        ),
    )
}

/// A script that ignores SIGTERM (its stop takes all of `stop_timeout`), ready on fd 3.
pub fn stubborn_script(sb: &Sandbox, name: &str) -> String {
    sb.script(name, "trap '' TERM\necho >&3\nwhile :; do sleep 1; done")
}

/// The config of one leader-only service `engine` of lease `engine`, running `script`.
pub fn engine_config(sb: &Sandbox, script: &str, stop_timeout: &str) {
    sb.config(&format!(
        "[lease.engine]\n\n[service.engine]\ncommand = [\"{script}\"]\nready = \"fd:3\"\n\
         leader_only = \"engine\"\nstop_timeout = \"{stop_timeout}\"\n"
    ));
}

/// The pid a service's script wrote to `file`.
pub fn read_pid(sb: &Sandbox, file: &str) -> i32 {
    fs::read_to_string(sb.path(file))
        .expect("the service wrote its child's pid")
        .trim()
        .parse()
        .expect("a pid")
}

/// `supctl reload`, which must succeed.
pub fn reload(sb: &Sandbox) {
    let out = sb.supctl(&["reload"]);
    assert!(
        out.status.success(),
        "reload: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
