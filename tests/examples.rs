//! The README's walk-through on the demo config, for real: examples/demo.toml checks,
//! agent 1.0.0 commits, 2.0.0 (crashes) and 3.0.0 (hangs after two seconds, caught by
//! its health check) are rolled back and marked bad with their reasons.

mod common;
use common::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

#[test]
fn the_example_configs_check() {
    for name in ["demo.toml", "lease-node.toml"] {
        let out = Command::new(SUPD)
            .arg("--check")
            .arg("-c")
            .arg(examples().join(name))
            .output()
            .expect("run supd --check");
        assert!(
            out.status.success(),
            "{name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_walk_through_rolls_back_the_agent_that_crashes_and_the_one_that_hangs() {
    let mut sb = Sandbox::new();
    // The demo as it is, in the sandbox (its paths are relative to the file).
    let demo = std::fs::read_to_string(examples().join("demo.toml")).expect("read demo.toml");
    std::fs::write(sb.path("sup.toml"), demo).expect("write sup.toml");
    sb.socket = sb.path("run/sup.sock");
    sb.start();
    for v in ["1.0.0", "2.0.0", "3.0.0"] {
        let src = examples().join(format!("agent-{v}"));
        let out = sb.supctl(&["install", "agent", v, &src.to_string_lossy()]);
        assert_eq!(out.status.code(), Some(0), "install {v}: {out:?}");
    }
    sb.upgrade_wait("1.0.0", true);
    sb.upgrade_wait("2.0.0", false);
    let out = sb.supctl(&["upgrade", "agent", "3.0.0", "--wait"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "upgrade 3.0.0: {said}");
    assert!(
        said.contains("rolled back to 1.0.0: agent: health: 2 failures"),
        "{said}"
    );

    let v = sb.ok(json!({"cmd": "versions", "tool": "agent"}));
    assert_eq!(v["current"], "1.0.0", "{v:#}");
    let entry = |version: &str| -> Value {
        v["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|x| x["version"] == version)
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_ne!(entry("1.0.0")["bad"], true, "{v:#}");
    for (version, why) in [
        ("2.0.0", "crash loop: 3 restarts"),
        (
            "3.0.0",
            "health: 2 failures: check command exited with code 1",
        ),
    ] {
        let e = entry(version);
        assert_eq!(e["bad"], true, "{v:#}");
        let reason = e["bad_reason"].as_str().unwrap_or("");
        assert!(reason.contains(why), "{version}: {reason:?} lacks {why:?}");
    }
    // 1.0.0 runs again, and its check passes.
    let st = sb.wait_state("agent", "running");
    assert_eq!(st["version"], "1.0.0", "{st}");
    let mut w = sb.watch();
    let st = sb.status("agent");
    if st["health"] != "healthy" {
        w.until(&sb, |e| {
            e["event"] == "health" && e["service"] == "agent" && e["to"] == "healthy"
        });
    }
}
