//! Logging for the daemons: `log` + `env_logger` to stderr, the level from `SUP_LOG`
//! (or `RUST_LOG`), `info` by default.
//!
//! supd also keeps what it logs, as stamped lines, for its own log file (`[supd]
//! log_file`): the loop takes them ([`take_kept`]) at each turn and hands them to the
//! log writer, like a service's output, so a full or hung disk never blocks supd. Only
//! a bounded number of lines wait; past that they are counted and said in the file.

use std::collections::VecDeque;
use std::sync::Mutex;

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

fn builder() -> env_logger::Builder {
    let level = std::env::var("SUP_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| "info".into());
    let mut b = env_logger::Builder::new();
    b.parse_filters(&level).format(|buf, record| {
        use std::io::Write;
        // env_logger's own stamp panics past the year 9999 (a clock set wrong): ours
        // writes any year. "[2026-11-29T17:20:01Z INFO ] text", as env_logger did.
        let stamp = crate::time::utc_stamp(std::time::SystemTime::now());
        let secs = stamp.get(..stamp.len().saturating_sub(5)).unwrap_or(&stamp);
        writeln!(buf, "[{secs}Z {:<5}] {}", record.level(), record.args())
    });
    b
}

/// Sets the logger up once, first thing in `main`: stderr only.
pub fn init() {
    builder().init();
}

/// supd's logger: stderr, and every message also kept for its log file.
pub fn init_supd() {
    let inner = builder().build();
    log::set_max_level(inner.filter());
    // Only fails when a logger is set already: then that one stays.
    let _ = log::set_boxed_logger(Box::new(Tee { inner }));
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
        self.inner.log(r);
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
        self.inner.flush()
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
