//! supd never blocks on its own output (issue 23, item 1): its standard error a pipe
//! nobody reads (a stalled journald, a stuck `| logger`), or its `log_file` a FIFO
//! nobody reads, while a read-only client makes it log as fast as it likes, never
//! holds up answers, restarts, `stop` or `start`. What it could not write to stderr is
//! counted and said once stderr is read again, in whole lines.

mod common;
use common::*;
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A service that runs, one that crashes and is restarted at once, one that fails at
/// once and is restarted without delay (supd, logging at debug, says 4 lines of each of
/// its runs: about 170 KB a second, the volume that fills a stderr nobody reads, now
/// that refusals are told at most once a second), and one whose
/// standard error (`log = "inherit"`) the log writer copies to supd's stderr, line by
/// line, as supd writes its own there: the lines must not mix.
const SERVICES: &str = r#"
[service.web]
command = ["/bin/sleep", "3600"]

[service.crasher]
command = ["/bin/sh", "-c", "sleep 0.05; exit 1"]
restart_delay = "20ms"
restart_delay_max = "50ms"
crash_loop = { restarts = 100000, window = "1s" }
log = "null"

[service.noisy]
command = ["/bin/false"]
restart_delay = "0s"
restart_delay_max = "0s"
crash_loop = { restarts = 100000, window = "1s" }
log = "null"

[service.chatter]
command = ["/bin/sh", "-c", "i=0; while :; do i=$((i+1)); echo \"tick $i of a line long enough to be torn if writes were cut\" >&2; sleep 0.005; done"]
log = "inherit"
"#;

/// The helper run as a member of `socket_group` (read-only) by the tests below: sends
/// `SUP_FLOOD_N` `stop` requests on one connection (each refused, and each refusal
/// logged by supd), then reads the answers; reports `FLOOD answered K in MS`.
#[test]
#[ignore = "a helper, run by other tests as another uid"]
fn flood_helper() {
    let Ok(socket) = std::env::var("SUP_FLOOD_SOCKET") else {
        return;
    };
    let n: usize = std::env::var("SUP_FLOOD_N").expect("N").parse().expect("N");
    let start = Instant::now();
    let mut c = UnixStream::connect(&socket).expect("connect");
    // A deadline per batch: a supd blocked on its stderr answers no batch, and fails in
    // 15 s; a loaded machine may take long over all of them.
    let mut end = start + Duration::from_secs(15);
    c.set_write_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let mut reader = BufReader::new(c.try_clone().expect("dup"));
    let mut answered = 0;
    let mut sent = 0;
    // In batches, so that neither side's buffer fills with the other's unread lines.
    while answered < n && Instant::now() < end {
        let batch = (n - sent).min(200);
        let mut out = Vec::new();
        for i in sent..sent + batch {
            out.extend_from_slice(
                format!("{}\n", json!({"id": i, "cmd": "stop", "service": "web"})).as_bytes(),
            );
        }
        if c.write_all(&out).is_err() {
            break;
        }
        sent += batch;
        while answered < sent {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            reader
                .get_ref()
                .set_read_timeout(Some(left))
                .expect("timeout");
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(k) if k > 0 => {
                    assert!(line.contains("may only read"), "not a refusal: {line}");
                    answered += 1;
                }
                _ => break,
            }
        }
        if answered < sent {
            break;
        }
        end = Instant::now() + Duration::from_secs(15);
    }
    println!(
        "FLOOD answered {answered} in {}",
        start.elapsed().as_millis()
    );
}

/// Runs `flood_helper` as a member of `daemon` (supd's `socket_group`): `n` refused
/// requests; returns how many were answered, and how long that took.
fn flood(sb: &Sandbox, n: usize) -> (usize, Duration) {
    let daemon = nix::unistd::Group::from_name("daemon")
        .expect("lookup")
        .expect("group daemon")
        .gid
        .as_raw();
    let me = std::env::current_exe().expect("test binary");
    let out = Command::new("setpriv")
        .args([
            "--reuid=65530",
            &format!("--regid={daemon}"),
            "--clear-groups",
        ])
        .arg(me)
        .args(["--ignored", "--exact", "flood_helper", "--nocapture"])
        .env("SUP_FLOOD_SOCKET", &sb.socket)
        .env("SUP_FLOOD_N", n.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("setpriv helper");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("FLOOD answered "))
        .unwrap_or_else(|| panic!("the helper said nothing: {text}"));
    let (k, ms) = line.split_once(" in ").expect("K in MS");
    (
        k.parse().expect("K"),
        Duration::from_millis(ms.trim().parse().expect("MS")),
    )
}

/// A pipe whose write end is to be supd's stderr and whose read end the test holds
/// and does not read.
fn unread_pipe() -> (OwnedFd, OwnedFd) {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe")
}

/// supd still answers, restarts and serves `stop` and `start`, each well within the
/// deadline.
fn still_serves(sb: &Sandbox) {
    let t = Instant::now();
    let before = sb.status("crasher")["restarts"].as_u64().expect("restarts");
    let took = t.elapsed();
    // A blocked supd never answers (the client gives up at DEADLINE); this is room for a
    // loaded machine.
    assert!(took < DEADLINE / 2, "status took {took:?}");
    // The crashing service is restarted on (each run lasts 50 ms).
    let mut w = sb.watch();
    for _ in 0..3 {
        w.until(sb, |e| {
            e["event"] == "state" && e["service"] == "crasher" && e["to"] == "running"
        });
    }
    let after = sb.status("crasher")["restarts"].as_u64().expect("restarts");
    assert!(after > before, "crasher restarts {before} -> {after}");
    for cmd in ["stop", "start"] {
        let t = Instant::now();
        let out = sb.supctl(&[cmd, "web"]);
        let took = t.elapsed();
        assert!(
            out.status.success(),
            "supctl {cmd} web: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(took < DEADLINE / 2, "supctl {cmd} took {took:?}");
    }
}

/// Reads the pipe (non-blocking) into `got` until `until` holds of it, at most for the
/// deadline.
fn read_for(rd: &OwnedFd, got: &mut Vec<u8>, until: impl Fn(&[u8]) -> bool) {
    let end = Instant::now() + DEADLINE;
    let mut f = std::fs::File::from(rd.try_clone().expect("dup"));
    let mut buf = vec![0u8; 65536];
    while !until(got) {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let _ = poll(
            &mut [PollFd::new(rd.as_fd(), PollFlags::POLLIN)],
            PollTimeout::from(ms.min(200)),
        );
        match f.read(&mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("reading supd's stderr: {e}"),
        }
    }
}

/// Whether `line` is one whole line of supd's (`[STAMP LEVEL] text`, one stamp only)
/// or of the chatter's (`chatter: tick N of ...`, once).
fn whole(line: &str) -> bool {
    const TICK: &str = " of a line long enough to be torn if writes were cut";
    if let Some(rest) = line.strip_prefix("chatter: tick ") {
        return rest
            .strip_suffix(TICK)
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
    }
    let Some(rest) = line.strip_prefix('[') else {
        return false;
    };
    let b = rest.as_bytes();
    let level = rest.get(21..26).unwrap_or("");
    let stamp_ok = b.len() > 28
        && b[4] == b'-'
        && b[10] == b'T'
        && b[19] == b'Z'
        && b[20] == b' '
        && ["ERROR", "WARN ", "INFO ", "DEBUG", "TRACE"].contains(&level)
        && b[26] == b']';
    // A second stamp or a chatter line inside: two lines mixed.
    let text = rest.get(27..).unwrap_or("");
    let mixed = text.contains("chatter: tick")
        || ["Z ERROR]", "Z WARN ]", "Z INFO ]", "Z DEBUG]"]
            .iter()
            .any(|s| text.contains(s));
    stamp_ok && !mixed
}

// see: issue 23 item 1 — supd wrote its messages to fd 2 with blocking writes: a
// stderr pipe nobody read froze its loop (no answers, no restarts), and a read-only
// client produced the volume at will (every refusal is logged).
#[test]
fn a_stderr_nobody_reads_blocks_neither_answers_nor_restarts() {
    if !is_root() {
        eprintln!("skipped: needs root (setpriv to another uid)");
        return;
    }
    let (rd, wr) = unread_pipe();
    unread_stderr(rd, wr);
}

// The same with stderr a stream socket nobody reads (journald's stdout stream when
// journald stalls): supd sends with MSG_DONTWAIT.
#[test]
fn a_stderr_socket_nobody_reads_blocks_neither_answers_nor_restarts() {
    if !is_root() {
        eprintln!("skipped: needs root (setpriv to another uid)");
        return;
    }
    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
    let (rd, wr) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .expect("socketpair");
    nix::sys::socket::shutdown(rd.as_raw_fd(), nix::sys::socket::Shutdown::Write)
        .expect("shutdown");
    unread_stderr(rd, wr);
}

/// supd's stderr is `wr`, whose other end `rd` the test holds and does not read while a
/// read-only client floods supd with refused requests; then it reads `rd`.
fn unread_stderr(rd: OwnedFd, wr: OwnedFd) {
    let mut sb = Sandbox::new();
    sb.config_with("socket_group = \"daemon\"", SERVICES);
    // Dropped before the sandbox: a supd blocked on stderr gets EPIPE and can be ended.
    let rd = Guard(rd);
    sb.start_with_stderr(Command::new(SUPD), &["-c"], Some(wr));
    sb.wait_state("web", "running");
    // 2000 refusals of ~150 bytes: 300 KiB, the 64 KiB pipe (or the socket's buffers,
    // about 200 KiB) surely full.
    let (answered, took) = flood(&sb, 2000);
    assert_eq!(
        answered, 2000,
        "a read-only client's refused requests went unanswered after {took:?}: supd is blocked on its stderr"
    );
    eprintln!("2000 refused requests answered in {took:?}");
    // noisy's runs have logged past the pipe and supd's queue (1,000 runs: 250 KB).
    noisy_runs(&sb, 1000);
    still_serves(&sb);
    // Someone reads again: what waited comes out, then the count of what was lost.
    nix::fcntl::fcntl(&rd.0, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).expect("fcntl");
    let mut got = Vec::new();
    read_for(&rd.0, &mut got, |g| {
        String::from_utf8_lossy(g).contains("were lost: it was not being read\n")
    });
    let text = String::from_utf8_lossy(&got).into_owned();
    let notice = text
        .lines()
        .find(|l| l.contains("messages to stderr were lost: it was not being read"))
        .unwrap_or_else(|| {
            panic!(
                "no notice of the lost messages in {} bytes read; the last lines:\n{}",
                text.len(),
                text.lines().rev().take(5).collect::<Vec<_>>().join("\n")
            )
        });
    let n: u64 = notice
        .split("] ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {notice:?}"));
    assert!(n > 0, "{notice}");
    // Whole lines only: every complete line is one of supd's or one of the chatter's.
    let complete = &text[..text.rfind('\n').expect("a line") + 1];
    let torn: Vec<&str> = complete.lines().filter(|l| !whole(l)).collect();
    assert!(torn.is_empty(), "torn or mixed lines: {torn:#?}");
    let refusals = complete.matches("refused 'stop'").count();
    let chatter = complete.matches("chatter: tick").count();
    let noisy = complete.matches("noisy: ").count();
    assert!(noisy > 100, "only {noisy} of noisy's lines shown");
    eprintln!(
        "read {} lines, {refusals} refusals, {noisy} of noisy's, {chatter} of the chatter's, then: {notice}",
        complete.lines().count()
    );
}

/// Waits until `noisy` has been restarted `n` times, counting on the watch stream:
/// each event must come within the harness's deadline of the one before (a supd blocked
/// on its output sends none), however long the whole count takes on a loaded machine.
/// Events are not kept: thousands of them would only bury a failure's message.
fn noisy_runs(sb: &Sandbox, n: u64) {
    let mut seen = sb.status("noisy")["restarts"].as_u64().unwrap_or(0);
    if seen >= n {
        return;
    }
    let mut w = sb.watch();
    while seen < n {
        let Some(e) = w.next_within(DEADLINE) else {
            panic!(
                "no event for {DEADLINE:?} after {seen} of {n} restarts of noisy: supd is blocked\n{}",
                sb.supd_log()
            );
        };
        w.seen.clear();
        if e["event"] == "state" && e["service"] == "noisy" && e["to"] == "starting" {
            seen += 1;
        }
    }
}

/// An fd dropped first (declared after the sandbox).
struct Guard(OwnedFd);

// see: issue 23 item 1 — `[supd] log_file` goes through the log writer: a log file
// that hangs (a FIFO opened by a reader that never reads) must not block supd either.
#[test]
fn a_hung_own_log_file_blocks_neither_answers_nor_restarts() {
    if !is_root() {
        eprintln!("skipped: needs root (setpriv to another uid)");
        return;
    }
    let mut sb = Sandbox::new();
    let fifo = sb.path("supd.log");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    // A reader that never reads: the writer's open succeeds, its writes block once the
    // FIFO holds 64 KiB.
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("open the FIFO");
    sb.config_with(
        &format!(
            "socket_group = \"daemon\"\nlog_file = \"{}\"",
            fifo.display()
        ),
        SERVICES,
    );
    sb.start();
    sb.wait_state("web", "running");
    // 8,000 runs of noisy: 2 MiB of log file lines, past the FIFO, the writer's socket
    // (1 MiB) and supd's queue for it (256 KiB); meanwhile 20,000 refused requests.
    let (answered, took) = flood(&sb, 20_000);
    noisy_runs(&sb, 8000);
    assert_eq!(
        answered, 20_000,
        "refused requests went unanswered after {took:?}: supd is blocked on its log file"
    );
    eprintln!("20000 refused requests answered in {took:?}");
    still_serves(&sb);
}
