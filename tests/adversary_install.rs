//! `install` attacked as a hostile operator or the owner of a source tree would: links
//! that point out of the tree, a source that holds its own destination, a directory
//! cycle, files swapped under the copy (it runs as root), special files, huge sparse
//! files, a full disk, a copy killed by hand. What held is kept here as a test too.

mod common;
use common::files::{chmod, mode};
use common::*;
use serde_json::{json, Value};
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn skip() -> bool {
    if !is_root() {
        eprintln!("skipped: needs root (owners, setuid files, mounts)");
        return true;
    }
    false
}

fn started() -> Sandbox {
    let mut sb = Sandbox::new();
    sb.config("");
    sb.start();
    sb
}

/// Sends `install` on a fresh connection; the answer, or `None` if none came within
/// `wait` (the connection is then returned to be unblocked by the caller).
fn install_within(
    sb: &Sandbox,
    version: &str,
    src: &Path,
    extra: Value,
    wait: Duration,
) -> Result<Value, Client> {
    let mut c = sb.client();
    let mut req = json!({"cmd": "install", "id": 1, "tool": "agent", "version": version,
                         "dir": src.to_string_lossy()});
    if let (Some(r), Some(e)) = (req.as_object_mut(), extra.as_object()) {
        r.extend(e.clone());
    }
    c.writer.set_read_timeout(Some(wait)).expect("read timeout");
    c.send_raw(format!("{req}\n").as_bytes());
    let mut line = String::new();
    use std::io::BufRead;
    match c.reader.read_line(&mut line) {
        Ok(n) if n > 0 => Ok(serde_json::from_str(&line).expect("JSON")),
        _ => Err(c),
    }
}

fn install(sb: &Sandbox, version: &str, src: &Path) -> Value {
    install_within(sb, version, src, json!({}), DEADLINE)
        .unwrap_or_else(|_| panic!("no answer to install within {DEADLINE:?}"))
}

fn hidden(sb: &Sandbox) -> Vec<String> {
    common::files::hidden_in(&sb.path("tools/agent"))
}

fn wait_no_hidden(sb: &Sandbox) -> bool {
    common::files::wait_no_hidden_in(&sb.path("tools/agent"))
}

fn small_tree(sb: &Sandbox, name: &str) -> PathBuf {
    let src = sb.path(name);
    fs::create_dir_all(src.join("bin")).expect("mkdir");
    fs::write(src.join("bin/agent"), "#!/bin/sh\nexec sleep 3600\n").expect("write");
    chmod(&src.join("bin/agent"), 0o755);
    src
}

/// Held: links are copied as links, whatever they point at; nothing behind them is
/// read, opened or changed (the copy runs as root).
#[test]
fn links_out_of_the_tree_are_copied_as_links_and_never_followed() {
    if skip() {
        return;
    }
    let sb = started();
    let src = small_tree(&sb, "src");
    let secret = sb.path("secret");
    fs::write(&secret, "s3cret\n").expect("secret");
    chmod(&secret, 0o600);
    let before = fs::metadata(&secret).expect("secret");
    let shadow = fs::metadata("/etc/shadow")
        .map(|m| (m.mode(), m.uid(), m.gid()))
        .ok();
    std::os::unix::fs::symlink("../../../../../../../../etc/shadow", src.join("up")).expect("ln");
    std::os::unix::fs::symlink(&secret, src.join("abs")).expect("ln");
    std::os::unix::fs::symlink("loop", src.join("loop")).expect("ln");
    std::os::unix::fs::symlink("/", src.join("root")).expect("ln");
    std::os::unix::fs::symlink("nowhere/at/all", src.join("dangling")).expect("ln");
    // A hard link to a private file out of the tree: its content comes, its mode too.
    fs::hard_link(&secret, src.join("hard")).expect("ln");

    let a = install(&sb, "1.0.0", &src);
    assert_eq!(a["ok"], true, "{a}");
    let v = sb.path("tools/agent/1.0.0");
    for (name, target) in [
        ("up", "../../../../../../../../etc/shadow".to_string()),
        ("abs", secret.display().to_string()),
        ("loop", "loop".into()),
        ("root", "/".into()),
        ("dangling", "nowhere/at/all".into()),
    ] {
        let m = fs::symlink_metadata(v.join(name)).expect("copied");
        assert!(m.file_type().is_symlink(), "{name} stays a link");
        assert_eq!(
            fs::read_link(v.join(name)).expect("link"),
            Path::new(&target)
        );
    }
    assert_eq!(mode(&v.join("hard")), 0o600, "a private file stays private");
    let after = fs::metadata(&secret).expect("secret");
    assert_eq!(
        (after.mode(), after.uid(), after.mtime()),
        (before.mode(), before.uid(), before.mtime()),
        "what a link points at is never touched"
    );
    assert_eq!(
        fs::metadata("/etc/shadow")
            .map(|m| (m.mode(), m.uid(), m.gid()))
            .ok(),
        shadow
    );
}

/// Held: odd modes and owners are kept as they are, never widened: a 0000 file and
/// directory, a setgid directory, a sticky world-writable one, a setuid program of
/// another user (refused without the option, kept 4755 nobody's with it).
#[test]
fn odd_modes_and_other_users_setuid_programs_are_kept_exactly() {
    if skip() {
        return;
    }
    let sb = started();
    let src = small_tree(&sb, "src");
    fs::write(src.join("none"), "x").expect("write");
    chmod(&src.join("none"), 0o000);
    fs::create_dir(src.join("locked")).expect("mkdir");
    fs::write(src.join("locked/inside"), "y").expect("write");
    chmod(&src.join("locked"), 0o000);
    fs::create_dir(src.join("shared")).expect("mkdir");
    chmod(&src.join("shared"), 0o2775);
    fs::create_dir(src.join("tmp")).expect("mkdir");
    chmod(&src.join("tmp"), 0o1777);
    let suid = src.join("bin/theirs");
    fs::write(&suid, "#!/bin/sh\n").expect("write");
    std::os::unix::fs::chown(&suid, Some(65534), Some(65534)).expect("chown");
    chmod(&suid, 0o4755);

    let a = install(&sb, "1.0.0", &src);
    assert_eq!(
        a["ok"], false,
        "a setuid program of nobody's is refused: {a}"
    );
    assert!(
        a["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("set-user-ID"),
        "{a}"
    );
    assert!(wait_no_hidden(&sb), "left: {:?}", hidden(&sb));
    let a = install_within(&sb, "1.0.0", &src, json!({"allow_special": true}), DEADLINE)
        .unwrap_or_else(|_| panic!("no answer"));
    assert_eq!(a["ok"], true, "{a}");
    let v = sb.path("tools/agent/1.0.0");
    assert_eq!(mode(&v.join("none")), 0o000);
    assert_eq!(mode(&v.join("locked")), 0o000);
    assert_eq!(mode(&v.join("shared")), 0o2775);
    assert_eq!(mode(&v.join("tmp")), 0o1777);
    assert_eq!(mode(&v.join("bin/theirs")), 0o4755);
    assert_eq!(
        fs::metadata(v.join("bin/theirs")).expect("stat").uid(),
        65534
    );
    assert_eq!(fs::read(v.join("locked/inside")).expect("read"), b"y");
}

/// Held: a 10 GB sparse file is copied as holes (seconds, a few blocks), and names that
/// are not UTF-8 or hold a newline are copied as they are.
#[test]
fn a_huge_sparse_file_and_odd_names_are_copied_as_they_are() {
    if skip() {
        return;
    }
    use std::os::unix::ffi::OsStrExt;
    let sb = started();
    let src = small_tree(&sb, "src");
    let f = fs::File::create(src.join("sparse")).expect("create");
    f.set_len(10 << 30).expect("10 GB of hole");
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"middle", 5 << 30).expect("write");
    drop(f);
    let odd = std::ffi::OsStr::from_bytes(b"new\nline\xff\xfe");
    fs::write(src.join(odd), "odd").expect("odd name");
    let t = Instant::now();
    let a = install(&sb, "1.0.0", &src);
    assert_eq!(a["ok"], true, "{a}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    let v = sb.path("tools/agent/1.0.0");
    let m = fs::metadata(v.join("sparse")).expect("sparse");
    assert_eq!(m.len(), 10 << 30);
    assert!(
        m.blocks() * 512 < 64 << 20,
        "holes kept: {} blocks",
        m.blocks()
    );
    let mut buf = [0u8; 6];
    fs::File::open(v.join("sparse"))
        .expect("open")
        .read_exact_at(&mut buf, 5 << 30)
        .expect("read");
    assert_eq!(&buf, b"middle");
    assert_eq!(fs::read(v.join(odd)).expect("odd"), b"odd");
}

/// A source that holds the destination (the tool's own directory, or `/`) was copied
/// into itself: each level of the copy found the level it had just made, and went
/// down again, copying every version once more per level, until the descriptors ran
/// out (hundreds of levels; thousands under an init's open-files limit, or a crash
/// when the stack ran out). `cp -a` says "cannot copy a directory into itself".
#[test]
fn a_source_that_holds_the_destination_is_refused_not_copied_into_itself() {
    if skip() {
        return;
    }
    let sb = started();
    let src = small_tree(&sb, "src");
    let a = install(&sb, "1.0.0", &src);
    assert_eq!(a["ok"], true, "{a}");
    let a = install(&sb, "2.0.0", &sb.path("tools/agent"));
    assert_eq!(a["ok"], false, "{a}");
    let msg = a["error"]["message"].as_str().unwrap_or("").to_string();
    assert!(
        msg.contains("into itself"),
        "refused for what it is, not for running out of descriptors: {msg}"
    );
    assert!(wait_no_hidden(&sb), "left: {:?}", hidden(&sb));
    assert!(!sb.path("tools/agent/2.0.0").exists());
}

/// The owner of a source swaps one of its files for a FIFO between the copy's look
/// at it and its open (the copy runs as root): the open of a FIFO for reading waited
/// for a writer that never comes, so the install never answered, and every later
/// install of that version was refused as "under way", until supd's end.
#[test]
fn a_fifo_swapped_in_for_a_file_never_hangs_the_copy() {
    if skip() {
        return;
    }
    use nix::fcntl::{renameat2, RenameFlags};
    let sb = started();
    let src = small_tree(&sb, "src");
    let dir = src.join("swap");
    fs::create_dir(&dir).expect("mkdir");
    fs::write(dir.join("f"), "file").expect("write");
    nix::unistd::mkfifo(
        &dir.join("p"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .expect("mkfifo");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (dir, stop) = (dir.clone(), stop.clone());
        std::thread::spawn(move || {
            let d = fs::File::open(&dir).expect("dir");
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = renameat2(&d, "f", &d, "p", RenameFlags::RENAME_EXCHANGE);
            }
        })
    };
    let end = Instant::now() + Duration::from_secs(60);
    let mut hung = None;
    let mut tries = 0;
    while Instant::now() < end && tries < 400 {
        tries += 1;
        // A copy that hangs never ends; a loaded machine makes one slow.
        match install_within(&sb, "1.0.0", &src, json!({}), DEADLINE / 2) {
            Ok(a) if a["ok"] == true => {
                // Copied at a moment both names were what they seemed: start again.
                let _ = fs::remove_dir_all(sb.path("tools/agent/1.0.0"));
            }
            Ok(_) => {}
            Err(c) => {
                hung = Some(c);
                break;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().expect("swapper");
    if let Some(c) = hung {
        // Let the copy go (a writer comes and goes), so the sandbox can end.
        for n in ["f", "p"] {
            let _ = fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(dir.join(n));
        }
        drop(c);
        panic!("the install hung after {tries} tries: the copy waits on a FIFO");
    }
    eprintln!("{tries} installs, none hung");
}

use std::os::unix::fs::OpenOptionsExt;

/// Held: a tools_dir that fills up fails the install with the reason, and leaves
/// neither the version nor its staging.
#[test]
fn a_full_tools_dir_fails_the_install_and_leaves_nothing() {
    if skip() {
        return;
    }
    let mut sb = Sandbox::new();
    let tools = sb.path("tools");
    fs::create_dir_all(&tools).expect("mkdir");
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&tools)
        .status();
    if !ok.is_ok_and(|s| s.success()) {
        eprintln!("skipped: cannot mount a tmpfs here");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _u = Unmount(tools.clone());
    sb.config("");
    sb.start();
    let src = small_tree(&sb, "src");
    fs::write(src.join("big"), vec![1u8; 8 << 20]).expect("big");
    let a = install(&sb, "1.0.0", &src);
    assert_eq!(a["ok"], false, "{a}");
    assert!(
        a["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("No space left"),
        "{a}"
    );
    assert!(wait_no_hidden(&sb), "left: {:?}", hidden(&sb));
    assert!(!sb.path("tools/agent/1.0.0").exists());
    // Room again: the same version goes in.
    fs::remove_file(src.join("big")).expect("rm");
    let a = install(&sb, "1.0.0", &src);
    assert_eq!(a["ok"], true, "{a}");
}

/// Under umask 0 (supd as an init), the staging was made 0777 by supd and closed to
/// 0700 only by the copy, after its fork: in between, anyone could create a file in it
/// (the copy then refuses a staging not empty: the install fails), watching the tool's
/// directory with inotify to come in time. The staging must be made private.
/// `versions::prepare_install` made it with `fs::create_dir`: 0777 under umask 0 until
/// the copy's fchmod (18 of 19 installs seen so).
#[test]
fn the_staging_is_never_open_to_others_even_under_umask_0() {
    if skip() {
        return;
    }
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let mut sb = Sandbox::new();
    sb.config("");
    let mut cmd = Command::new("/bin/sh");
    cmd.args(["-c", "umask 0; exec \"$0\" \"$@\"", SUPD]);
    sb.start_with(cmd, &["-c"]);
    let src = small_tree(&sb, "src");
    assert_eq!(install(&sb, "0.9.0", &src)["ok"], true);
    let dir = sb.path("tools/agent");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let ino = Inotify::init(InitFlags::IN_CLOEXEC).expect("inotify");
    ino.add_watch(&dir, AddWatchFlags::IN_CREATE)
        .expect("watch");
    let watcher = {
        let (dir, seen) = (dir.clone(), seen.clone());
        std::thread::spawn(move || {
            while let Ok(events) = ino.read_events() {
                for e in events {
                    let Some(name) = e.name.and_then(|n| n.into_string().ok()) else {
                        continue;
                    };
                    if name == "done" {
                        return;
                    }
                    if name.starts_with(".install-") {
                        if let Ok(m) = fs::symlink_metadata(dir.join(&name)) {
                            seen.lock().expect("lock").push(m.mode() & 0o7777);
                        }
                    }
                }
            }
        })
    };
    for i in 0..20 {
        assert_eq!(install(&sb, &format!("1.0.{i}"), &src)["ok"], true);
    }
    fs::write(dir.join("done"), "").expect("done");
    watcher.join().expect("watcher");
    let seen = seen.lock().expect("lock").clone();
    assert!(!seen.is_empty(), "no staging seen");
    // Never writable by others (0777 under umask 0: a file dropped in failed the
    // install). At its end the copy gives it the source's mode (0755 here) before the
    // rename, which a late look may see: readable, as the version will be.
    assert!(
        seen.iter().all(|m| m & 0o022 == 0),
        "stagings seen open to others: {:?}",
        seen.iter().map(|m| format!("{m:04o}")).collect::<Vec<_>>()
    );
}
