//! A versioned tool `agent` placed by hand, as a provisioner would, for the tests of
//! upgrades where features meet (issue 21): each version's `bin/agent` notes its runs
//! (`ran-VERSION` in the sandbox), and the helpers read `current`, `versions` and the
//! events those tests wait on.

use super::{Sandbox, Watch};
use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::PermissionsExt;

pub const GOOD: &str = "exec /bin/sleep 3600";

pub fn link(sb: &Sandbox) -> String {
    fs::read_link(sb.path("tools/agent/current"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub fn versions(sb: &Sandbox) -> Value {
    sb.ok(json!({"cmd": "versions", "tool": "agent"}))
}

pub fn mark(v: &Value, version: &str, key: &str) -> Value {
    v["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|x| x["version"] == version)
        .map(|x| x[key].clone())
        .unwrap_or(Value::Null)
}

/// Places a version of `agent` by hand (as a provisioner would): `bin/agent` notes that
/// it ran (`ran-VERSION` in the sandbox), then runs `body`.
pub fn place(sb: &Sandbox, version: &str, body: &str) {
    let bin = sb.path(&format!("tools/agent/{version}/bin"));
    fs::create_dir_all(&bin).expect("mkdir");
    let ran = sb.path(&format!("ran-{version}"));
    fs::write(
        bin.join("agent"),
        format!("#!/bin/sh\necho x >> {}\n{body}\n", ran.display()),
    )
    .expect("write");
    fs::set_permissions(bin.join("agent"), fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// `revertible = false` in the version's manifest.
pub fn irreversible(sb: &Sandbox, version: &str) {
    fs::write(
        sb.path(&format!("tools/agent/{version}/sup-tool.toml")),
        "revertible = false\n",
    )
    .expect("manifest");
}

pub fn runs(sb: &Sandbox, version: &str) -> usize {
    fs::read_to_string(sb.path(&format!("ran-{version}")))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Points `current` at `version` as a tool would: a new link renamed over the old.
pub fn switch_script(sb: &Sandbox, version: &str) -> String {
    let dir = sb.path("tools/agent");
    format!(
        "ln -sfn {version} {d}/.self.tmp && mv -T {d}/.self.tmp {d}/current",
        d = dir.display()
    )
}

pub fn place_current(sb: &Sandbox, version: &str) {
    std::os::unix::fs::symlink(version, sb.path("tools/agent/current")).expect("link");
}

pub fn agent_config(sb: &Sandbox, extra: &str) {
    sb.config(&format!(
        "[service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\nrestart_delay = \"10ms\"\n\
         crash_loop = {{ restarts = 3, window = \"1m\" }}\ncooldown = \"1h\"\nstop_timeout = \"2s\"\n{extra}"
    ));
}

pub fn rollback_event(w: &mut Watch, sb: &Sandbox) -> (String, String) {
    let e = w.until(sb, |e| e["event"] == "rollback");
    (
        e["from"].as_str().unwrap_or("").to_string(),
        e["to"].as_str().unwrap_or("").to_string(),
    )
}

/// The config of a leader-only versioned tool: the contract's own lease example.
pub fn leader_only_config(sb: &Sandbox, extra: &str) {
    agent_config(
        sb,
        &format!("leader_only = \"engine\"\n{extra}\n[lease.engine]\ntool = \"agent\"\n"),
    );
}

pub fn grant(sb: &Sandbox, term: u64) {
    sb.ok(json!({"cmd": "lease-grant", "lease": "engine", "holder": "n1", "term": term, "valid_for": "1h"}));
}
