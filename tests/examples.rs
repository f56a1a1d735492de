//! The README's walk-through on the demo config, for real: examples/demo.toml checks,
//! agent 1.0.0 commits, 2.0.0 (crashes) and 3.0.0 (hangs after two seconds, caught by
//! its health check) are rolled back and marked bad with their reasons; and the
//! README's try-it block runs as pasted whole.

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

/// The README's "Try it" block, pasted whole into a shell (its build line aside, the
/// binaries of this build in place of `target/release`) in a copy of the repository's
/// examples: `supctl status` answers with the table. Without the wait for the socket,
/// it ran before supd had made it ("cannot reach supd").
#[test]
fn the_readmes_try_it_block_runs_as_pasted() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let after = readme.split_once("## Try it").expect("a Try it section").1;
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, b)| b.split_once("```"))
        .expect("a sh block")
        .0;
    let bin = Path::new(SUPD).parent().expect("the binaries' directory");
    // One line added after supd's: its pid, for this test to end it whatever happens.
    let script: String = block
        .lines()
        .filter(|l| !l.starts_with("cargo build"))
        .map(|l| {
            let l = l.replace("target/release", &bin.to_string_lossy());
            if l.ends_with(" &") {
                format!("{l}\necho $! > supd.pid\n")
            } else {
                l + "\n"
            }
        })
        .collect();
    assert!(
        script.contains("supctl -s examples/run/sup.sock status") && script.contains("supd.pid"),
        "{script}"
    );
    let sb = Sandbox::new();
    let copy = sb.path("examples");
    std::fs::create_dir_all(&copy).expect("mkdir");
    std::fs::copy(examples().join("demo.toml"), copy.join("demo.toml")).expect("copy demo");
    let out_file = std::fs::File::create(sb.path("out")).expect("out");
    let err_file = std::fs::File::create(sb.path("err")).expect("err");
    let mut sh = Command::new("bash")
        .arg("-c")
        .arg(format!("{script}echo \"status exit $?\""))
        .current_dir(sb.path(""))
        .stdout(out_file)
        .stderr(err_file)
        .spawn()
        .expect("bash");
    let finished = wait_exit(sh.id() as i32, DEADLINE).is_some();
    if !finished {
        let _ = sh.kill();
    }
    let _ = sh.wait();
    let supd: Option<i32> = std::fs::read_to_string(sb.path("supd.pid"))
        .ok()
        .and_then(|t| t.trim().parse().ok());
    if let Some(pid) = supd {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        wait_exit(pid, DEADLINE).expect("supd ends on SIGTERM");
    }
    let read = |n: &str| std::fs::read_to_string(sb.path(n)).unwrap_or_default();
    let (stdout, stderr) = (read("out"), read("err"));
    assert!(
        finished,
        "the block did not finish\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert!(supd.is_some(), "supd was not started\n{stderr}");
    assert!(
        stdout.starts_with("NAME ") && stdout.contains("\nclock "),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    // 3: `agent` has no version yet, as the README's table shows.
    assert!(
        stdout.contains("status exit 3"),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(!stderr.contains("cannot reach"), "{stderr}");
}
