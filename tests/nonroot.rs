//! Services run as their own user (`user = "nobody"`) with the package's layout:
//! `state_dir` as the package makes it (modes read from packaging/debian/postinst), the
//! tools inside it. A versioned tool runs from `tools_dir`; an unversioned service starts
//! in a directory it can read; an upgrade its user cannot run is refused with nothing
//! switched; a start refused for want of permission says so and marks nothing bad.

mod common;
use common::files::wait_file;
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The mode the package gives `path` (`install -d -m MODE ... PATH` in the Debian
/// postinst), checked to be the same in the RPM spec.
fn package_mode(path: &str) -> u32 {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging");
    let find = |file: &str| -> Option<u32> {
        let text = fs::read_to_string(root.join(file)).expect("read packaging file");
        text.lines().find_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let at = words.windows(2).position(|w| w == ["install", "-d"])?;
            let words = &words[at..];
            if !words.contains(&path) {
                return None;
            }
            let m = words.iter().position(|w| *w == "-m")?;
            u32::from_str_radix(words.get(m + 1)?, 8).ok()
        })
    };
    let deb = find("debian/postinst").unwrap_or_else(|| panic!("postinst makes {path}"));
    let rpm = find("rpm/sup.spec").unwrap_or_else(|| panic!("sup.spec makes {path}"));
    assert_eq!(deb, rpm, "{path}: the .deb and the .rpm make it alike");
    deb
}

fn skip() -> bool {
    if !is_root() {
        eprintln!("skipped: needs root to run a service as nobody");
        return true;
    }
    false
}

/// Runs supctl with `args` and fails unless it succeeds.
fn supctl_ok(sb: &Sandbox, args: &[&str]) {
    let out = sb.supctl(args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "supctl {}: {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr),
        sb.supd_log()
    );
}

/// Runs supctl with `args`, fails unless it is refused, and returns what it said.
fn supctl_refused(sb: &Sandbox, args: &[&str]) -> String {
    let out = sb.supctl(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_ne!(out.status.code(), Some(0), "refused: {err}");
    err
}

/// Fails unless `text` (a refusal, a reason) says every one of `parts`.
fn assert_says(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} is not said in: {text}");
    }
}

/// Waits until `service` has failed and returns the reason given.
fn failed_reason(sb: &Sandbox, service: &str) -> String {
    let st = sb.wait_state(service, "failed");
    st["reason"].as_str().unwrap_or_default().to_string()
}

/// What version `v` of the agent wrote when it started (see [`stage_for_user`]).
fn agent_said(sb: &Sandbox, v: &str) -> String {
    wait_file(&sb.path(&format!("out/agent-{v}")), |t| t.ends_with('\n'))
}

fn nobody() -> nix::unistd::User {
    nix::unistd::User::from_name("nobody")
        .ok()
        .flatten()
        .expect("the user nobody")
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

/// A sandbox laid out as the package lays out /var/lib/sup: `state` with the package's
/// mode (owned by root), `state/tools` inside it; a directory `out` anyone may write to.
fn package_layout(services: &str) -> Sandbox {
    let sb = Sandbox::new();
    let state = sb.path("state");
    fs::create_dir(&state).expect("mkdir state");
    chmod(&state, package_mode("/var/lib/sup"));
    let tools = sb.path("state/tools");
    fs::create_dir(&tools).expect("mkdir tools");
    chmod(&tools, package_mode("/var/lib/sup/tools"));
    let out = sb.path("out");
    fs::create_dir(&out).expect("mkdir out");
    chmod(&out, 0o1777);
    fs::write(
        sb.path("sup.toml"),
        format!(
            "[supd]\nsocket = \"sup.sock\"\nstate_dir = \"state\"\ntools_dir = \"state/tools\"\n\
             log_dir = \"log\"\nshutdown_timeout = \"5s\"\n{services}"
        ),
    )
    .expect("write config");
    sb
}

const AGENT: &str = r#"
[service.agent]
tool = "agent"
command = ["bin/agent"]
user = "nobody"
restart_delay = "10ms"
crash_loop = { restarts = 3, window = "1m" }
cooldown = "1h"
probation = "1s"
stop_timeout = "2s"
"#;

/// Stages version `v` of the agent as a build for its user: readable and searchable by
/// all (0755), which `install` keeps as it is (it never widens a mode: a build left
/// private to its owner stays so, and its upgrade is refused). The agent writes, as its
/// user, its uid, its cwd and whether it can read its cwd into `out/agent-V`, then
/// sleeps.
fn stage_for_user(sb: &Sandbox, v: &str) -> PathBuf {
    let src = sb.path(&format!("src-{v}"));
    fs::create_dir_all(src.join("bin")).expect("mkdir");
    let out = sb.path("out").join(format!("agent-{v}"));
    let script = src.join("bin/agent");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\nif ls . >/dev/null 2>&1; then r=readable; else r=unreadable; fi\n\
             echo \"$(id -u) $(pwd) $r\" > {out}.tmp && mv {out}.tmp {out}\nexec sleep 3600\n",
            out = out.display()
        ),
    )
    .expect("write agent");
    for p in [&script, &src.join("bin"), &src] {
        chmod(p, 0o755);
    }
    src
}

fn install(sb: &Sandbox, v: &str) {
    let src = stage_for_user(sb, v);
    supctl_ok(sb, &["install", "agent", v, &src.to_string_lossy()]);
}

fn versions(sb: &Sandbox) -> Value {
    sb.ok(json!({"cmd": "versions", "tool": "agent"}))
}

fn bad(sb: &Sandbox, v: &str) -> Value {
    versions(sb)["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|x| x["version"] == v)
        .map(|x| x["bad"].clone())
        .unwrap_or(Value::Null)
}

fn link(sb: &Sandbox) -> String {
    fs::read_link(sb.path("state/tools/agent/current"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The agent 1.0.0 running as nobody, committed, from the package's layout.
fn running_1_0_0() -> Sandbox {
    let mut sb = package_layout(AGENT);
    sb.start();
    install(&sb, "1.0.0");
    sb.upgrade_wait("1.0.0", true);
    sb.wait_state("agent", "running");
    sb
}

#[test]
fn a_versioned_tool_runs_as_its_user_from_the_package_layout() {
    if skip() {
        return;
    }
    let sb = running_1_0_0();
    let said = agent_said(&sb, "1.0.0");
    let dir = fs::canonicalize(sb.path("state/tools/agent/1.0.0")).expect("version dir");
    assert_eq!(
        said.trim(),
        format!("{} {} readable", nobody().uid, dir.display()),
        "the agent runs as nobody in its version directory, which it can read"
    );
    // The copy keeps the build's modes (readable by all); the state stays private.
    let mode = |p: &str| fs::metadata(sb.path(p)).expect(p).permissions().mode() & 0o777;
    assert_eq!(mode("state/tools/agent/1.0.0/bin/agent"), 0o755);
    assert_eq!(mode("state/tools/agent/1.0.0"), 0o755);
    assert_eq!(mode("state/tools/agent"), 0o755);
    assert_eq!(
        mode("state/tool-records/agent.json") & 0o007,
        0,
        "the tool record is private"
    );
    assert_eq!(
        mode("state/supd.lock") & 0o077,
        0,
        "the lock is root's alone"
    );
    assert_eq!(mode("state/pids") & 0o007, 0, "the pid records are private");
    assert_eq!(bad(&sb, "1.0.0"), json!(false));
}

#[test]
fn an_unversioned_service_of_a_user_starts_in_a_directory_it_can_read() {
    if skip() {
        return;
    }
    let sb = package_layout("");
    let out = sb.path("out/plain");
    let script = sb.script(
        "plain.sh",
        &format!(
            "if ls . >/dev/null 2>&1; then r=readable; else r=unreadable; fi\n\
             echo \"$(id -u) $(pwd) $r\" > {out}.tmp && mv {out}.tmp {out}\nexec sleep 3600",
            out = out.display()
        ),
    );
    let private = sb.path("private");
    fs::create_dir(&private).expect("mkdir");
    chmod(&private, 0o700);
    let mut sb = sb;
    fs::write(
        sb.path("sup.toml"),
        format!(
            "{}\n[service.plain]\ncommand = [\"{script}\"]\nuser = \"nobody\"\n\
             [service.walled]\ncommand = [\"{script}\"]\nuser = \"nobody\"\ncwd = \"{}\"\n",
            fs::read_to_string(sb.path("sup.toml")).expect("config"),
            private.display()
        ),
    )
    .expect("write config");
    sb.start();
    sb.wait_state("plain", "running");
    let said = wait_file(&out, |t| t.ends_with('\n'));
    assert_eq!(said.trim(), format!("{} / readable", nobody().uid));
    // A cwd the user may not enter is refused at the start, as that user, and said so;
    // not left as a directory it cannot use.
    let reason = failed_reason(&sb, "walled");
    assert_says(
        &reason,
        &[
            "permission denied",
            "user 'nobody'",
            &format!("cannot enter the directory {}", private.display()),
            "supctl start walled",
        ],
    );
    assert!(
        sb.supd_log().contains("permission denied: user 'nobody'"),
        "supd's log says it:\n{}",
        sb.supd_log()
    );
}

#[test]
fn an_upgrade_its_user_cannot_run_is_refused_before_anything_is_switched() {
    if skip() {
        return;
    }
    let sb = running_1_0_0();
    let pid = sb.status("agent")["pid"].clone();
    install(&sb, "2.0.0");
    let v2 = sb.path("state/tools/agent/2.0.0");
    // A version directory only root may enter: root could run it, nobody cannot.
    chmod(&v2, 0o700);
    let err = supctl_refused(&sb, &["upgrade", "agent", "2.0.0"]);
    assert_says(
        &err,
        &[
            "user 'nobody'",
            &format!("cannot search the directory {}", v2.display()),
            "mode 0700",
            "nothing was switched",
        ],
    );
    // A program only its owner may run.
    chmod(&v2, 0o755);
    let bin = v2.join("bin/agent");
    chmod(&bin, 0o744);
    let err = supctl_refused(&sb, &["upgrade", "agent", "2.0.0"]);
    assert!(
        err.contains(&format!("user 'nobody' cannot execute {}", bin.display())),
        "the refusal names the program: {err}"
    );
    assert_eq!(link(&sb), "1.0.0", "current is unchanged");
    let st = sb.status("agent");
    assert_eq!(
        (st["state"].clone(), st["pid"].clone()),
        (json!("running"), pid)
    );
    let v = versions(&sb);
    assert_eq!(
        (v["current"].clone(), v["phase"].clone()),
        (json!("1.0.0"), json!("committed"))
    );
    assert_eq!(
        bad(&sb, "2.0.0"),
        json!(false),
        "a refusal marks nothing bad"
    );
    // Mended, it goes through.
    chmod(&bin, 0o755);
    sb.upgrade_wait("2.0.0", true);
    assert_eq!(link(&sb), "2.0.0");
}

fn kill_agent(sb: &Sandbox) {
    let pid = sb.status("agent")["pid"].as_i64().expect("pid") as i32;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// Waits until the agent runs `version`.
fn runs(sb: &Sandbox, w: &mut Watch, version: &str) {
    let st = sb.status("agent");
    if st["state"] == "running" && st["version"] == version {
        return;
    }
    w.until(sb, |e| {
        e["event"] == "state"
            && e["service"] == "agent"
            && e["to"] == "running"
            && e["version"] == version
    });
}

/// Waits until the agent `v` has begun: its script wrote its line. "running" says its
/// exec went through; its shell reads the script after, and a permission broken before
/// that makes it exit with 2 instead of being killed as the test means.
fn begun(sb: &Sandbox, v: &str) {
    common::files::wait_file(&sb.path(&format!("out/agent-{v}")), |t| !t.is_empty());
}

#[test]
fn a_start_refused_for_permission_says_why_and_marks_no_version_bad() {
    if skip() {
        return;
    }
    let mut sb = package_layout(
        AGENT
            .replace("probation = \"1s\"", "probation = \"1h\"")
            .as_str(),
    );
    sb.start();
    install(&sb, "1.0.0");
    // The first version, in probation (nothing to roll back to).
    supctl_ok(&sb, &["upgrade", "agent", "1.0.0"]);
    sb.wait_state("agent", "running");
    begun(&sb, "1.0.0");
    // Its program is then made root's alone (a careless chmod), and it dies.
    let bin = sb.path("state/tools/agent/1.0.0/bin/agent");
    chmod(&bin, 0o700);
    kill_agent(&sb);
    let reason = failed_reason(&sb, "agent");
    assert_says(
        &reason,
        &[
            "permission denied",
            "user 'nobody' cannot execute",
            &bin.display().to_string(),
            "mode 0700, owner root:",
            "not a crash",
            "supctl start agent",
        ],
    );
    let v = versions(&sb);
    assert_eq!(bad(&sb, "1.0.0"), json!(false), "not marked bad: {v}");
    assert_eq!(
        v["phase"], "failed",
        "its probation ended, with the reason: {v}"
    );
    assert_eq!(link(&sb), "1.0.0");
    // Not retried meanwhile: it stays failed until started.
    // (`restarts_total`: the operator's start counts `restarts` afresh.)
    let restarts = sb.status("agent")["restarts_total"].clone();
    chmod(&bin, 0o755);
    supctl_ok(&sb, &["start", "agent"]);
    let st = sb.wait_state("agent", "running");
    assert_eq!(st["version"], "1.0.0");
    assert_eq!(
        st["restarts_total"], restarts,
        "the refused start was no crash"
    );

    // An upgrade whose version is then made unrunnable: rolled back, not marked bad.
    install(&sb, "2.0.0");
    let mut w = sb.watch();
    supctl_ok(&sb, &["upgrade", "agent", "2.0.0"]);
    runs(&sb, &mut w, "2.0.0");
    begun(&sb, "2.0.0");
    chmod(&sb.path("state/tools/agent/2.0.0"), 0o700);
    kill_agent(&sb);
    runs(&sb, &mut w, "1.0.0");
    let v = versions(&sb);
    assert_eq!(
        (v["current"].clone(), v["phase"].clone()),
        (json!("1.0.0"), json!("rolled-back")),
        "{v}"
    );
    assert_eq!(bad(&sb, "2.0.0"), json!(false), "not marked bad: {v}");
    assert!(
        sb.supd_log()
            .contains("rolled back to 1.0.0, 2.0.0 not marked bad"),
        "{}",
        sb.supd_log()
    );
    assert_eq!(link(&sb), "1.0.0");
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}

/// Gives `dir` the POSIX ACL `u::rwx,u:UID:x,g::r-x,m::r-x,o::---` (as `setfacl -m
/// u:UID:x` would, with mode 0750), written as the kernel stores it. False when the
/// file system has no ACLs.
fn let_through(dir: &Path, uid: u32) -> bool {
    let mut raw = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 7u16, u32::MAX),
        (0x02, 1, uid),
        (0x04, 5, u32::MAX),
        (0x10, 5, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        raw.extend(tag.to_le_bytes());
        raw.extend(perm.to_le_bytes());
        raw.extend(id.to_le_bytes());
    }
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).expect("path");
    // SAFETY: setxattr reads two NUL-terminated strings and `raw.len()` bytes of `raw`,
    // all alive across the call. There is no setfacl here, and std has no xattrs.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            raw.as_ptr().cast(),
            raw.len(),
            0,
        )
    };
    let e = std::io::Error::last_os_error();
    if r != 0 && e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        return false;
    }
    assert_eq!(r, 0, "setxattr: {e}");
    true
}

#[test]
fn a_user_let_through_a_private_state_dir_by_an_acl_may_upgrade() {
    if skip() {
        return;
    }
    let mut sb = package_layout(AGENT);
    let state = sb.path("state");
    chmod(&state, 0o750);
    if !let_through(&state, nobody().uid.as_raw()) {
        eprintln!("skipped: {} has no POSIX ACLs", state.display());
        return;
    }
    sb.start();
    install(&sb, "1.0.0");
    sb.upgrade_wait("1.0.0", true);
    let said = agent_said(&sb, "1.0.0");
    assert!(
        said.starts_with(&format!("{} ", nobody().uid)),
        "the ACL, not the mode, lets nobody through: {said}"
    );
}

/// An LD_PRELOAD library for supd that aborts it when its own process (not a forked
/// child, whose pid differs) reads the user database once the file named by
/// `SUP_TEST_NSS_TRAP` exists: a user database that hangs (LDAP, sssd) would stall supd
/// there. It writes supd's pid into `TRAP.loaded` when it loads, to show it is in place.
fn nss_trap(sb: &Sandbox) -> PathBuf {
    common::preload::build(
        sb,
        "nss_trap",
        r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static pid_t supd;
__attribute__((constructor)) static void loaded(void) {
    const char *trap = getenv("SUP_TEST_NSS_TRAP");
    if (!trap || strcmp(program_invocation_short_name, "supd") != 0) return;
    supd = getpid();
    char path[4096], pid[32];
    snprintf(path, sizeof path, "%s.loaded", trap);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) { write(fd, pid, snprintf(pid, sizeof pid, "%d\n", (int)supd)); close(fd); }
}
static void trap(const char *what) {
    const char *armed = getenv("SUP_TEST_NSS_TRAP");
    if (!supd || getpid() != supd || !armed || access(armed, F_OK) != 0) return;
    char msg[256];
    int n = snprintf(msg, sizeof msg, "NSS TRAP: supd's own process called %s\n", what);
    write(2, msg, n);
    abort();
}
#define REAL(name) static __typeof__(name) *real; if (!real) real = dlsym(RTLD_NEXT, #name)
struct passwd *getpwnam(const char *a) { trap("getpwnam"); REAL(getpwnam); return real(a); }
struct passwd *getpwuid(uid_t a) { trap("getpwuid"); REAL(getpwuid); return real(a); }
struct group *getgrnam(const char *a) { trap("getgrnam"); REAL(getgrnam); return real(a); }
struct group *getgrgid(gid_t a) { trap("getgrgid"); REAL(getgrgid); return real(a); }
int getpwnam_r(const char *a, struct passwd *b, char *c, size_t d, struct passwd **e) {
    trap("getpwnam_r"); REAL(getpwnam_r); return real(a, b, c, d, e);
}
int getpwuid_r(uid_t a, struct passwd *b, char *c, size_t d, struct passwd **e) {
    trap("getpwuid_r"); REAL(getpwuid_r); return real(a, b, c, d, e);
}
int getgrnam_r(const char *a, struct group *b, char *c, size_t d, struct group **e) {
    trap("getgrnam_r"); REAL(getgrnam_r); return real(a, b, c, d, e);
}
int getgrgid_r(gid_t a, struct group *b, char *c, size_t d, struct group **e) {
    trap("getgrgid_r"); REAL(getgrgid_r); return real(a, b, c, d, e);
}
int getgrouplist(const char *a, gid_t b, gid_t *c, int *d) {
    trap("getgrouplist"); REAL(getgrouplist); return real(a, b, c, d);
}
int initgroups(const char *a, gid_t b) { trap("initgroups"); REAL(initgroups); return real(a, b); }
"#,
    )
}

#[test]
fn supd_never_reads_the_user_database_itself() {
    if skip() {
        return;
    }
    // A socket_group that exists: looked up once, before the loop, and handed over
    // by a reexec.
    let mut sb = package_layout(AGENT);
    let cfg = fs::read_to_string(sb.path("sup.toml")).expect("config");
    let cfg = cfg.replace("[supd]\n", "[supd]\nsocket_group = \"root\"\n");
    fs::write(sb.path("sup.toml"), cfg).expect("write config");
    let shim = nss_trap(&sb);
    let trap = sb.path("nss-trap");
    let mut cmd = std::process::Command::new(SUPD);
    cmd.env("LD_PRELOAD", &shim).env("SUP_TEST_NSS_TRAP", &trap);
    sb.start_with(cmd, &["-c"]);
    let loaded = fs::read_to_string(sb.path("nss-trap.loaded")).unwrap_or_default();
    assert_eq!(
        loaded.trim(),
        sb.supd_pid().to_string(),
        "the trap is loaded into supd"
    );
    fs::write(&trap, "").expect("arm the trap");
    let alive = |sb: &Sandbox| {
        assert!(
            !sb.supd_log().contains("NSS TRAP"),
            "supd looked a user up itself:\n{}",
            sb.supd_log()
        );
    };

    // The children look nobody up; supd remembers the uid and groups they took.
    install(&sb, "1.0.0");
    sb.upgrade_wait("1.0.0", true);
    sb.wait_state("agent", "running");
    agent_said(&sb, "1.0.0");
    alive(&sb);
    // A new image takes what the old one knew (socket_group, the uid and groups taken).
    supctl_ok(&sb, &["reexec"]);
    alive(&sb);

    // An upgrade nobody could not run is refused, checked against what the child took;
    // owners by number (supd names nobody).
    install(&sb, "2.0.0");
    let v2 = sb.path("state/tools/agent/2.0.0");
    chmod(&v2, 0o700);
    let out = sb.supctl(&["upgrade", "agent", "2.0.0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    alive(&sb);
    assert_ne!(out.status.code(), Some(0), "refused: {err}");
    assert_says(
        &err,
        &[
            "user 'nobody'",
            &format!("cannot search the directory {}", v2.display()),
            "mode 0700, owner 0:0",
            "nothing was switched",
        ],
    );
    assert_eq!(link(&sb), "1.0.0", "current is unchanged");

    // A start refused for permission: the child says why, owners by name.
    let bin = sb.path("state/tools/agent/1.0.0/bin/agent");
    chmod(&bin, 0o700);
    kill_agent(&sb);
    let reason = failed_reason(&sb, "agent");
    alive(&sb);
    assert_says(
        &reason,
        &[
            "permission denied",
            &format!("user 'nobody' cannot execute {}", bin.display()),
            "mode 0700, owner root:",
            "supctl start agent",
        ],
    );
    // Mended, both go through, and supd answers all along.
    chmod(&bin, 0o755);
    chmod(&v2, 0o755);
    supctl_ok(&sb, &["start", "agent"]);
    sb.upgrade_wait("2.0.0", true);
    assert_eq!(link(&sb), "2.0.0");
    alive(&sb);
    assert!(common::alive(sb.supd_pid()), "supd runs");
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
}
