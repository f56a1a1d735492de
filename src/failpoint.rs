//! Test-only crash points: when `SUP_FAILPOINT` names a point, supd aborts there, as if
//! the power went or it was killed. Harmless in production: nobody sets the variable, and
//! reading it once costs nothing. The integration tests abort supd at every named step
//! of an upgrade and of a rollback, then check that a new supd puts things right.

use std::sync::OnceLock;

/// Every point, for tests and documentation.
pub const POINTS: &[&str] = &[
    "upgrade-before-record",
    "upgrade-after-record",
    "upgrade-after-switch",
    "upgrade-after-restart",
    "commit-before-record",
    "commit-after-record",
    "rollback-before-record",
    "rollback-after-record",
    "rollback-after-switch",
    "rollback-after-restart",
    "oprollback-before-record",
    "oprollback-after-record",
    "oprollback-after-switch",
];

/// The points between a service's fork and its exec (tests/one_instance.rs).
pub const SPAWN_POINTS: &[&str] = &["spawn-before-record", "spawn-after-record"];

/// Aborts supd if `SUP_FAILPOINT` is `name`.
pub fn hit(name: &str) {
    static POINT: OnceLock<Option<String>> = OnceLock::new();
    if POINT
        .get_or_init(|| std::env::var("SUP_FAILPOINT").ok())
        .as_deref()
        == Some(name)
    {
        log::error!("failpoint {name}: aborting, as SUP_FAILPOINT asks");
        std::process::abort();
    }
}

/// Stops supd (SIGSTOP to itself) if `SUP_FAILPOINT` is `name`: a test then acts while
/// supd is frozen at that exact step, and SIGCONTs it. `reexec-stops-before-exec`: the
/// old image, its last reap done and the handoff written, just before its exec.
pub fn stop_at(name: &str) {
    if std::env::var("SUP_FAILPOINT").ok().as_deref() == Some(name) {
        log::warn!("failpoint {name}: stopping, as SUP_FAILPOINT asks");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
    }
}

/// Whether `SUP_FAILPOINT` asks for the error named `name` to be made up (a step whose
/// failure cannot be had for real in a test, such as the fsync of a directory).
pub fn error_at(name: &str) -> bool {
    static POINT: OnceLock<Option<String>> = OnceLock::new();
    POINT
        .get_or_init(|| std::env::var("SUP_FAILPOINT").ok())
        .as_deref()
        == Some(name)
}

/// For the test of a panic: true (and the caller panics) when `SUP_FAILPOINT` is
/// `panic-on-hello` and the file `state_dir/panic-now` existed (it is removed, so the
/// re-executed image does not panic again).
pub fn panic_now(state_dir: &std::path::Path) -> bool {
    std::env::var("SUP_FAILPOINT").ok().as_deref() == Some("panic-on-hello")
        && std::fs::remove_file(state_dir.join("panic-now")).is_ok()
}

/// For the tests of what waits for a reload: when `SUP_FAILPOINT` is
/// `reload-reader-waits` and `state_dir/reload-gate` is a FIFO, the reload's helper
/// (never the loop) opens it for reading before it reads the config, so it waits there
/// until the test opens the FIFO for writing: a reload stays under way for as long as
/// the test needs.
pub fn reload_gate(state_dir: &std::path::Path) {
    if std::env::var("SUP_FAILPOINT").ok().as_deref() == Some("reload-reader-waits") {
        let _ = std::fs::File::open(state_dir.join("reload-gate"));
    }
}
