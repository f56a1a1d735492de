//! The log writer: one helper process that writes every service's log file, so that a
//! slow or hung log disk (an NFS `log_dir` that hangs, a `NAME.log` that is a FIFO nobody
//! reads) blocks that process alone and never supd. s6 and runit log through processes
//! of their own for the same reason.
//!
//! supd keeps reading every output pipe in its loop (the ring for `log -n` and `log -f`
//! stays in supd) and hands each batch of finished lines to the writer as one frame, over
//! a pipe whose supd end is non-blocking. What the pipe does not take waits in a small
//! bounded queue; past that, lines are dropped and counted (`log_dropped`), never waited
//! for. The writer is supd's own program image (`/proc/self/exe --log-writer PPID`),
//! started at the first line to write and again whenever it is gone (after a delay if it
//! died young). It ends with supd: end-of-file on its pipe when supd exits (supd gives it
//! a second to write what it has), its parent-death signal when supd is killed. It reports
//! the lines it could not write (`dropped NAME N` lines on its stdout), which supd adds
//! to the service's count. Its pipes and queue are handed over across `reexec`.
//!
//! A frame, little-endian: `u32` length of the rest, `u16` + service name, `u16` + path,
//! `u64` max size, `u32` files kept, `u32` line count, then the lines, each ending in a
//! newline. A frame carries its file's settings, so a new writer needs no other state and
//! a reload's new `log_dir` or rotation settings apply from the next line on.

use crate::logs::LogFile;
use crate::time::Mono;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The argument that makes supd a log writer.
pub const ARG: &str = "--log-writer";
/// The frame format. A writer handed over by an image that speaks another is let go.
pub const FORMAT: u32 = 1;
/// Bytes of frames queued in supd while the pipe is full (beyond the pipe itself).
const QUEUE_MAX: usize = 256 * 1024;
/// The pipe size asked for (the kernel's default is 64 KiB): a short stall of the disk
/// then costs no line.
const PIPE_SIZE: i32 = 1 << 20;
/// The largest frame a writer accepts; a longer length means a corrupt stream.
const FRAME_MAX: usize = 64 << 20;
/// A writer that could not start, or died again within `STABLE` of its start, is started
/// again only after a delay, doubling up to `RESTART_MAX`.
const RESTART_FIRST: Duration = Duration::from_millis(100);
const RESTART_MAX: Duration = Duration::from_secs(30);
const STABLE: Duration = Duration::from_secs(1);
/// How long an exiting supd lets the writer finish what it was given.
const FINISH: Duration = Duration::from_secs(1);

/// One batch of a service's lines for its log file.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    pub service: String,
    pub path: PathBuf,
    pub max_size: u64,
    pub keep: u32,
    pub lines: u32,
    /// The lines, each ending in a newline.
    pub text: Vec<u8>,
}

/// The frame of `lines` of `service`, to be appended to `path`.
pub fn encode(service: &str, path: &Path, max_size: u64, keep: u32, lines: &[String]) -> Vec<u8> {
    let text: usize = lines.iter().map(|l| l.len() + 1).sum();
    let mut b = Vec::with_capacity(40 + service.len() + path.as_os_str().len() + text);
    b.extend_from_slice(&[0; 4]);
    counted(&mut b, service.as_bytes());
    counted(&mut b, path.as_os_str().as_bytes());
    b.extend_from_slice(&max_size.to_le_bytes());
    b.extend_from_slice(&keep.to_le_bytes());
    b.extend_from_slice(&(lines.len() as u32).to_le_bytes());
    for l in lines {
        b.extend_from_slice(l.as_bytes());
        b.push(b'\n');
    }
    let len = (b.len() - 4) as u32;
    b[..4].copy_from_slice(&len.to_le_bytes());
    b
}

fn counted(b: &mut Vec<u8>, s: &[u8]) {
    let s = &s[..s.len().min(u16::MAX as usize)];
    b.extend_from_slice(&(s.len() as u16).to_le_bytes());
    b.extend_from_slice(s);
}

/// Splits the writer's input into frames.
#[derive(Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole frame, if one is there; an error when the stream is corrupt.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, String> {
        let Some(len) = self.buf.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if len > FRAME_MAX {
            return Err(format!("a frame of {len} bytes"));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let body: Vec<u8> = self.buf.drain(..4 + len).skip(4).collect();
        parse(&body).map(Some)
    }
}

fn parse(b: &[u8]) -> Result<Frame, String> {
    let mut r = Reader { b, at: 0 };
    let service = r.counted()?;
    let service = String::from_utf8(service.to_vec()).map_err(|_| "a service name not in UTF-8")?;
    let path = PathBuf::from(OsStr::from_bytes(r.counted()?));
    let max_size = r.int(8)?;
    let keep = r.int(4)? as u32;
    let lines = r.int(4)? as u32;
    Ok(Frame {
        service,
        path,
        max_size,
        keep,
        lines,
        text: b[r.at..].to_vec(),
    })
}

/// Reads the fields of a frame's body in order.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let s = self
            .b
            .get(self.at..self.at + n)
            .ok_or("a truncated frame")?;
        self.at += n;
        Ok(s)
    }

    /// A little-endian integer of `n` bytes (at most 8).
    fn int(&mut self, n: usize) -> Result<u64, String> {
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(self.take(n)?);
        Ok(u64::from_le_bytes(v))
    }

    /// A string of bytes after its `u16` length.
    fn counted(&mut self) -> Result<&'a [u8], String> {
        let n = self.int(2)? as usize;
        self.take(n)
    }
}

/// supd's end of the writer.
pub struct LogWriter {
    /// What to start as the writer when `/proc/self/exe` is not there.
    program: PathBuf,
    link: Option<Link>,
    /// Frames the pipe did not take yet; `sent` bytes of the first are in the pipe.
    queue: VecDeque<Vec<u8>>,
    queued: usize,
    sent: usize,
    /// Lines are being dropped because the writer is behind (said once).
    stalled: bool,
    /// No writer is started before this (the last could not start, or died young).
    retry_at: Option<Mono>,
    delay: Duration,
    /// Why the last start failed (said once).
    failed: Option<String>,
}

/// A running writer.
struct Link {
    pid: i32,
    /// Where frames go (non-blocking).
    to: OwnedFd,
    /// Its reports (non-blocking); end-of-file when it is gone.
    from: OwnedFd,
    started: Mono,
    report: Vec<u8>,
}

/// The writer as handed over across `reexec`.
#[derive(Debug, Serialize, Deserialize)]
pub struct WriterState {
    pub format: u32,
    pub pid: i32,
    pub to_fd: RawFd,
    pub from_fd: RawFd,
    pub started: Mono,
    pub queue: Vec<Vec<u8>>,
    pub sent: usize,
}

impl LogWriter {
    pub fn new(program: PathBuf) -> LogWriter {
        LogWriter {
            program,
            link: None,
            queue: VecDeque::new(),
            queued: 0,
            sent: 0,
            stalled: false,
            retry_at: None,
            delay: Duration::ZERO,
            failed: None,
        }
    }

    /// Hands `lines` of `service` to the writer, for `path`; false when they are dropped
    /// (the writer is behind, or cannot be started). Never waits.
    pub fn send(
        &mut self,
        service: &str,
        path: &Path,
        max_size: u64,
        keep: u32,
        lines: &[String],
        now: Mono,
    ) -> bool {
        if self.link.is_none() && !self.start(now) {
            return false;
        }
        let frame = encode(service, path, max_size, keep, lines);
        if !self.queue.is_empty() && self.queued + frame.len() > QUEUE_MAX {
            if !self.stalled {
                log::warn!("the log writer is behind (a slow or hung log disk?): dropping output lines until it catches up");
                self.stalled = true;
            }
            return false;
        }
        self.queued += frame.len();
        self.queue.push_back(frame);
        if self.queue.len() == 1 {
            self.flush(now);
        }
        true
    }

    /// Writes what the pipe takes of the queue.
    pub fn flush(&mut self, now: Mono) {
        let Some(link) = self.link.as_ref() else {
            return;
        };
        while let Some(front) = self.queue.front() {
            match nix::unistd::write(&link.to, &front[self.sent..]) {
                Ok(n) => {
                    self.sent += n;
                    if self.sent == front.len() {
                        self.queued -= front.len();
                        self.queue.pop_front();
                        self.sent = 0;
                    }
                }
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EAGAIN) => break,
                Err(e) => {
                    log::warn!("the log writer (pid {}) takes no more lines: {e}", link.pid);
                    return self.lost(now);
                }
            }
        }
        if self.queue.is_empty() && self.stalled {
            log::info!("the log writer caught up");
            self.stalled = false;
        }
    }

    /// The fds to poll: its reports, and its pipe while frames wait for room in it.
    pub fn poll_fds(&self) -> Option<(BorrowedFd<'_>, Option<BorrowedFd<'_>>)> {
        let link = self.link.as_ref()?;
        let out = (!self.queue.is_empty()).then(|| link.to.as_fd());
        Some((link.from.as_fd(), out))
    }

    /// Reads the writer's reports: lines it could not write, by service.
    pub fn on_reports(&mut self, now: Mono) -> Vec<(String, u64)> {
        let Some(link) = self.link.as_mut() else {
            return Vec::new();
        };
        let mut buf = [0u8; 4096];
        match nix::unistd::read(&link.from, &mut buf) {
            Ok(0) => {
                log::warn!("the log writer (pid {}) is gone", link.pid);
                self.lost(now);
                return Vec::new();
            }
            Ok(n) => link.report.extend_from_slice(&buf[..n]),
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => return Vec::new(),
            Err(e) => {
                log::warn!("reading the log writer's reports: {e}");
                self.lost(now);
                return Vec::new();
            }
        }
        let mut drops = Vec::new();
        while let Some(end) = link.report.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = link.report.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let mut words = line.split_whitespace();
            if let (Some("dropped"), Some(name), Some(Ok(n))) =
                (words.next(), words.next(), words.next().map(str::parse))
            {
                drops.push((name.to_string(), n));
            }
        }
        if link.report.len() > 64 * 1024 {
            link.report.clear();
        }
        drops
    }

    /// The writer is gone, with what was in its pipe. A frame partly in the pipe goes
    /// too; whole ones wait for the next writer.
    fn lost(&mut self, now: Mono) {
        let Some(link) = self.link.take() else {
            return;
        };
        if self.sent > 0 {
            if let Some(f) = self.queue.pop_front() {
                self.queued -= f.len();
            }
            self.sent = 0;
        }
        // The first death is answered at once (at the next line); a writer that keeps
        // dying young is started again less and less often.
        if now.since(link.started) >= STABLE {
            self.delay = Duration::ZERO;
        }
        self.retry_at = Some(now.plus(self.delay));
        self.delay = (self.delay * 2).clamp(RESTART_FIRST, RESTART_MAX);
    }

    /// Starts a writer, unless the last start is too recent.
    fn start(&mut self, now: Mono) -> bool {
        if self.retry_at.is_some_and(|t| now < t) {
            return false;
        }
        match self.spawn(now) {
            Ok(link) => {
                if self.failed.take().is_some() {
                    log::info!("the log writer runs again (pid {})", link.pid);
                } else {
                    log::debug!("log writer started: pid {}", link.pid);
                }
                self.link = Some(link);
                true
            }
            Err(why) => {
                if self.failed.is_none() {
                    log::warn!("cannot start the log writer: {why}; dropping the lines meant for log files until it starts");
                }
                self.failed = Some(why);
                self.delay = (self.delay * 2).clamp(RESTART_FIRST, RESTART_MAX);
                self.retry_at = Some(now.plus(self.delay));
                false
            }
        }
    }

    fn spawn(&self, now: Mono) -> Result<Link, String> {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        let e = |e: nix::Error| format!("pipe: {e}");
        // The writer's ends block (it has nothing else to do); supd's never do.
        let (to_read, to) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(e)?;
        fcntl(&to, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(e)?;
        // Best effort: the default size when a bigger one is refused.
        let _ = fcntl(&to, FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
        let (from, report) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(e)?;
        fcntl(&from, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(e)?;
        // This very image (even when its file was replaced), so it speaks this format.
        let exe = Path::new("/proc/self/exe");
        let program = if exe.exists() { exe } else { &self.program };
        let mut env = vec![("PATH".into(), crate::launch::DEFAULT_PATH.into())];
        for k in ["SUP_LOG", "RUST_LOG"] {
            if let Ok(v) = std::env::var(k) {
                env.push((k.to_string(), v));
            }
        }
        let pid = crate::sys::spawn(crate::sys::SpawnSpec {
            program: program.to_string_lossy().into_owned(),
            args: vec![ARG.into(), std::process::id().to_string()],
            env,
            cwd: "/".into(),
            stdout: crate::sys::Io::Fd(report),
            stderr: crate::sys::Io::Inherit,
            creds: None,
            give: None,
            ready_fd: Some((to_read.as_raw_fd(), 3)),
            tuning: Default::default(),
        })?;
        Ok(Link {
            pid,
            to,
            from,
            started: now,
            report: Vec::new(),
        })
    }

    /// The state for a new image, and the fds it names.
    pub fn handoff(&self) -> Option<(WriterState, [BorrowedFd<'_>; 2])> {
        let link = self.link.as_ref()?;
        let state = WriterState {
            format: FORMAT,
            pid: link.pid,
            to_fd: link.to.as_raw_fd(),
            from_fd: link.from.as_raw_fd(),
            started: link.started,
            queue: self.queue.iter().cloned().collect(),
            sent: self.sent,
        };
        Some((state, [link.to.as_fd(), link.from.as_fd()]))
    }

    /// Takes over the writer of a previous image. One that speaks another format is let
    /// go (end-of-file: it writes what it has and exits); the next line starts another.
    pub fn adopt(&mut self, s: WriterState) {
        let (to, from) = match (
            crate::sys::adopt_fd(s.to_fd),
            crate::sys::adopt_fd(s.from_fd),
        ) {
            (Ok(to), Ok(from)) => (to, from),
            _ => return log::warn!("the log writer's pipes were not handed over"),
        };
        if s.format != FORMAT {
            log::info!(
                "the log writer (pid {}) speaks format {}, not {FORMAT}: starting another",
                s.pid,
                s.format
            );
            return;
        }
        self.queued = s.queue.iter().map(Vec::len).sum();
        self.queue = s.queue.into();
        self.sent = s.sent;
        self.link = Some(Link {
            pid: s.pid,
            to,
            from,
            started: s.started,
            report: Vec::new(),
        });
    }
}

impl Drop for LogWriter {
    /// supd is ending: what is queued goes into the pipe if it fits, the pipe is closed,
    /// and the writer, at end-of-file, writes the rest and exits. supd waits for that at
    /// most `FINISH` (a hung disk does not hold its exit; the parent-death signal then
    /// ends the writer).
    fn drop(&mut self) {
        let now = Mono::now();
        self.flush(now);
        let Some(link) = self.link.take() else {
            return;
        };
        drop(link.to);
        let end = now.plus(FINISH);
        let mut buf = [0u8; 4096];
        loop {
            let left = end.since(Mono::now()).as_millis().min(i32::MAX as u128) as i32;
            let mut fds = [nix::poll::PollFd::new(
                link.from.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            let timeout =
                nix::poll::PollTimeout::try_from(left).unwrap_or(nix::poll::PollTimeout::ZERO);
            match nix::poll::poll(&mut fds, timeout) {
                Ok(0) => return log::warn!("the log writer did not finish within {FINISH:?}"),
                Ok(_) => match nix::unistd::read(&link.from, &mut buf) {
                    Ok(0) => return,
                    Ok(_) | Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => {}
                    Err(_) => return,
                },
                Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return,
            }
        }
    }
}

/// The writer process (`supd --log-writer PPID`): frames from fd 3 until end-of-file,
/// appended to their files, with the lines it could not write reported on stdout.
/// Returns its exit status.
pub fn serve(parent: &str) -> u8 {
    crate::logging::init();
    // Ends with supd even when supd is killed; a supd that died before this was set is
    // seen as a new parent.
    if let Err(e) = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL) {
        log::warn!("log writer: cannot ask for a parent-death signal: {e}");
    }
    if parent.parse::<i32>().ok() != Some(nix::unistd::getppid().as_raw()) {
        return 0;
    }
    let mut input = match crate::sys::adopt_fd(3) {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) => {
            log::error!("log writer: no input pipe on fd 3: {e}");
            return 1;
        }
    };
    let mut report = std::io::stdout();
    let mut files: HashMap<String, LogFile> = HashMap::new();
    let mut frames = Decoder::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return 0,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::error!("log writer: reading its pipe: {e}");
                return 1;
            }
        };
        frames.push(&buf[..n]);
        loop {
            match frames.next_frame() {
                Ok(Some(f)) => write_frame(&mut files, f, &mut report),
                Ok(None) => break,
                Err(e) => {
                    log::error!("log writer: {e} in its pipe; exiting (supd starts another)");
                    return 1;
                }
            }
        }
    }
}

/// Appends one frame to its service's file; a failure is said once and reported.
fn write_frame(files: &mut HashMap<String, LogFile>, f: Frame, report: &mut impl Write) {
    let file = files
        .entry(f.service.clone())
        .or_insert_with(|| LogFile::new(f.path.clone(), f.max_size, f.keep));
    if file.path != f.path {
        *file = LogFile::new(f.path.clone(), f.max_size, f.keep);
    }
    file.max_size = f.max_size;
    file.keep = f.keep;
    match file.append(&f.text) {
        Ok(()) => {
            if file.failing {
                log::warn!("{}: writing {} works again", f.service, file.path.display());
                file.failing = false;
            }
        }
        Err(e) => {
            if !file.failing {
                log::warn!(
                    "{}: cannot write {}: {e}; dropping its output lines until this works",
                    f.service,
                    file.path.display()
                );
                file.failing = true;
            }
            let _ = writeln!(report, "dropped {} {}", f.service, f.lines);
            let _ = report.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_go_through_split_anywhere() {
        let lines = vec!["a b".to_string(), "c".to_string()];
        let mut bytes = encode("web", Path::new("/var/log/sup/web.log"), 100, 3, &lines);
        bytes.extend(encode("db@1", Path::new("/l/db@1.log"), 7, 0, &[]));
        for cut in 0..bytes.len() {
            let mut d = Decoder::default();
            d.push(&bytes[..cut]);
            let mut got = Vec::new();
            while let Some(f) = d.next_frame().expect("frame") {
                got.push(f);
            }
            d.push(&bytes[cut..]);
            while let Some(f) = d.next_frame().expect("frame") {
                got.push(f);
            }
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(got[0].service, "web");
            assert_eq!(got[0].path, Path::new("/var/log/sup/web.log"));
            assert_eq!((got[0].max_size, got[0].keep, got[0].lines), (100, 3, 2));
            assert_eq!(got[0].text, b"a b\nc\n");
            assert_eq!(got[1].service, "db@1");
            assert_eq!((got[1].max_size, got[1].keep, got[1].lines), (7, 0, 0));
            assert!(got[1].text.is_empty());
        }
    }

    #[test]
    fn a_corrupt_stream_is_an_error() {
        let mut d = Decoder::default();
        d.push(&u32::MAX.to_le_bytes());
        assert!(d.next_frame().is_err());
        let mut d = Decoder::default();
        d.push(&[3, 0, 0, 0, 9, 0, b'x']);
        assert!(d.next_frame().is_err());
    }

    #[test]
    fn a_failed_write_is_reported_by_service() {
        let mut files = HashMap::new();
        let mut report = Vec::new();
        let lines = ["x".to_string(), "y".to_string()];
        let bytes = encode("full", Path::new("/dev/full"), 1 << 20, 0, &lines);
        let mut d = Decoder::default();
        d.push(&bytes);
        let f = d.next_frame().expect("ok").expect("a frame");
        write_frame(&mut files, f, &mut report);
        assert_eq!(String::from_utf8_lossy(&report), "dropped full 2\n");
    }
}
