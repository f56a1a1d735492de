//! Logging for the daemons: `log` + `env_logger` to stderr, the level from `SUP_LOG`
//! (or `RUST_LOG`), `info` by default.
//!
//! supd itself never waits for its stderr ([`stderr`]): its messages are written when
//! fd 2 takes them without waiting, else kept in a bounded queue that the loop writes
//! when fd 2 has room (`POLLOUT`); what does not fit is counted and said once stderr is
//! read again. The one-shot programs (`supd --check`, supctl, sup-lease, the log writer)
//! write with plain blocking writes.
//!
//! supd also keeps what it logs, as stamped lines, for its own log file (`[supd]
//! log_file`): the loop takes them ([`take_kept`]) at each turn and hands them to the
//! log writer, like a service's output, so a full or hung disk never blocks supd. Only
//! a bounded number of lines wait; past that they are counted and said in the file.

use std::collections::VecDeque;
use std::sync::{Mutex, TryLockError};

mod stderr;
pub use stderr::Waiting;

/// Lines (and their bytes) kept between two turns of the loop, at most.
const KEPT_LINES: usize = 10_000;
const KEPT_BYTES: usize = 1 << 20;

/// supd's messages waiting for its log file.
struct Kept {
    lines: VecDeque<String>,
    bytes: usize,
    /// Messages not kept since the last take (more than fit).
    lost: u64,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept {
    lines: VecDeque::new(),
    bytes: 0,
    lost: 0,
});

/// supd's stderr, once `init_supd` set it up (the others write through env_logger).
static STDERR: Mutex<Option<stderr::Stderr>> = Mutex::new(None);

fn builder() -> env_logger::Builder {
    let level = std::env::var("SUP_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".into());
    let mut b = env_logger::Builder::new();
    b.parse_filters(&level).format(|buf, record| {
        use std::io::Write;
        write!(buf, "{}", stderr_text(record.level(), record.args()))
    });
    b
}

/// A message as stderr shows it: "[2026-11-29T17:20:01Z INFO ] text\n", as env_logger
/// did (its own stamp panics past the year 9999, a clock set wrong: ours writes any).
fn stderr_text(level: log::Level, args: impl std::fmt::Display) -> String {
    let stamp = crate::time::utc_stamp(std::time::SystemTime::now());
    let secs = stamp.get(..stamp.len().saturating_sub(5)).unwrap_or(&stamp);
    format!("[{secs}Z {level:<5}] {args}\n")
}

/// The notice of messages stderr did not take.
fn lost_notice(n: u64) -> String {
    stderr_text(
        log::Level::Warn,
        format_args!("{n} messages to stderr were lost: it was not being read"),
    )
}

/// supd's stderr, unless the lock is held further up this very call (a panic in the
/// logger): then the message is let go rather than deadlocking.
fn with_stderr(f: impl FnOnce(&mut stderr::Stderr)) {
    let mut guard = match STDERR.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(e)) => e.into_inner(),
        Err(TryLockError::WouldBlock) => return,
    };
    if let Some(s) = guard.as_mut() {
        f(s);
    }
}

/// The fd the loop polls for room (`POLLOUT`) while supd's messages wait for stderr.
pub fn stderr_waiting() -> Option<Waiting> {
    let mut w = None;
    with_stderr(|s| w = s.waiting());
    w
}

/// stderr has room: writes what waits, as far as it goes without waiting.
pub fn flush_stderr() {
    with_stderr(|s| s.write_some(lost_notice));
}

/// At exit: writes what waits for stderr, waiting for room up to `bound` in all.
pub fn finish_stderr(bound: std::time::Duration) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let end = std::time::Instant::now() + bound;
    loop {
        flush_stderr();
        let Some(w) = stderr_waiting() else {
            return;
        };
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        let ms = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(
            std::os::fd::AsFd::as_fd(&w),
            PollFlags::POLLOUT,
        )];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// Sets the logger up once, first thing in `main`: stderr only.
pub fn init() {
    builder().init();
}

/// supd's logger: stderr, never waited for, and every message also kept for its log
/// file. A panic's message goes the same way (the default hook writes stderr and waits).
pub fn init_supd() {
    let inner = builder().build();
    log::set_max_level(inner.filter());
    *STDERR.lock().unwrap_or_else(|e| e.into_inner()) = Some(stderr::Stderr::new());
    // Only fails when a logger is set already: then that one stays.
    let _ = log::set_boxed_logger(Box::new(Tee { inner }));
    std::panic::set_hook(Box::new(|info| {
        let trace = std::backtrace::Backtrace::capture();
        match trace.status() {
            std::backtrace::BacktraceStatus::Captured => log::error!("{info}\n{trace}"),
            _ => log::error!("{info}"),
        }
    }));
}

/// The messages logged since the last call, as log file lines (`STAMP LEVEL text`).
pub fn take_kept() -> Vec<String> {
    let mut k = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    let mut lines: Vec<String> = std::mem::take(&mut k.lines).into();
    k.bytes = 0;
    if k.lost > 0 {
        let stamp = crate::time::utc_stamp(std::time::SystemTime::now());
        lines.push(format!(
            "{stamp} WARN  {} messages were logged faster than they could be kept here",
            k.lost
        ));
        k.lost = 0;
    }
    lines
}

/// The log file's lines of one message: each of its lines stamped, with its level.
pub fn file_lines(stamp: &str, level: log::Level, text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text
        .lines()
        .map(|l| format!("{stamp} {level:<5} {l}"))
        .collect();
    if lines.is_empty() {
        lines.push(format!("{stamp} {level:<5}"));
    }
    lines
}

struct Tee {
    inner: env_logger::Logger,
}

impl log::Log for Tee {
    fn enabled(&self, m: &log::Metadata) -> bool {
        self.inner.enabled(m)
    }

    fn log(&self, r: &log::Record) {
        if !self.inner.matches(r) {
            return;
        }
        let text = stderr_text(r.level(), r.args());
        with_stderr(|s| {
            s.queue.push(stderr::records(&text));
            s.write_some(lost_notice);
        });
        let stamp = crate::time::utc_stamp(std::time::SystemTime::now());
        let lines = file_lines(&stamp, r.level(), &r.args().to_string());
        let mut k = KEPT.lock().unwrap_or_else(|e| e.into_inner());
        for l in lines {
            if k.lines.len() >= KEPT_LINES || k.bytes + l.len() > KEPT_BYTES {
                k.lost += 1;
                continue;
            }
            k.bytes += l.len();
            k.lines.push_back(l);
        }
    }

    fn flush(&self) {
        flush_stderr()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_is_stamped_line_by_line() {
        let got = file_lines(
            "2024-05-01T10:00:00.000Z",
            log::Level::Warn,
            "web: crash loop\nsecond",
        );
        assert_eq!(
            got,
            [
                "2024-05-01T10:00:00.000Z WARN  web: crash loop",
                "2024-05-01T10:00:00.000Z WARN  second"
            ]
        );
    }
}
