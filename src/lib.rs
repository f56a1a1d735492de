//! sup: a small, synchronous, PID-1-capable process supervisor.
#![deny(unsafe_code)]

/// The version the programs report (`--version`, `hello`, `status`, the log): the one
/// given at build time in `SUP_BUILD_VERSION` (packaging/build sets it to the package's
/// version), else the crate's.
pub const VERSION: &str = match option_env!("SUP_BUILD_VERSION") {
    Some(v) => v,
    None => env!("CARGO_PKG_VERSION"),
};

pub mod access;
pub mod cgroup;
pub mod config;
pub mod control;
pub mod daemonize;
pub mod deadman;
pub mod failpoint;
pub mod fdset;
pub mod fleet;
pub mod handoff;
pub mod handshake;
pub mod health;
pub mod instance;
pub mod kept;
pub mod launch;
pub mod lease;
pub mod leases;
pub mod leftovers;
pub mod log_writer;
pub mod logging;
pub mod logs;
pub mod metrics;
pub mod notify;
pub mod pid1;
pub mod proc;
pub mod protocol;
pub mod records;
pub mod reload;
pub mod restart;
#[cfg(test)]
mod scratch;
pub mod service;
pub mod signals;
pub mod slots;
pub mod spawner;
pub mod starts;
pub mod statedir;
pub mod subtree;
pub mod supervisor;
pub mod sys;
pub mod syslog;
pub mod time;
pub mod tool_state;
pub mod tools;
pub mod unkillable;
pub mod upgrade;
pub mod versions;
