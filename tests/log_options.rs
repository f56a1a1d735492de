//! The logging options of issue 12: supd's own log file (`[supd] log_file`), the console
//! mode (`log = "inherit"` prefixes each line with the service's name), stderr kept
//! apart (`log_stderr = "marked"`, `log --stderr`) or merged, and log files readable by
//! `socket_group`. Each with real services and a real supd.

mod common;
use common::files::wait_file;
use common::*;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Starts supd with its stdout going to `stdout` in the sandbox (its stderr stays
/// `supd.stderr`), through a shell that execs it (so the pid is supd's).
fn start_split(sb: &mut Sandbox) {
    let out = sb.path("stdout");
    let script = format!("exec \"$0\" \"$@\" >{}", out.display());
    sb.start_with(Command::new("/bin/sh"), &["-c", &script, SUPD, "-c"]);
}

/// Waits until `path` exists (made by another process), by inotify on its directory.
fn wait_exists(path: &Path) {
    let dir = path.parent().expect("a parent");
    let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).expect("inotify");
    ino.add_watch(dir, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
        .expect("watch");
    let end = Instant::now() + DEADLINE;
    while !path.exists() {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{} did not appear", path.display());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let _ = poll(
            &mut [PollFd::new(ino.as_fd(), PollFlags::POLLIN)],
            PollTimeout::from(ms),
        );
        let _ = ino.read_events();
    }
}

fn ok(out: &std::process::Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// supd's own messages go to `log_file` (its directory made), with timestamps and
/// levels: a crash loop is found there. Small rotation settings rotate it.
#[test]
fn supd_log_file_holds_a_crash_loop_and_rotates() {
    let mut sb = Sandbox::new();
    sb.config_with(
        "log_file = \"own/supd.log\"\nlog_max_size = \"1KiB\"\nlog_keep = 2\n",
        "[service.crasher]\ncommand = [\"/bin/false\"]\nrestart_delay = \"10ms\"\n\
         restart_delay_max = \"10ms\"\ncrash_loop = { restarts = 10, window = \"1m\" }\ncooldown = \"1h\"\n",
    );
    sb.start();
    sb.wait_state("crasher", "cooldown");
    let log = sb.path("own/supd.log");
    let all = || {
        let mut t = String::new();
        for f in ["own/supd.log.2", "own/supd.log.1", "own/supd.log"] {
            t += &std::fs::read_to_string(sb.path(f)).unwrap_or_default();
        }
        t
    };
    wait_file(&log, |_| all().contains("crasher: cooldown (crash loop"));
    let text = all();
    let line = text
        .lines()
        .find(|l| l.contains("crasher: cooldown (crash loop"))
        .expect("the line");
    // `2024-05-01T10:00:00.000Z WARN  crasher: cooldown (...)`
    let (stamp, rest) = line.split_once(' ').expect("a stamp");
    assert!(stamp.len() == 24 && stamp.ends_with('Z'), "{line}");
    assert!(rest.starts_with("WARN  crasher:"), "{line}");
    assert!(text.contains(" INFO  crasher: "), "{text}");
    // Rotated: the files kept, each within the size.
    assert!(sb.path("own/supd.log.1").exists(), "not rotated");
    assert!(!sb.path("own/supd.log.3").exists());
    for f in ["own/supd.log", "own/supd.log.1"] {
        let meta = std::fs::metadata(sb.path(f)).expect("meta");
        assert!(meta.len() <= 1024, "{f}: {}", meta.len());
        assert_eq!(meta.mode() & 0o777, 0o640, "{f}");
    }
}

/// A log file that cannot be written (a full disk: /dev/full) is said once on stderr,
/// and supd goes on serving.
#[test]
fn an_unwritable_log_file_is_said_once_and_supd_goes_on() {
    let mut sb = Sandbox::new();
    sb.config_with(
        "log_file = \"/dev/full\"\n",
        "[service.crasher]\ncommand = [\"/bin/false\"]\nrestart_delay = \"10ms\"\n\
         crash_loop = { restarts = 5, window = \"1m\" }\ncooldown = \"1h\"\n",
    );
    sb.start();
    sb.wait_state("crasher", "cooldown");
    wait_file(&sb.path("supd.stderr"), |t| {
        t.contains("cannot write /dev/full")
    });
    // Still serving, and still only said once.
    assert_eq!(sb.status("crasher")["state"], "cooldown");
    let said = sb.supd_log().matches("cannot write /dev/full").count();
    assert_eq!(said, 1, "{}", sb.supd_log());
}

/// A service's log file that cannot be written (here a directory) is said once, on
/// stderr and in supd's own log file, and its lines are counted as dropped.
#[test]
fn a_service_log_that_cannot_be_written_is_said_in_supd_log_file() {
    let mut sb = Sandbox::new();
    std::fs::create_dir_all(sb.path("log/talk.log")).expect("mkdir");
    let talk = sb.script("talk.sh", "echo one; exec sleep 1000");
    sb.config_with(
        "log_file = \"supd.log\"\n",
        &format!("[service.talk]\ncommand = [\"{talk}\"]\n"),
    );
    sb.start();
    let own = wait_file(&sb.path("supd.log"), |t| {
        t.contains("WARN  talk: cannot write ")
    });
    assert!(own.contains("talk.log: Is a directory"), "{own}");
    // The writer reports the line it dropped before it says so in the file, and supd
    // reads the writer's reports before its clients' requests: the marker of the run's
    // start at least, and perhaps its line "one" already.
    let dropped = sb.status("talk")["log_dropped"].as_u64().unwrap_or(0);
    assert!((1..=2).contains(&dropped), "{dropped}");
    assert_eq!(sb.supd_log().matches("talk: cannot write").count(), 1);
}

/// The log file goes on across `reexec` (the new image's messages land in it), and a
/// reload's new `log_file` is used from then on.
#[test]
fn supd_log_file_goes_on_across_reexec_and_reload() {
    let mut sb = Sandbox::new();
    let svc = "[service.idle]\ncommand = [\"/bin/sleep\", \"1000\"]\n";
    sb.config_with("log_file = \"a.log\"\n", svc);
    sb.start();
    let a = sb.path("a.log");
    wait_file(&a, |t| t.matches(" serving ").count() == 1);
    ok(&sb.supctl(&["reexec"]));
    // The new image says it serves, in the same file.
    wait_file(&a, |t| t.matches(" serving ").count() == 2);
    sb.config_with("log_file = \"b.log\"\n", svc);
    ok(&sb.supctl(&["reload"]));
    wait_file(&sb.path("b.log"), |t| t.contains("reloaded"));
}

/// `log = "inherit"`: each line on supd's stdout is prefixed with the service's name; a
/// line written in pieces stays one line, a long one is cut into prefixed pieces, and
/// two services writing at once never mix within a line. Stderr (kept apart) goes to
/// supd's stderr, prefixed too.
#[test]
fn inherit_prefixes_each_line_with_the_name() {
    let mut sb = Sandbox::new();
    let a = sb.script(
        "a.sh",
        "printf 'hal'; sleep 0.2; printf 'f\\n'\n\
         i=0; while [ $i -lt 500 ]; do echo \"a-line-$i-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"; i=$((i+1)); done\n\
         head -c 5000 /dev/zero | tr '\\0' x; echo\n\
         echo oops >&2\necho a-done\nexec sleep 1000",
    );
    let b = sb.script(
        "b.sh",
        "i=0; while [ $i -lt 500 ]; do echo \"b-line-$i-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb\"; i=$((i+1)); done\n\
         echo b-done\nexec sleep 1000",
    );
    sb.config(&format!(
        "[service.a]\ncommand = [\"{a}\"]\nlog = \"inherit\"\n\
         [service.b]\ncommand = [\"{b}\"]\nlog = \"inherit\"\n"
    ));
    start_split(&mut sb);
    let out = wait_file(&sb.path("stdout"), |t| {
        t.contains("a: a-done\n") && t.contains("b: b-done\n")
    });
    for l in out.lines() {
        assert!(
            l.starts_with("a: ") || l.starts_with("b: "),
            "a line without its service's name: {l:?}"
        );
    }
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.contains(&"a: half"), "{out}");
    for i in 0..500 {
        let want_a = format!("a: a-line-{i}-{}", "a".repeat(32));
        let want_b = format!("b: b-line-{i}-{}", "b".repeat(32));
        assert!(lines.contains(&want_a.as_str()), "missing {want_a}");
        assert!(lines.contains(&want_b.as_str()), "missing {want_b}");
    }
    let xs: Vec<&&str> = lines.iter().filter(|l| l.starts_with("a: x")).collect();
    assert!(xs.len() >= 2, "the long line is cut into pieces");
    let total: usize = xs.iter().map(|l| l.len() - 3).sum();
    assert_eq!(total, 5000);
    assert!(
        !out.contains("oops"),
        "stderr kept apart goes to supd's stderr"
    );
    let err = wait_file(&sb.path("supd.stderr"), |t| t.contains("a: oops\n"));
    assert!(!err.contains("a: a-line"), "stdout lines stay on stdout");
    // Captured: `log` shows them too.
    let tail = ok(&sb.supctl(&["log", "a", "-n", "2"]));
    assert!(
        tail.contains(" [stderr] oops") && tail.contains(" a-done"),
        "{tail}"
    );
}

/// `log_stderr = "marked"` (the default): stderr lines carry `[stderr]` after the stamp
/// in the file, and `log --stderr` shows only them; "merged": both streams alike, and
/// `log --stderr` says they are not kept apart.
#[test]
fn stderr_marked_or_merged() {
    let mut sb = Sandbox::new();
    let body = "echo to-out; echo to-err >&2; echo done; exec sleep 1000";
    let m = sb.script("m.sh", body);
    sb.config(&format!(
        "[service.marked]\ncommand = [\"{m}\"]\n\
         [service.merged]\ncommand = [\"{m}\"]\nlog_stderr = \"merged\"\n"
    ));
    sb.start();
    let marked = wait_file(&sb.path("log/marked.log"), |t| {
        t.contains(" to-err\n") && t.contains(" done\n")
    });
    let merged = wait_file(&sb.path("log/merged.log"), |t| {
        t.contains(" to-err\n") && t.contains(" done\n")
    });
    let line = |text: &str, what: &str| -> String {
        text.lines()
            .find(|l| l.ends_with(what))
            .expect("the line")
            .to_string()
    };
    let err = line(&marked, " to-err");
    assert_eq!(err.split(' ').nth(1), Some("[stderr]"), "{marked}");
    assert_eq!(line(&marked, " to-out").split(' ').nth(1), Some("to-out"));
    assert_eq!(line(&merged, " to-err").split(' ').nth(1), Some("to-err"));
    assert!(!merged.contains("[stderr]"), "{merged}");
    // `log --stderr`: the stderr lines only.
    let only = ok(&sb.supctl(&["log", "marked", "--stderr"]));
    assert_eq!(only.lines().count(), 1, "{only}");
    assert!(only.ends_with(" [stderr] to-err\n"), "{only}");
    let both = ok(&sb.supctl(&["log", "marked"]));
    let output = both.lines().filter(|l| !l.contains(" --- started: "));
    assert_eq!(output.count(), 3, "{both}");
    let refused = sb.supctl(&["log", "merged", "--stderr"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("merged"),
        "{refused:?}"
    );
}

/// Log files, rotated ones, a log_dir supd makes, and supd's own log file belong to
/// `socket_group` (mode 0640, the directory 0750), so its members can read them.
#[test]
fn log_files_belong_to_the_socket_group() {
    if !is_root() {
        eprintln!("skipped: needs root to give files a group");
        return;
    }
    let daemon = nix::unistd::Group::from_name("daemon")
        .expect("group db")
        .expect("a group named daemon")
        .gid
        .as_raw();
    let mut sb = Sandbox::new();
    let talk = sb.script(
        "talk.sh",
        "i=0; while [ $i -lt 40 ]; do echo \"line $i ..........................\"; i=$((i+1)); done\n\
         echo done\nexec sleep 1000",
    );
    sb.config(&format!(
        "[service.talk]\ncommand = [\"{talk}\"]\nlog_max_size = \"1KiB\"\nlog_keep = 2\n"
    ));
    // A log_dir that does not exist yet, and the group.
    let cfg = std::fs::read_to_string(sb.path("sup.toml")).expect("config");
    let cfg = cfg.replace(
        "log_dir = \"log\"",
        "log_dir = \"newlog\"\nsocket_group = \"daemon\"\nlog_file = \"newlog/supd.log\"",
    );
    std::fs::write(sb.path("sup.toml"), cfg).expect("config");
    sb.start();
    let dir = sb.path("newlog");
    wait_exists(&dir);
    wait_file(&dir.join("talk.log"), |t| t.contains(" done\n"));
    wait_file(&dir.join("supd.log"), |t| t.contains(" serving "));
    let meta = std::fs::metadata(&dir).expect("meta");
    assert_eq!(meta.gid(), daemon, "log_dir's group");
    assert_eq!(meta.permissions().mode() & 0o777, 0o750, "log_dir's mode");
    for f in ["talk.log", "talk.log.1", "supd.log"] {
        let meta = std::fs::metadata(dir.join(f)).expect(f);
        assert_eq!(meta.gid(), daemon, "{f}'s group");
        assert_eq!(meta.mode() & 0o777, 0o640, "{f}'s mode");
    }
}

/// `reexec` hands over a service's stderr pipe: its stderr lines after the exec are
/// still read, and still marked.
#[test]
fn stderr_apart_is_kept_across_reexec() {
    let mut sb = Sandbox::new();
    common::talk::start_talk(&mut sb, " >&2");
    let log = sb.path("log/talk.log");
    wait_file(&log, |t| t.contains(" [stderr] first\n"));
    ok(&sb.supctl(&["reexec"]));
    common::talk::say(&sb, "after");
    wait_file(&log, |t| t.contains(" [stderr] said after\n"));
    let only = ok(&sb.supctl(&["log", "talk", "--stderr"]));
    assert!(
        only.contains(" [stderr] first\n") && only.contains(" [stderr] said after\n"),
        "{only}"
    );
}
