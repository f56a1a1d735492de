//! Log files never block supd (issue 10, item 5): they are written by a log-writer
//! process, so a log disk that hangs stalls that process alone; it is started again when
//! it dies, kept across `reexec`, and catches up when the disk comes back.

mod common;
use common::files::wait_file;
use common::*;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// `status` on a fresh connection; how long the answer took. A supd that does not answer
/// within the deadline fails the test (instead of hanging it).
fn timed_status(sb: &Sandbox) -> (Value, Duration) {
    let begun = Instant::now();
    let mut s = UnixStream::connect(&sb.socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s.write_all(b"{\"cmd\":\"status\",\"id\":1}\n")
        .expect("send");
    let mut line = String::new();
    let read = BufReader::new(s).read_line(&mut line);
    let took = begun.elapsed();
    assert!(
        matches!(read, Ok(n) if n > 0),
        "status got no answer within {took:?} ({read:?}): supd is blocked\n{}",
        sb.supd_log()
    );
    (serde_json::from_str(&line).expect("status JSON"), took)
}

/// The log writer of this sandbox's supd.
fn writers(sb: &Sandbox) -> Vec<i32> {
    let supd = sb.supd_pid().to_string();
    processes_with_cmdline(&["/proc/self/exe", "--log-writer", &supd])
}

/// Reads the FIFO `path` (opening it lets a writer blocked on it go on) until what was
/// read satisfies `pred`.
fn read_fifo_until(path: &std::path::Path, pred: impl Fn(&str) -> bool) -> String {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .expect("open the FIFO for reading");
    let end = Instant::now() + DEADLINE;
    let mut got = Vec::new();
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if pred(&text) {
            return text;
        }
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "the FIFO gave only {text:?}");
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let _ = poll(
            &mut [PollFd::new(f.as_fd(), PollFlags::POLLIN)],
            PollTimeout::from(ms),
        );
        let mut buf = [0u8; 4096];
        match f.read(&mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("reading the FIFO: {e}"),
        }
    }
}

/// A log file that is a FIFO nobody reads stands in for a hung NFS `log_dir`: opening it
/// for writing blocks. supd used to open it itself and froze in `openat`. Now the writer
/// blocks alone: `status` answers at once and a crashing service is restarted every
/// 10 ms throughout, and once the FIFO is read the writer catches up.
#[test]
fn a_hung_log_file_blocks_neither_answers_nor_restarts() {
    let mut sb = Sandbox::new();
    std::fs::create_dir_all(sb.path("log")).expect("mkdir");
    let fifo = sb.path("log/stuck.log");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    // `stuck` is ready once its line is written, so that line reaches the writer (which
    // then hangs opening the FIFO) before `crash` starts.
    sb.config(
        r#"
[service.stuck]
command = ["/bin/sh", "-c", "echo hello from stuck; echo >&3; exec /bin/sleep 3600"]
ready = "fd:3"

[service.crash]
command = ["/bin/sh", "-c", "echo crashing; exit 1"]
after = ["stuck"]
restart_delay = "10ms"
restart_delay_max = "10ms"
crash_loop = { restarts = 100000, window = "1s" }
"#,
    );
    sb.start();
    let mut w = sb.watch();
    let restarts = 30;
    let begun = Instant::now();
    let mut times = Vec::new();
    for _ in 0..restarts {
        w.state(&sb, "crash", "running");
        let (a, took) = timed_status(&sb);
        assert_eq!(a["ok"], true, "{a}");
        times.push(took);
    }
    let longest = times.iter().max().copied().unwrap_or_default();
    let window = begun.elapsed();
    eprintln!(
        "{restarts} restarts in {window:?} while the log file hung; longest status answer {longest:?}"
    );
    // A supd blocked opening the FIFO answers none (timed_status gives up after 5 s); a
    // loaded machine delays a few.
    let slow = times
        .iter()
        .filter(|t| **t > Duration::from_millis(500))
        .count();
    assert!(
        slow <= 3,
        "{slow} of {restarts} status answers took over 500 ms while the log file hung: {times:?}"
    );
    // 30 restarts 10 ms apart: a blocked supd makes none; generous for a loaded machine.
    assert!(
        window < Duration::from_secs(30),
        "{restarts} restarts took {window:?}"
    );
    // The writer was hung all along: nothing of crash's reached its file.
    let crash_log = sb.path("log/crash.log");
    assert_eq!(
        std::fs::read_to_string(&crash_log).unwrap_or_default(),
        "",
        "the writer was not blocked on the FIFO"
    );
    // The disk comes back: the writer writes what waited.
    let got = read_fifo_until(&fifo, |t| t.contains("hello from stuck\n"));
    assert!(got.ends_with(" hello from stuck\n"), "{got:?}");
    // Each run's line between the markers of its start and exit.
    let output = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.contains(" --- started: ") && !l.contains(" --- exited: "))
            .map(str::to_string)
            .collect()
    };
    let text = wait_file(&crash_log, |t| output(t).len() >= restarts);
    assert!(
        output(&text).iter().all(|l| l.ends_with(" crashing")),
        "{text}"
    );
    let st = sb.ok(json!({"cmd": "status", "service": "crash"}))["services"][0].clone();
    assert_eq!(st["log_dropped"], 0, "{st}");
}

/// A writer that dies is started again at the next line, and the lines after go to the
/// file.
#[test]
fn a_killed_log_writer_is_started_again() {
    let mut sb = Sandbox::new();
    common::talk::start_talk(&mut sb, "");
    let log = sb.path("log/talk.log");
    wait_file(&log, |t| t.contains(" first\n"));
    let old = writers(&sb);
    assert_eq!(old.len(), 1, "one log writer: {old:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old[0]),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the writer");
    wait_exit(old[0], DEADLINE).expect("the writer is gone");
    common::talk::say(&sb, "again");
    wait_file(&log, |t| t.contains(" said again\n"));
    let new = writers(&sb);
    assert_eq!(new.len(), 1, "one log writer: {new:?}");
    assert_ne!(new, old);
}

/// `reexec` keeps the writer (its pipe is handed over): the same process writes the
/// lines after, and no second one starts.
#[test]
fn the_log_writer_is_kept_across_reexec() {
    let mut sb = Sandbox::new();
    common::talk::start_talk(&mut sb, "");
    let log = sb.path("log/talk.log");
    wait_file(&log, |t| t.contains(" first\n"));
    let before = writers(&sb);
    assert_eq!(before.len(), 1, "one log writer: {before:?}");
    let out = sb.supctl(&["reexec"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    common::talk::say(&sb, "after");
    wait_file(&log, |t| t.contains(" said after\n"));
    assert_eq!(writers(&sb), before, "the same writer, and only it");
    // supd ends: so does its writer.
    let writer = before[0];
    sb.stop_supd(nix::sys::signal::Signal::SIGTERM);
    wait_exit(writer, DEADLINE).expect("the writer ends with supd");
}
