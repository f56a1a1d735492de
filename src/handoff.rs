//! `reexec`: supd replaces its own program image and goes on as if nothing happened.
//!
//! The old image writes its whole state (every service's machine with its pid, restart
//! history and deadlines, the grants, the kept output lines) to `state_dir/handoff.json`,
//! keeps open across `exec` the fds the new image needs (the listening socket, every
//! output and readiness pipe and notify socket, the report pipes of execs not read yet,
//! the state lock), and execs the new program
//! with `--handoff PATH`. Deadlines are `CLOCK_MONOTONIC` instants, the same clock in the
//! new image, so timers resume at their original deadlines; the processes stay children
//! of the same pid, so reaping goes on. The new program proved first, by answering
//! the handshake (handshake.rs), that it is a supd that reads this format.
//!
//! This file is the format: what is carried ([`Handoff`], each service's
//! [`ServiceState`]), its serde (older formats still read) and the fds it names. The
//! coordinator writes it, execs and takes a previous image's over in
//! `supervisor/handoff.rs`.

use crate::service::Service;
use crate::time::Mono;
use serde::{Deserialize, Serialize};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

/// The format this supd writes. Defined in handshake.rs so the tools' reexec task, which
/// runs the handshake, names it without importing this file.
pub use crate::handshake::FORMAT;

/// Everything a new image needs.
#[derive(Debug, Serialize, Deserialize)]
pub struct Handoff {
    pub format: u32,
    /// The version of the supd that wrote it.
    pub from: String,
    pub config_path: PathBuf,
    pub listener_fd: RawFd,
    /// The one notify socket of a supd from before per-service sockets (format 1), passed
    /// on while services it started may still send there.
    #[serde(default)]
    pub notify: Option<(RawFd, PathBuf)>,
    pub lock_fd: Option<RawFd>,
    pub started: Mono,
    pub config_errors: Vec<String>,
    /// Runs a previous supd left of services of a broken file, kept (`leftovers::Kept`):
    /// still held back, and ended once their file loads.
    #[serde(default)]
    pub kept: Vec<crate::leftovers::Kept>,
    pub services: Vec<ServiceState>,
    /// The leases part, whole (`leases::Carried`): its fields stand at the top level,
    /// as in every format: `grants`, `deadman` (the dead-man pipe), `unhealthy_at`
    /// (the health holds) and `boards` (format 5: the grant boards).
    #[serde(flatten)]
    pub leases: crate::leases::Carried,
    #[serde(default)]
    pub system: bool,
    /// The tools part, whole (`tool_state::Carried`): the helpers still running, an
    /// install (its client is gone with the old image, but the copy finishes and is
    /// moved into place) or a deletion, under `tasks` at the top level, as in every
    /// format. Without them, the new image would take a live install's staging
    /// directory for a dead one.
    #[serde(flatten)]
    pub tools: crate::tool_state::Carried,
    /// The log writer: its pipes, pid and the lines queued for it.
    #[serde(default)]
    pub log_writer: Option<crate::log_writer::WriterState>,
    /// `socket_group` as the first image looked it up: the new one takes it rather
    /// than read the user database again.
    #[serde(default)]
    pub socket_group: Option<crate::control::SocketGroup>,
    /// `control_group` likewise (older images: none; the new image looks it up).
    #[serde(default)]
    pub control_group: Option<crate::control::SocketGroup>,
    /// Stops and restarts held until the services named with them that come after them
    /// are down (`stop a b`): the control part's, carried in their order (format 4).
    #[serde(default)]
    pub queued: Vec<crate::control::QueuedState>,
    /// What a killed supd left and the first image was still waiting for (format 6):
    /// the new image holds the same services back until it is gone.
    #[serde(default)]
    pub leftovers: Option<crate::leftovers::Carried>,
    /// The syslog listener (`[supd] syslog`): its fd and path (absent before it).
    #[serde(default)]
    pub syslog: Option<(RawFd, PathBuf)>,
    /// supd's own counts for its metrics (absent before them: counted from the reexec).
    #[serde(default)]
    pub metrics: Option<crate::metrics::file::Carried>,
}

/// One service's runtime.
#[derive(Debug, Serialize, Deserialize)]
pub struct ServiceState {
    pub name: String,
    pub svc: Service,
    pub version: Option<String>,
    /// Its notify part, whole (`notify::Carried`): its fields stand in the service's
    /// object, as in every format: `status_text` (the last `STATUS=`) and `notify` (its
    /// socket and the socket's path, format 2).
    #[serde(flatten)]
    pub notify: crate::notify::Carried,
    /// The output pipe's read and write ends, its kept lines and dropped count.
    pub output: Option<(RawFd, RawFd, Vec<String>, u64)>,
    /// The stderr pipe's read and write ends, when stderr is kept apart.
    #[serde(default)]
    pub output_err: Option<(RawFd, RawFd)>,
    pub ready_fd: Option<RawFd>,
    /// Its current (or finishing) run; handoffs of images before it carried only the pid.
    #[serde(default)]
    pub instance: Option<crate::instance::Instance>,
    /// The uid and groups its last child took as its user (older images: none).
    #[serde(default)]
    pub ran_as: Option<(Option<String>, crate::access::Who)>,
    /// The limits this image last wrote into its cgroups (older images: none said; the
    /// new image then takes the config's as written).
    #[serde(default)]
    pub limits_written: Option<crate::config::resources::ResourceLimits>,
    /// The report pipe of its child's exec, not read to its end yet (a start just
    /// before the exec), with the program and cwd: the new image reads it. (An older
    /// image ignores it: its service waits for `ready_timeout`, as it did before.)
    #[serde(default)]
    pub exec: Option<(RawFd, String, String)>,
    /// What this image had read of that report (records before its end).
    #[serde(default)]
    pub exec_read: Vec<u8>,
    /// Its health checks' and watchdog's state, while they run (format 4): the health
    /// part's, whole (`health::Carried`).
    #[serde(default)]
    pub health: Option<crate::health::Carried>,
    /// Its held `listen` sockets and stored fds (format 8): the kept part's, whole.
    #[serde(default, skip_serializing_if = "crate::kept::Carried::is_empty")]
    pub kept: crate::kept::Carried,
}

/// Reads a handoff (and deletes the file: it is used once).
pub fn read(path: &Path) -> Result<Handoff, String> {
    let bytes = std::fs::read(path)
        .map_err(|e| format!("cannot read the handoff {}: {e}", path.display()))?;
    let _ = std::fs::remove_file(path);
    let mut v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("the handoff {} is corrupt: {e}", path.display()))?;
    check_format(v["format"].as_u64().unwrap_or(0) as u32)?;
    totals_of_older_images(&mut v);
    serde_json::from_value(v).map_err(|e| format!("the handoff {} is corrupt: {e}", path.display()))
}

/// An older image's services have no `restarts_total`: their `restarts` counted since
/// supd started, which is what `restarts_total` counts now.
fn totals_of_older_images(v: &mut serde_json::Value) {
    let Some(services) = v.get_mut("services").and_then(|s| s.as_array_mut()) else {
        return;
    };
    for svc in services.iter_mut().filter_map(|s| s.get_mut("svc")) {
        let Some(obj) = svc.as_object_mut() else {
            continue;
        };
        if !obj.contains_key("restarts_total") {
            let restarts = obj.get("restarts").cloned().unwrap_or_default();
            obj.insert("restarts_total".into(), restarts);
        }
    }
}

/// Whether this supd reads handoffs of `format`.
pub fn check_format(format: u32) -> Result<(), String> {
    if (1..=FORMAT).contains(&format) {
        Ok(())
    } else {
        Err(format!("this supd reads handoff formats 1 to {FORMAT}, not {format}: it is older than the running one"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Both ways: an older image's service (no `restarts_total`) reads with its
    /// `restarts` as the total; a newer one's reads as written, and an older image
    /// (which ignores keys it does not know) reads its `restarts`.
    #[test]
    fn restarts_total_reads_from_older_images_handoffs() {
        let mut svc = crate::service::Service::new(crate::service::Want::Up);
        svc.restarts = 4;
        let mut old = serde_json::to_value(&svc).expect("json");
        old.as_object_mut()
            .expect("an object")
            .remove("restarts_total");
        let mut v = json!({"format": 1, "services": [{"name": "db", "svc": old}]});
        totals_of_older_images(&mut v);
        let back: crate::service::Service =
            serde_json::from_value(v["services"][0]["svc"].clone()).expect("reads");
        assert_eq!((back.restarts, back.restarts_total), (4, 4));
        svc.restarts_total = 9;
        let mut v = json!({"format": 1, "services": [{"name": "db", "svc": svc}]});
        totals_of_older_images(&mut v);
        assert_eq!(v["services"][0]["svc"]["restarts_total"], 9);
        assert_eq!(v["services"][0]["svc"]["restarts"], 4);
    }

    #[test]
    fn a_format_1_handoff_with_the_one_notify_socket_still_reads() {
        let svc = crate::service::Service::new(crate::service::Want::Up);
        let v = json!({
            "format": 1, "from": "0.1.0", "config_path": "/etc/sup/sup.toml",
            "listener_fd": 3, "notify": [4, "/run/sup/sup.sock.notify"], "lock_fd": 5,
            "started": 0, "config_errors": [], "grants": [],
            "services": [{"name": "db", "svc": svc, "version": null, "status_text": null,
                          "output": null, "ready_fd": null}],
        });
        let h: Handoff = serde_json::from_value(v).expect("format 1 reads");
        assert_eq!(
            h.notify,
            Some((4, PathBuf::from("/run/sup/sup.sock.notify")))
        );
        let back = serde_json::to_value(&h.services[0]).expect("writes");
        assert_eq!(back["notify"], json!(null), "no socket of its own: {back}");
        assert!(check_format(1).is_ok() && check_format(FORMAT).is_ok());
    }

    #[test]
    fn the_syslog_socket_is_carried_and_a_handoff_without_it_reads() {
        let v = json!({
            "format": FORMAT, "from": "0.1.0", "config_path": "/etc/sup/sup.toml",
            "listener_fd": 3, "lock_fd": 5, "started": 0, "config_errors": [],
            "grants": [], "services": [],
        });
        let mut h: Handoff = serde_json::from_value(v).expect("reads without it");
        assert_eq!(h.syslog, None);
        h.syslog = Some((7, PathBuf::from("/dev/log")));
        let back = serde_json::to_value(&h).expect("writes");
        assert_eq!(back["syslog"], json!([7, "/dev/log"]));
        let again: Handoff = serde_json::from_value(back).expect("reads it back");
        assert_eq!(again.syslog, Some((7, PathBuf::from("/dev/log"))));
    }

    #[test]
    fn the_notify_and_health_parts_are_carried_under_the_names_of_every_format() {
        let svc = crate::service::Service::new(crate::service::Want::Up);
        let check = serde_json::to_value(crate::health::CheckState::default()).expect("check");
        let watchdog = serde_json::to_value(crate::health::Watchdog::default()).expect("dog");
        let v = json!({"name": "web", "svc": svc, "version": "1.2", "status_text": "serving",
                       "output": null, "ready_fd": null, "notify": [9, "/run/sup.sock.notify.d/web"],
                       "health": {"pid": 42, "check": check, "watchdog": watchdog}});
        let s: ServiceState = serde_json::from_value(v.clone()).expect("reads");
        let back = serde_json::to_value(&s).expect("writes");
        for key in ["status_text", "notify", "health"] {
            assert_eq!(
                back[key], v[key],
                "{key} in the service's object, as written"
            );
        }
        // A service of an image before per-service sockets had neither.
        let old = json!({"name": "db", "svc": back["svc"], "version": null, "output": null,
                         "ready_fd": null});
        let s: ServiceState = serde_json::from_value(old).expect("reads");
        let back = serde_json::to_value(&s).expect("writes");
        for key in ["status_text", "notify", "health"] {
            assert_eq!(back[key], json!(null), "{key}: {back}");
        }
    }

    #[test]
    fn the_leases_part_is_carried_whole_under_the_top_level_names_of_every_format() {
        let v = json!({
            "format": 7, "from": "0.9.0", "config_path": "/etc/sup/sup.toml",
            "listener_fd": 3, "lock_fd": null, "started": 0, "config_errors": [],
            "services": [],
            "grants": [{"lease": "engine", "term": 4, "holder": "n1", "until": 9_000_000_000u64,
                        "valid_for_ms": 2000, "kill_grace_ms": 1000}],
            "deadman": [7, 8], "unhealthy_at": {"web": [5, "health: 3 failures"]},
            "boards": [["engine", 9]],
        });
        let h: Handoff = serde_json::from_value(v.clone()).expect("reads");
        let back = serde_json::to_value(&h).expect("writes");
        for key in ["grants", "deadman", "unhealthy_at", "boards"] {
            assert_eq!(back[key], v[key], "{key} at the top level, as written");
        }
        assert!(back.get("leases").is_none(), "no new key: {back}");
    }

    #[test]
    fn the_tools_part_is_carried_whole_under_tasks_at_the_top_level() {
        let v = json!({
            "format": 7, "from": "0.9.0", "config_path": "/etc/sup/sup.toml",
            "listener_fd": 3, "lock_fd": null, "started": 0, "config_errors": [],
            "services": [], "grants": [],
            "tasks": [{"task": "install", "pid": 40, "tool": "engine", "version": "1.2.0"},
                      {"task": "prune", "pid": 41, "dirs": ["/var/lib/sup/tools/engine/.prune-1.0.0"]}],
        });
        let h: Handoff = serde_json::from_value(v.clone()).expect("reads");
        assert_eq!(h.tools.tasks.len(), 2);
        let back = serde_json::to_value(&h).expect("writes");
        assert_eq!(
            back["tasks"], v["tasks"],
            "tasks at the top level, as written"
        );
        assert!(back.get("tools").is_none(), "no new key: {back}");
        let older: Handoff = serde_json::from_value(json!({
            "format": 1, "from": "0.1.0", "config_path": "/etc/sup/sup.toml",
            "listener_fd": 3, "lock_fd": null, "started": 0, "config_errors": [],
            "services": [], "grants": [],
        }))
        .expect("a handoff without tasks reads");
        assert!(older.tools.tasks.is_empty());
    }
}
