//! Issue 9, items 5 to 7, against real parts: a full disk (a small tmpfs as state_dir),
//! a wall clock stepped a day either way (an LD_PRELOAD shim over the REALTIME clock), a
//! large install with `versions` and a `reexec` in the middle of it, and a duration too
//! long to be a deadline.

mod common;
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const GOOD: &str = "exec /bin/sleep 3600";

fn link(sb: &Sandbox) -> String {
    fs::read_link(sb.path("tools/agent/current"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn versions(sb: &Sandbox, tool: &str) -> Value {
    sb.ok(json!({"cmd": "versions", "tool": tool}))
}

fn mark(v: &Value, version: &str, key: &str) -> Value {
    v["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|x| x["version"] == version)
        .map(|x| x[key].clone())
        .unwrap_or(Value::Null)
}

/// Places a version of `agent` by hand (as a provisioner would).
fn place(sb: &Sandbox, version: &str, body: &str) {
    let bin = sb.path(&format!("tools/agent/{version}/bin"));
    fs::create_dir_all(&bin).expect("mkdir");
    fs::write(bin.join("agent"), format!("#!/bin/sh\n{body}\n")).expect("write");
    fs::set_permissions(bin.join("agent"), fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn place_current(sb: &Sandbox, version: &str) {
    std::os::unix::fs::symlink(version, sb.path("tools/agent/current")).expect("link");
}

fn agent_config(sb: &Sandbox, probation: &str) {
    sb.config(&format!(
        "[service.agent]\ntool = \"agent\"\ncommand = [\"bin/agent\"]\nrestart_delay = \"10ms\"\n\
         crash_loop = {{ restarts = 3, window = \"1m\" }}\ncooldown = \"1h\"\nprobation = \"{probation}\"\nstop_timeout = \"2s\"\n"
    ));
}

/// A small tmpfs mounted over a directory, unmounted (lazily: supd may still hold it)
/// when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        fs::create_dir_all(dir).expect("mkdir");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mount tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_path_buf())
    }

    /// Fills it up: writes until the file system says ENOSPC.
    fn fill(&self) {
        use std::io::Write;
        let mut f = fs::File::create(self.0.join("fill")).expect("create fill");
        let chunk = vec![0xa5u8; 64 << 10];
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                Err(e) => panic!("filling the tmpfs: {e}"),
            }
        }
        // The last few bytes too: nothing may be left for a record.
        while f.write(&chunk[..1]).is_ok_and(|n| n > 0) {}
    }

    fn free(&self) {
        fs::remove_file(self.0.join("fill")).expect("free the tmpfs");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Waits for an `upgrade` event whose record could not be written; returns it.
fn until_write_error(w: &mut Watch, sb: &Sandbox) -> Value {
    w.until(sb, |e| {
        e["event"] == "upgrade" && e["write_error"].is_string()
    })
}

/// see: issue 9, item 6. A crash-looping version in probation while the record cannot
/// be written: nothing is switched and the bad mark is not lost, not even across a
/// kill -9 of supd; once space is freed, the retry carries out the rollback.
#[test]
fn r9_6_a_rollback_that_cannot_be_written_switches_nothing_and_is_retried() {
    if !is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let mut sb = Sandbox::new();
    let disk = Tmpfs::mount(&sb.path("state"), "1m");
    agent_config(&sb, "1h");
    let go = sb.path("go");
    let past = sb.path("past-the-check");
    place(&sb, "1.0.0", GOOD);
    place(
        &sb,
        "2.0.0",
        &format!(
            "[ -e {} ] && exit 3\n: > {}\n{GOOD}",
            go.display(),
            past.display()
        ),
    );
    place_current(&sb, "1.0.0");
    sb.start();
    sb.wait_state("agent", "running");
    let mut w = sb.watch();
    let out = sb.supctl(&["upgrade", "agent", "2.0.0"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    w.until(&sb, |e| {
        e["event"] == "state" && e["to"] == "running" && e["version"] == "2.0.0"
    });

    // "running" comes at exec of the script, before it looks for `go`: wait until it is
    // past that look, so the kill below finds it running.
    common::files::wait_file(&past, |_| past.exists());
    // The disk fills up, then 2.0.0 crash-loops in its probation.
    disk.fill();
    fs::write(&go, "").expect("go");
    let out = sb.supctl(&["signal", "agent", "KILL"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // Its first crash cannot be noted in the record (its history: issue 21), then its
    // crash loop's rollback cannot be written either.
    let e = w.until(&sb, |e| {
        e["event"] == "upgrade"
            && e["write_error"].is_string()
            && e["pending"].as_str().unwrap_or("").contains("rollback")
    });
    assert!(
        e["write_error"].as_str().unwrap_or("").contains("ENOSPC"),
        "{e}"
    );
    assert_eq!(link(&sb), "2.0.0", "nothing switched without its record");
    let v = versions(&sb, "agent");
    assert_eq!(v["phase"], "probation", "{v}");
    assert!(
        v["write_error"].as_str().unwrap_or("").contains("ENOSPC")
            && v["pending"]
                .as_str()
                .unwrap_or("")
                .contains("rollback from 2.0.0 to 1.0.0"),
        "visible in versions: {v}"
    );
    let st = sb.ok(json!({"cmd": "status"}));
    assert!(
        st["tools"]["agent"]["write_error"]
            .as_str()
            .unwrap_or("")
            .contains("ENOSPC"),
        "visible in status: {st}"
    );
    let text = String::from_utf8_lossy(&sb.supctl(&["versions", "agent"]).stdout).into_owned();
    assert!(text.contains("ENOSPC"), "supctl versions shows it: {text}");

    // supd killed and started again on the full disk: 2.0.0 does not come back from a
    // rollback made only in memory; it crash-loops again, and waits again.
    sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    assert_eq!(link(&sb), "2.0.0");
    sb.start();
    let mut w = sb.watch();
    let v = versions(&sb, "agent");
    if v["write_error"].is_null() {
        until_write_error(&mut w, &sb);
    }
    assert_eq!(link(&sb), "2.0.0");

    // Space comes back: the retry rolls back, 2.0.0 marked bad.
    disk.free();
    let rb = w.until(&sb, |e| e["event"] == "rollback");
    assert_eq!(
        (rb["from"].clone(), rb["to"].clone()),
        (json!("2.0.0"), json!("1.0.0"))
    );
    assert_eq!(link(&sb), "1.0.0");
    let v = versions(&sb, "agent");
    assert_eq!(
        (v["phase"].clone(), v["write_error"].clone()),
        (json!("rolled-back"), Value::Null),
        "{v}"
    );
    assert_eq!(mark(&v, "2.0.0", "bad"), true, "{v}");

    // And it holds across another kill -9.
    sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    sb.start();
    let st = sb.wait_state("agent", "running");
    assert_eq!(st["version"], "1.0.0");
    assert_eq!(link(&sb), "1.0.0");
    assert_eq!(mark(&versions(&sb, "agent"), "2.0.0", "bad"), true);
}

/// see: issue 9, item 6. `stop` answers success only once its down mark is durable:
/// on a full disk the service stops all the same, and the answer says it would start
/// again after a restart of supd.
#[test]
fn r9_6_stop_says_when_its_down_mark_cannot_be_written() {
    if !is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let mut sb = Sandbox::new();
    let disk = Tmpfs::mount(&sb.path("state"), "1m");
    sb.config("[service.web]\ncommand = [\"/bin/sleep\", \"3600\"]\n");
    sb.start();
    sb.wait_state("web", "running");
    disk.fill();
    let out = sb.supctl(&["stop", "web"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("ENOSPC") && err.contains("would start again if supd restarted"),
        "{err}"
    );
    sb.wait_state("web", "stopped");
    let st = sb.ok(json!({"cmd": "status"}));
    assert!(
        st["down_error"].as_str().unwrap_or("").contains("ENOSPC"),
        "{st}"
    );
    disk.free();
    let out = sb.supctl(&["stop", "web"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    sb.start();
    assert_eq!(sb.status("web")["state"], "stopped", "the mark was written");
}

/// A probation of 4 s; supd killed and started again with the wall clock `offset`
/// seconds away: the probation ends 4 s after the upgrade, neither later nor earlier.
fn probation_across_a_clock_step(offset: i64) {
    let probation = Duration::from_secs(4);
    let mut sb = Sandbox::new();
    agent_config(&sb, "4s");
    place(&sb, "1.0.0", GOOD);
    place(&sb, "1.1.0", GOOD);
    place_current(&sb, "1.0.0");
    let shim = common::clock::clock_shim(&sb);
    sb.start();
    sb.wait_state("agent", "running");
    let t0 = Instant::now();
    let out = sb.supctl(&["upgrade", "agent", "1.1.0"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    let mut cmd = Command::new(SUPD);
    cmd.env("LD_PRELOAD", &shim)
        .env("SUP_TEST_CLOCK_OFFSET_MS", (offset * 1000).to_string());
    sb.start_with(cmd, &["-c"]);
    let mut w = sb.watch();
    let v = versions(&sb, "agent");
    assert_eq!(
        v["phase"],
        "probation",
        "offset {offset}: committed within {:?} of a 4 s probation: {v}",
        t0.elapsed()
    );
    let left = v["probation_left_ms"].as_u64().unwrap_or(u64::MAX);
    assert!(
        Duration::from_millis(left) <= probation,
        "offset {offset}: {left} ms left of a 4 s probation: {v}"
    );
    let e = w.until(&sb, |e| {
        e["event"] == "upgrade" && e["phase"] == "committed"
    });
    let took = t0.elapsed();
    // The shim is in effect: supd's wall clock is `offset` away.
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let seen = e["time"].as_i64().unwrap_or(0);
    assert!(
        (seen - real - offset * 1000).abs() < 60_000,
        "the shim did not shift supd's clock: {seen} vs {real}"
    );
    assert!(
        took >= probation,
        "offset {offset}: committed {took:?} after the upgrade, before its 4 s probation ended"
    );
    assert!(
        took < probation + Duration::from_secs(8),
        "offset {offset}: committed only {took:?} after the upgrade"
    );
}

/// see: issue 9, item 7.
#[test]
fn r9_7_a_clock_a_day_behind_does_not_stretch_a_probation() {
    probation_across_a_clock_step(-86_400);
}

/// see: issue 9, item 7.
#[test]
fn r9_7_a_clock_a_day_ahead_does_not_end_a_probation_early() {
    probation_across_a_clock_step(86_400);
}

/// see: issue 9, item 7. A duration too long to be added to a deadline is refused where
/// it is read, with its place.
#[test]
fn r9_7_a_huge_duration_is_refused_by_check() {
    let sb = Sandbox::new();
    sb.config(
        "[service.agent]\ncommand = [\"/bin/true\"]\nprobation = \"18446744073709551615s\"\n",
    );
    let out = Command::new(SUPD)
        .args(["--check", "-c"])
        .arg(sb.path("sup.toml"))
        .output()
        .expect("run supd --check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("sup.toml:10:13")
            && err.contains("probation")
            && err.contains("at most 366 days"),
        "{err}"
    );
}

/// A source tree of `n` files in subdirectories.
fn big_tree(sb: &Sandbox, n: usize) -> PathBuf {
    let src = sb.path("src-big");
    for i in 0..n {
        let d = src.join(format!("d{}", i / 100));
        if i % 100 == 0 {
            fs::create_dir_all(&d).expect("mkdir");
        }
        fs::write(d.join(format!("f{i}")), format!("{i}\n")).expect("write");
    }
    src
}

fn count_files(dir: &Path) -> usize {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                count_files(&e.path())
            } else {
                1
            }
        })
        .sum()
}

const FILES: usize = 5000;

/// Starts `supctl install foo 1.0.0` of a large tree and returns once the copy is under
/// way (the staging directory has entries).
fn install_under_way(sb: &Sandbox) -> std::process::Child {
    let src = big_tree(sb, FILES);
    let child = Command::new(SUPCTL)
        .arg("-s")
        .arg(&sb.socket)
        .args(["install", "foo", "1.0.0"])
        .arg(&src)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run supctl install");
    let staging = sb.path("tools/foo/.install-1.0.0");
    let end = Instant::now() + DEADLINE;
    while fs::read_dir(&staging).map_or(0, |d| d.count()) < 2 {
        assert!(
            !sb.path("tools/foo/1.0.0").exists(),
            "the copy ended before it could be caught: make FILES larger"
        );
        assert!(
            Instant::now() < end,
            "the copy never started\n{}",
            sb.supd_log()
        );
        std::thread::yield_now();
    }
    child
}

fn assert_whole(sb: &Sandbox) {
    assert_eq!(
        count_files(&sb.path("tools/foo/1.0.0")),
        FILES,
        "the installed version is whole\n{}",
        sb.supd_log()
    );
    let v = versions(sb, "foo");
    assert_eq!(mark(&v, "1.0.0", "version"), "1.0.0", "{v}");
}

/// see: issue 9, item 5. `versions` of a tool loads it; loading must not take a live
/// install's staging directory for a leftover.
#[test]
fn r9_5_versions_during_a_large_install_leaves_it_whole() {
    let mut sb = Sandbox::new();
    sb.config("");
    sb.start();
    let install = install_under_way(&sb);
    let v = versions(&sb, "foo");
    assert_eq!(v["versions"], json!([]), "nothing installed yet: {v}");
    let out = install.wait_with_output().expect("supctl install");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_whole(&sb);
}

/// see: issue 9, item 5. A reexec in the middle of an install: the new image knows the
/// copy is live, moves it into place when it ends, and says so on `watch`.
#[test]
fn r9_5_a_reexec_during_an_install_does_not_lose_it() {
    let mut sb = Sandbox::new();
    sb.config("");
    sb.start();
    let install = install_under_way(&sb);
    let out = sb.supctl(&["reexec"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The install's client lost its answer with the old image.
    let _ = install.wait_with_output();
    let mut w = sb.watch();
    versions(&sb, "foo"); // loads the tool in the new image, sweeping leftovers
    if !sb.path("tools/foo/1.0.0").exists() {
        let e = w.until(&sb, |e| e["event"] == "install");
        assert_eq!(e["ok"], true, "{e}");
    }
    assert_whole(&sb);
    assert!(
        !sb.path("tools/foo/.install-1.0.0").exists(),
        "no staging left"
    );
}
