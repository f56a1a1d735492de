//! `install` copies a version as `cp -a` would, less what is dangerous (issue 23, items
//! 5 and 7): every mode kept exactly, never widened, whatever supd's umask; set-user-ID
//! files and device nodes refused with their path unless `--allow-special` asks for
//! them, and then no wider than they were. And the copy is a helper that ends with supd:
//! a clean shutdown kills and reaps it and deletes its staging before supd exits; a
//! kill -9 of supd kills it too, and the next supd deletes the staging; a `reexec`
//! keeps it, and the new image moves the copy into place.
//!
//! A copy is held in progress by a write lease (`F_SETLEASE`) that a small program
//! takes on one of the source's files: the copy's `open` of it waits for the lease
//! holder (up to `/proc/sys/fs/lease-break-time`, 45 s by default), and the holder is
//! told (SIGIO) the moment it does: the copy is then under way, its staging made.

mod common;
use common::files::{chmod, mode};
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn skip() -> bool {
    if !is_root() {
        eprintln!("skipped: needs root (setuid-root files, mknod, owners, leases)");
        return true;
    }
    false
}

/// A version tree with a plain program, a private 0640 file, a 0700 directory, a file
/// owned by nobody and a relative symbolic link.
fn stage_plain(sb: &Sandbox, name: &str) -> PathBuf {
    let src = sb.path(name);
    fs::create_dir_all(src.join("bin")).expect("mkdir bin");
    fs::create_dir_all(src.join("private")).expect("mkdir private");
    fs::write(src.join("bin/agent"), "#!/bin/sh\nexec sleep 3600\n").expect("write");
    fs::write(src.join("etc.conf"), "secret = 1\n").expect("write");
    fs::write(src.join("private/key"), "k\n").expect("write");
    fs::write(src.join("owned"), "o\n").expect("write");
    std::os::unix::fs::chown(src.join("owned"), Some(65534), Some(65534)).expect("chown");
    std::os::unix::fs::symlink("bin/agent", src.join("link")).expect("symlink");
    chmod(&src.join("bin/agent"), 0o750);
    chmod(&src.join("bin"), 0o755);
    chmod(&src.join("etc.conf"), 0o640);
    chmod(&src.join("private/key"), 0o600);
    chmod(&src.join("private"), 0o700);
    chmod(&src.join("owned"), 0o604);
    chmod(&src, 0o750);
    src
}

fn install(sb: &Sandbox, args: &[&str]) -> std::process::Output {
    let mut a = vec!["install"];
    a.extend_from_slice(args);
    sb.supctl(&a)
}

fn said(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// What an install left in the tool's directory besides versions: nothing, once it
/// ended (`.install-*` staging, `.prune-*` moved aside for deletion).
fn hidden(sb: &Sandbox) -> Vec<String> {
    common::files::hidden_in(&sb.path("tools/agent"))
}

fn assert_plain_kept(v: &Path) {
    assert_eq!(
        mode(&v.join("bin/agent")),
        0o750,
        "a program not for others"
    );
    assert_eq!(mode(&v.join("etc.conf")), 0o640, "a 0640 file stays 0640");
    assert_eq!(
        mode(&v.join("private")),
        0o700,
        "a 0700 directory stays 0700"
    );
    assert_eq!(mode(&v.join("private/key")), 0o600);
    assert_eq!(mode(&v.join("owned")), 0o604);
    assert_eq!(
        mode(v),
        0o750,
        "the version's directory has the source's mode"
    );
    let owned = fs::metadata(v.join("owned")).expect("owned");
    assert_eq!((owned.uid(), owned.gid()), (65534, 65534), "owners kept");
    assert_eq!(
        fs::read_link(v.join("link")).expect("a link stays a link"),
        Path::new("bin/agent")
    );
    assert_eq!(
        fs::read_to_string(v.join("private/key")).expect("key"),
        "k\n"
    );
}

fn started_with_umask(umask: &str) -> Sandbox {
    let mut sb = Sandbox::new();
    sb.config("");
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", &format!("umask {umask}; exec \"$0\" \"$@\""), SUPD]);
    sb.start_with(cmd, &["-c"]);
    sb
}

#[test]
fn a_plain_tree_keeps_its_modes_under_umask_0() {
    if skip() {
        return;
    }
    let sb = started_with_umask("0");
    let src = stage_plain(&sb, "src");
    let out = install(&sb, &["agent", "1.0.0", &src.to_string_lossy()]);
    assert!(out.status.success(), "install: {}", said(&out));
    assert_plain_kept(&sb.path("tools/agent/1.0.0"));
    assert!(hidden(&sb).is_empty(), "left: {:?}", hidden(&sb));
}

#[test]
fn a_plain_tree_keeps_its_modes_under_umask_077() {
    if skip() {
        return;
    }
    let sb = started_with_umask("077");
    let src = stage_plain(&sb, "src");
    chmod(&src.join("etc.conf"), 0o644);
    chmod(&src, 0o755);
    let out = install(&sb, &["agent", "1.0.0", &src.to_string_lossy()]);
    assert!(out.status.success(), "install: {}", said(&out));
    let v = sb.path("tools/agent/1.0.0");
    assert_eq!(
        mode(&v.join("etc.conf")),
        0o644,
        "not narrowed by the umask"
    );
    assert_eq!(mode(&v), 0o755);
    assert_eq!(mode(&v.join("private")), 0o700);
    assert_eq!(mode(&v.join("bin/agent")), 0o750);
}

#[test]
fn a_setuid_root_program_is_refused_without_the_option_and_kept_4700_with_it() {
    if skip() {
        return;
    }
    let mut sb = Sandbox::new();
    sb.config("");
    sb.start();
    let src = stage_plain(&sb, "src");
    let suid = src.join("bin/helper");
    fs::write(&suid, "#!/bin/sh\nid -u\n").expect("write");
    chmod(&suid, 0o4700);
    assert_eq!(fs::metadata(&suid).expect("stat").uid(), 0, "root's");

    let out = install(&sb, &["agent", "1.0.0", &src.to_string_lossy()]);
    let text = said(&out);
    assert_eq!(out.status.code(), Some(1), "refused: {text}");
    assert!(
        text.contains(&suid.display().to_string()) && text.contains("set-user-ID"),
        "the path and the reason: {text}"
    );
    assert!(text.contains("--allow-special"), "what to do: {text}");
    assert!(!sb.path("tools/agent/1.0.0").exists(), "nothing installed");
    assert!(wait_no_hidden(&sb), "left: {:?}", hidden(&sb));

    let out = install(
        &sb,
        &["--allow-special", "agent", "1.0.0", &src.to_string_lossy()],
    );
    assert!(
        out.status.success(),
        "install --allow-special: {}",
        said(&out)
    );
    let v = sb.path("tools/agent/1.0.0");
    assert_eq!(mode(&v.join("bin/helper")), 0o4700, "kept 4700, not 4755");
    assert_eq!(fs::metadata(v.join("bin/helper")).expect("stat").uid(), 0);
    assert_plain_kept(&v);
}

#[test]
fn a_private_device_node_is_refused_without_the_option_and_kept_0600_with_it() {
    if skip() {
        return;
    }
    let mut sb = Sandbox::new();
    sb.config("");
    sb.start();
    let src = stage_plain(&sb, "src");
    fs::create_dir(src.join("dev")).expect("mkdir dev");
    let node = src.join("dev/null0");
    let null = fs::metadata("/dev/null").expect("/dev/null").rdev();
    let made = Command::new("mknod")
        .args(["-m", "0600"])
        .arg(&node)
        .args([
            "c",
            &nix::sys::stat::major(null).to_string(),
            &nix::sys::stat::minor(null).to_string(),
        ])
        .status()
        .expect("mknod");
    assert!(made.success(), "mknod");
    chmod(&node, 0o600);

    let out = install(&sb, &["agent", "1.0.0", &src.to_string_lossy()]);
    let text = said(&out);
    assert_eq!(out.status.code(), Some(1), "refused: {text}");
    assert!(
        text.contains(&node.display().to_string()) && text.contains("character device"),
        "the path and the reason: {text}"
    );
    assert!(!sb.path("tools/agent/1.0.0").exists(), "nothing installed");

    let out = install(
        &sb,
        &["agent", "1.0.0", &src.to_string_lossy(), "--allow-special"],
    );
    assert!(
        out.status.success(),
        "install --allow-special: {}",
        said(&out)
    );
    let copy = sb.path("tools/agent/1.0.0/dev/null0");
    let m = fs::symlink_metadata(&copy).expect("the node");
    assert!(m.file_type().is_char_device(), "a device node still");
    assert_eq!(m.rdev(), null, "the same device");
    assert_eq!(m.mode() & 0o7777, 0o600, "not world-readable");
    assert_plain_kept(&sb.path("tools/agent/1.0.0"));
}

/// The failed install's staging is deleted by a helper: waits (with the deadline) for it.
fn wait_no_hidden(sb: &Sandbox) -> bool {
    common::files::wait_no_hidden_in(&sb.path("tools/agent"))
}

/// A program holding a write lease on `file`: its `open` by anyone else waits. Says
/// `held` once it has the lease, then `opened` when someone tries to open the file.
struct Lease {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Lease {
    fn take(file: &Path) -> Lease {
        let script = "import fcntl, os, signal, sys, time\n\
                      signal.signal(signal.SIGIO, lambda *a: print('opened', flush=True))\n\
                      fd = os.open(sys.argv[1], os.O_RDONLY)\n\
                      fcntl.fcntl(fd, 1024, fcntl.F_WRLCK)\n\
                      print('held', flush=True)\n\
                      while True: time.sleep(1000)\n";
        let mut child = Command::new("python3")
            .args(["-c", script])
            .arg(file)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 (the lease holder)");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let l = Lease { child, lines: rx };
        l.expect("held");
        l
    }

    fn expect(&self, what: &str) {
        let line = self
            .lines
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|e| panic!("the lease holder did not say {what:?}: {e}"));
        assert_eq!(line, what);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A source whose copy, once started, waits on the lease of its `big` file: returns
/// the sandbox (supd started), the lease and the source.
fn held_install(sb: &mut Sandbox) -> (Lease, Client) {
    sb.config("");
    sb.start();
    let src = stage_plain(sb, "src");
    // Some data to copy besides: the staging is not empty when the copy is cut short.
    fs::write(src.join("data"), vec![7u8; 4 << 20]).expect("data");
    fs::write(src.join("zz-held"), "held\n").expect("held file");
    let lease = Lease::take(&src.join("zz-held"));
    let mut c = sb.client();
    let req = json!({"cmd": "install", "id": 1, "tool": "agent", "version": "1.0.0",
                     "dir": src.to_string_lossy()});
    c.send_raw(format!("{req}\n").as_bytes());
    lease.expect("opened");
    assert!(
        sb.path("tools/agent/.install-1.0.0").is_dir(),
        "the copy is under way in its staging"
    );
    (lease, c)
}

/// supd's descendants, its own helpers of long life (the spawner, the log writer) left
/// out: the copy, and what it runs.
fn helpers_of(supd: i32) -> Vec<i32> {
    let all = sup::proc::all();
    let mut found = vec![supd];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(all.iter().filter(|s| s.ppid == p).map(|s| s.pid));
        i += 1;
    }
    found
        .into_iter()
        .skip(1)
        .filter(|&p| {
            let cmd = fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            !cmd.contains("--spawner") && !cmd.contains("--log-writer")
        })
        .filter(|&p| alive(p))
        .collect()
}

#[test]
fn a_clean_shutdown_ends_the_copy_and_deletes_its_staging() {
    if skip() {
        return;
    }
    let mut sb = Sandbox::new();
    let (_lease, _client) = held_install(&mut sb);
    let helpers = helpers_of(sb.supd_pid());
    assert!(!helpers.is_empty(), "the copy runs");
    let status = sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
    assert!(status.success(), "supd exits cleanly: {status:?}");
    let living: Vec<i32> = helpers.iter().copied().filter(|&p| alive(p)).collect();
    for &p in &living {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(p),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(
        living.is_empty(),
        "helpers outlived supd: {living:?}\n{}",
        sb.supd_log()
    );
    assert!(
        hidden(&sb).is_empty(),
        "staging left after supd's exit: {:?}",
        hidden(&sb)
    );
    assert!(!sb.path("tools/agent/1.0.0").exists());
}

#[test]
fn a_killed_supd_takes_the_copy_with_it_and_the_next_deletes_the_staging() {
    if skip() {
        return;
    }
    let mut sb = Sandbox::new();
    let (_lease, _client) = held_install(&mut sb);
    let helpers = helpers_of(sb.supd_pid());
    assert!(!helpers.is_empty(), "the copy runs");
    sb.stop_supd(nix::sys::signal::Signal::SIGKILL);
    for &p in &helpers {
        if wait_exit(p, DEADLINE).is_none() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("helper {p} outlived the killed supd");
        }
    }
    assert!(
        !hidden(&sb).is_empty(),
        "the staging stays until a supd starts"
    );
    sb.start();
    assert!(
        wait_no_hidden(&sb),
        "the next supd deletes the staging: {:?}",
        hidden(&sb)
    );
    assert!(!sb.path("tools/agent/1.0.0").exists());
}

#[test]
fn a_copy_under_way_across_reexec_goes_on_and_is_moved_into_place() {
    if skip() {
        return;
    }
    let mut sb = Sandbox::new();
    let (lease, _client) = held_install(&mut sb);
    let helpers = helpers_of(sb.supd_pid());
    assert!(!helpers.is_empty(), "the copy runs");
    sb.reexec();
    assert!(
        helpers.iter().all(|&p| alive(p)),
        "the copy survives the exec of its parent: {helpers:?}\n{}",
        sb.supd_log()
    );
    let mut w = sb.watch();
    drop(lease);
    let e: Value = w.until(&sb, |e| e["event"] == "install");
    assert_eq!(e["ok"], true, "the new image moved it into place: {e}");
    assert_plain_kept(&sb.path("tools/agent/1.0.0"));
    assert_eq!(
        fs::read_to_string(sb.path("tools/agent/1.0.0/zz-held")).expect("held file"),
        "held\n"
    );
    assert!(hidden(&sb).is_empty(), "left: {:?}", hidden(&sb));
}

#[test]
fn the_check_of_a_new_program_before_reexec_ends_with_supd() {
    if skip() {
        return;
    }
    let mut sb = Sandbox::new();
    sb.config("");
    sb.start();
    // A "new program" whose --check never ends: the helper supd waits on.
    let pid_file = sb.path("check.pid");
    let binary = sb.script(
        "slow-check",
        &format!(
            "echo $$ > {}.tmp && mv {0}.tmp {0}\nexec sleep 3600",
            pid_file.display()
        ),
    );
    let mut c = sb.client();
    let req = json!({"cmd": "reexec", "id": 1, "binary": binary});
    c.send_raw(format!("{req}\n").as_bytes());
    let pid: i32 = common::files::wait_file(&pid_file, |t| t.ends_with('\n'))
        .trim()
        .parse()
        .expect("the check's pid");
    assert!(alive(pid), "the check runs");
    let status = sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
    assert!(status.success(), "supd exits cleanly: {status:?}");
    if alive(pid) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        panic!("the check {pid} outlived supd\n{}", sb.supd_log());
    }
}
