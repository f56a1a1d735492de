//! The log writer: one helper process that writes every service's log file, supd's own
//! log file, and the console lines of `log = "inherit"` services, so that a slow or hung
//! log disk (an NFS `log_dir` that hangs, a `NAME.log` that is a FIFO nobody reads) or a
//! console nobody reads blocks that process alone and never supd. s6 and runit log
//! through processes of their own for the same reason.
//!
//! supd keeps reading every output pipe in its loop (the ring for `log -n` and `log -f`
//! stays in supd) and hands each batch of finished lines to the writer as one frame, over
//! a socket pair whose supd end is non-blocking. What the socket does not take waits in a
//! small bounded queue; past that, lines are dropped and counted (`log_dropped`), never
//! waited for. The writer is supd's own program image (`/proc/self/exe --log-writer
//! PPID`, the socket as its fd 3, supd's stdout and stderr as its own), started at the
//! first line to write and again whenever it is gone (after a delay if it died young). It
//! ends with supd: end-of-file on its socket when supd exits (supd gives it a second to
//! write what it has), its parent-death signal when supd is killed. It reports the lines
//! it could not write (`dropped NAME N` lines back on the socket), which supd adds to the
//! service's count. Its socket and queue are handed over across `reexec`.
//!
//! A frame, little-endian: `u32` length of the rest, `u8` kind (0: a file, 1: the
//! console's stdout, 2: its stderr), `u16` + service name, `u16` + path, `u64` max size,
//! `u32` files kept, `u32` group of new files (`u32::MAX`: none), `u32` line count, then
//! the lines, each ending in a newline. A frame carries its file's settings, so a new
//! writer needs no other state and a reload's new `log_dir` or rotation settings apply
//! from the next line on. Console lines go out prefixed `NAME: `, in writes of whole lines
//! of at most `PIPE_BUF` bytes, so that two services' lines (and supd's own messages on
//! the same stream) never mix within a line.

use crate::logs::LogFile;
use crate::time::Mono;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The argument that makes supd a log writer.
pub const ARG: &str = "--log-writer";
/// The frame format. A writer handed over by an image that speaks another is let go.
pub const FORMAT: u32 = 2;
/// Bytes of frames queued in supd while the socket is full (beyond the socket itself).
const QUEUE_MAX: usize = 256 * 1024;
/// The socket buffer asked for: a short stall of the disk then costs no line.
const SOCKET_BUFFER: usize = 1 << 20;
/// The largest frame a writer accepts; a longer length means a corrupt stream.
const FRAME_MAX: usize = 64 << 20;
/// A writer that could not start, or died again within `STABLE` of its start, is started
/// again only after a delay, doubling up to `RESTART_MAX`.
const RESTART_FIRST: Duration = Duration::from_millis(100);
const RESTART_MAX: Duration = Duration::from_secs(30);
const STABLE: Duration = Duration::from_secs(1);
/// How long an exiting supd lets the writer finish what it was given.
const FINISH: Duration = Duration::from_secs(1);
/// Writes of at most this many bytes to a pipe are never mixed with other writes.
const PIPE_BUF: usize = 4096;
/// The group field of a frame that sets none.
const NO_GROUP: u32 = u32::MAX;

/// The name under which supd's own log file (`[supd] log_file`) goes to the writer (no
/// service can have it).
pub const OWN_LOG: &str = "(supd)";

/// Where a frame's lines go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Appended to a rotated file.
    File,
    /// The console: supd's stdout, each line prefixed `NAME: `.
    Stdout,
    /// supd's stderr, likewise.
    Stderr,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::File => 0,
            Kind::Stdout => 1,
            Kind::Stderr => 2,
        }
    }

    fn from_code(c: u8) -> Result<Kind, String> {
        match c {
            0 => Ok(Kind::File),
            1 => Ok(Kind::Stdout),
            2 => Ok(Kind::Stderr),
            other => Err(format!("a frame of unknown kind {other}")),
        }
    }
}

/// Where a batch of lines goes, and the settings of its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dest {
    pub kind: Kind,
    /// The file (empty for the console).
    pub path: PathBuf,
    pub max_size: u64,
    pub keep: u32,
    /// The group new files (and a new directory) are given.
    pub gid: Option<u32>,
}

impl Dest {
    /// A rotated file.
    pub fn file(path: PathBuf, max_size: u64, keep: u32, gid: Option<u32>) -> Dest {
        Dest {
            kind: Kind::File,
            path,
            max_size,
            keep,
            gid,
        }
    }

    /// supd's stdout (`err`: its stderr).
    pub fn console(err: bool) -> Dest {
        Dest {
            kind: if err { Kind::Stderr } else { Kind::Stdout },
            path: PathBuf::new(),
            max_size: 0,
            keep: 0,
            gid: None,
        }
    }
}

/// One batch of a service's lines for its log file or the console.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    pub service: String,
    pub dest: Dest,
    pub lines: u32,
    /// The lines, each ending in a newline.
    pub text: Vec<u8>,
}

/// The frame of `lines` of `service`, to go to `dest`.
pub fn encode(service: &str, dest: &Dest, lines: &[String]) -> Vec<u8> {
    let text: usize = lines.iter().map(|l| l.len() + 1).sum();
    let mut b = Vec::with_capacity(48 + service.len() + dest.path.as_os_str().len() + text);
    b.extend_from_slice(&[0; 4]);
    b.push(dest.kind.code());
    counted(&mut b, service.as_bytes());
    counted(&mut b, dest.path.as_os_str().as_bytes());
    b.extend_from_slice(&dest.max_size.to_le_bytes());
    b.extend_from_slice(&dest.keep.to_le_bytes());
    b.extend_from_slice(&dest.gid.unwrap_or(NO_GROUP).to_le_bytes());
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
    let kind = Kind::from_code(r.int(1)? as u8)?;
    let service = r.counted()?;
    let service = String::from_utf8(service.to_vec()).map_err(|_| "a service name not in UTF-8")?;
    let path = PathBuf::from(OsStr::from_bytes(r.counted()?));
    let max_size = r.int(8)?;
    let keep = r.int(4)? as u32;
    let gid = r.int(4)? as u32;
    let lines = r.int(4)? as u32;
    Ok(Frame {
        service,
        dest: Dest {
            kind,
            path,
            max_size,
            keep,
            gid: (gid != NO_GROUP).then_some(gid),
        },
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
    /// Frames the socket did not take yet; `sent` bytes of the first are in it.
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
    /// supd's end of the socket pair (non-blocking): frames go out, reports come in;
    /// end-of-file when the writer is gone.
    sock: OwnedFd,
    started: Mono,
    report: Vec<u8>,
}

/// The writer as handed over across `reexec`. From format 2 on, `to_fd` and `from_fd`
/// are the same socket.
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

    /// Hands `lines` of `service` to the writer, for `dest`; false when they are dropped
    /// (the writer is behind, or cannot be started). Never waits.
    pub fn send(&mut self, service: &str, dest: &Dest, lines: &[String], now: Mono) -> bool {
        if self.link.is_none() && !self.start(now) {
            return false;
        }
        let frame = encode(service, dest, lines);
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

    /// Writes what the socket takes of the queue.
    pub fn flush(&mut self, now: Mono) {
        use nix::sys::socket::{send, MsgFlags};
        let Some(link) = self.link.as_ref() else {
            return;
        };
        while let Some(front) = self.queue.front() {
            match send(
                link.sock.as_raw_fd(),
                &front[self.sent..],
                MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
            ) {
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

    /// The fds to poll: its reports, and its socket while frames wait for room in it.
    pub fn poll_fds(&self) -> Option<(BorrowedFd<'_>, Option<BorrowedFd<'_>>)> {
        let link = self.link.as_ref()?;
        let out = (!self.queue.is_empty()).then(|| link.sock.as_fd());
        Some((link.sock.as_fd(), out))
    }

    /// Reads the writer's reports: lines it could not write, by service.
    pub fn on_reports(&mut self, now: Mono) -> Vec<(String, u64)> {
        let Some(link) = self.link.as_mut() else {
            return Vec::new();
        };
        let mut buf = [0u8; 4096];
        match nix::unistd::read(&link.sock, &mut buf) {
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

    /// The writer is gone, with what was in its socket. A frame partly sent goes too;
    /// whole ones wait for the next writer.
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
        use nix::sys::socket::{
            setsockopt, socketpair, sockopt, AddressFamily, SockFlag, SockType,
        };
        let (sock, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        )
        .map_err(|e| format!("socketpair: {e}"))?;
        // The writer's end blocks (it has nothing else to do); supd's never does.
        nix::fcntl::fcntl(
            &theirs,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
        )
        .map_err(|e| format!("fcntl: {e}"))?;
        // Best effort: root may pass the system's maximum, others get what they may.
        if setsockopt(&sock, sockopt::SndBufForce, &SOCKET_BUFFER).is_err() {
            let _ = setsockopt(&sock, sockopt::SndBuf, &SOCKET_BUFFER);
        }
        // This very image (even when its file was replaced), so it speaks this format.
        let exe = Path::new("/proc/self/exe");
        let program = if exe.exists() { exe } else { &self.program };
        let pid = crate::spawner::spawn(crate::sys::SpawnSpec::own_helper(
            program,
            vec![ARG.into(), std::process::id().to_string()],
            theirs.as_raw_fd(),
        ))?;
        Ok(Link {
            pid,
            sock,
            started: now,
            report: Vec::new(),
        })
    }

    /// The state for a new image, and the fds it names.
    pub fn handoff(&self) -> Option<(WriterState, [BorrowedFd<'_>; 1])> {
        let link = self.link.as_ref()?;
        let state = WriterState {
            format: FORMAT,
            pid: link.pid,
            to_fd: link.sock.as_raw_fd(),
            from_fd: link.sock.as_raw_fd(),
            started: link.started,
            queue: self.queue.iter().cloned().collect(),
            sent: self.sent,
        };
        Some((state, [link.sock.as_fd()]))
    }

    /// Takes over the writer of a previous image. One that speaks another format is let
    /// go (end-of-file: it writes what it has and exits); the next line starts another.
    pub fn adopt(&mut self, s: WriterState) {
        let Ok(sock) = crate::sys::adopt_fd(s.to_fd) else {
            return log::warn!("the log writer's socket was not handed over");
        };
        // Format 1 had two pipes: the second is closed too.
        let other = (s.from_fd != s.to_fd).then(|| crate::sys::adopt_fd(s.from_fd));
        if s.format != FORMAT {
            log::info!(
                "the log writer (pid {}) speaks format {}, not {FORMAT}: starting another",
                s.pid,
                s.format
            );
            drop((sock, other));
            return;
        }
        self.queued = s.queue.iter().map(Vec::len).sum();
        self.queue = s.queue.into();
        self.sent = s.sent;
        self.link = Some(Link {
            pid: s.pid,
            sock,
            started: s.started,
            report: Vec::new(),
        });
    }
}

impl Drop for LogWriter {
    /// supd is ending: what is queued goes into the socket if it fits, supd's side of it
    /// is shut, and the writer, at end-of-file, writes the rest and exits. supd waits for
    /// that at most `FINISH` (a hung disk does not hold its exit; the parent-death signal
    /// then ends the writer).
    fn drop(&mut self) {
        let now = Mono::now();
        self.flush(now);
        let Some(link) = self.link.take() else {
            return;
        };
        let _ =
            nix::sys::socket::shutdown(link.sock.as_raw_fd(), nix::sys::socket::Shutdown::Write);
        let end = now.plus(FINISH);
        let mut buf = [0u8; 4096];
        loop {
            let left = end.since(Mono::now()).as_millis().min(i32::MAX as u128) as i32;
            let mut fds = [nix::poll::PollFd::new(
                link.sock.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            let timeout =
                nix::poll::PollTimeout::try_from(left).unwrap_or(nix::poll::PollTimeout::ZERO);
            match nix::poll::poll(&mut fds, timeout) {
                Ok(0) => return log::warn!("the log writer did not finish within {FINISH:?}"),
                Ok(_) => match nix::unistd::read(&link.sock, &mut buf) {
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

/// Where the writer sends lines: the files by service, and the console.
struct Sinks {
    files: BTreeMap<String, LogFile>,
    /// A console stream failed (said once, until a write works again).
    console_failing: [bool; 2],
}

/// The writer process (`supd --log-writer PPID`): frames from the socket on fd 3 until
/// end-of-file, appended to their files or written to the console, with the lines it
/// could not write reported back. Returns its exit status.
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
    let sock = match crate::sys::adopt_fd(3) {
        Ok(fd) => fd,
        Err(e) => {
            log::error!("log writer: no socket on fd 3: {e}");
            return 1;
        }
    };
    let mut input = match sock.try_clone() {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) => {
            log::error!("log writer: {e}");
            return 1;
        }
    };
    let mut report = Reporter(sock);
    let mut sinks = Sinks {
        files: BTreeMap::new(),
        console_failing: [false; 2],
    };
    let mut frames = Decoder::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => return 0,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::error!("log writer: reading its socket: {e}");
                return 1;
            }
        };
        frames.push(&buf[..n]);
        loop {
            match frames.next_frame() {
                Ok(Some(f)) => write_frame(&mut sinks, f, &mut report),
                Ok(None) => break,
                Err(e) => {
                    log::error!("log writer: {e} in its socket; exiting (supd starts another)");
                    return 1;
                }
            }
        }
    }
}

/// Reports go back on the socket; a supd that is gone gets none (no SIGPIPE).
struct Reporter(OwnedFd);

impl Write for Reporter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        use nix::sys::socket::{send, MsgFlags};
        send(self.0.as_raw_fd(), b, MsgFlags::MSG_NOSIGNAL).map_err(std::io::Error::from)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes one frame where it goes; a failure is said once and reported.
fn write_frame(sinks: &mut Sinks, f: Frame, report: &mut impl Write) {
    let (done, what, failing) = match f.dest.kind {
        Kind::File => {
            let d = &f.dest;
            let file = sinks
                .files
                .entry(f.service.clone())
                .or_insert_with(|| LogFile::new(d.path.clone(), d.max_size, d.keep));
            if file.path != d.path {
                *file = LogFile::new(d.path.clone(), d.max_size, d.keep);
            }
            file.max_size = d.max_size;
            file.keep = d.keep;
            file.gid = d.gid;
            let done = file.append(&f.text);
            (done, file.path.display().to_string(), &mut file.failing)
        }
        Kind::Stdout | Kind::Stderr => {
            let err = f.dest.kind == Kind::Stderr;
            let mut done = Ok(());
            for chunk in console_chunks(&f.service, &f.text) {
                let wrote = if err {
                    write_whole(std::io::stderr().as_fd(), &chunk)
                } else {
                    write_whole(std::io::stdout().as_fd(), &chunk)
                };
                if let Err(e) = wrote {
                    done = Err(e);
                    break;
                }
            }
            let what = if err {
                "supd's stderr"
            } else {
                "supd's stdout"
            };
            (
                done,
                what.to_string(),
                &mut sinks.console_failing[err as usize],
            )
        }
    };
    let note = match done {
        Ok(()) => {
            std::mem::take(failing).then(|| format!("{}: writing {what} works again", f.service))
        }
        Err(e) => {
            let _ = writeln!(report, "dropped {} {}", f.service, f.lines);
            (!std::mem::replace(failing, true)).then(|| {
                format!(
                    "{}: cannot write {what}: {e}; dropping its output lines until this works",
                    f.service
                )
            })
        }
    };
    if let Some(note) = note {
        log::warn!("{note}");
        // Said in supd's own log file too, when it has one (and it is not the one).
        if f.service != OWN_LOG {
            if let Some(own) = sinks.files.get_mut(OWN_LOG) {
                let stamp = crate::time::utc_stamp(std::time::SystemTime::now());
                let lines = crate::logging::file_lines(&stamp, log::Level::Warn, &note);
                let _ = own.append(format!("{}\n", lines.join("\n")).as_bytes());
            }
        }
    }
}

/// One `write` of `chunk` (then the rest, should the stream take less), unbuffered.
fn write_whole(out: BorrowedFd<'_>, mut chunk: &[u8]) -> std::io::Result<()> {
    while !chunk.is_empty() {
        match nix::unistd::write(out, chunk) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => chunk = &chunk[n..],
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The console's writes for `text` (lines each ending in a newline) of `service`: each
/// line prefixed `service: `, whole lines packed into writes of at most `PIPE_BUF`
/// bytes, a longer line cut into pieces that each get the prefix (so no write ever ends
/// within a line, and none is mixed with another's).
pub fn console_chunks(service: &str, text: &[u8]) -> Vec<Vec<u8>> {
    let prefix = format!("{service}: ");
    let prefix = &prefix.as_bytes()[..prefix.len().min(PIPE_BUF / 2)];
    let room = PIPE_BUF - prefix.len() - 1;
    let mut chunks = Vec::new();
    let mut cur: Vec<u8> = Vec::with_capacity(PIPE_BUF);
    for line in text.split_inclusive(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let mut pieces: Vec<&[u8]> = line.chunks(room).collect();
        if pieces.is_empty() {
            pieces.push(b"");
        }
        for piece in pieces {
            if cur.len() + prefix.len() + piece.len() + 1 > PIPE_BUF {
                chunks.push(std::mem::take(&mut cur));
            }
            cur.extend_from_slice(prefix);
            cur.extend_from_slice(piece);
            cur.push(b'\n');
        }
    }
    if !cur.is_empty() {
        chunks.push(cur);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_go_through_split_anywhere() {
        let lines = vec!["a b".to_string(), "c".to_string()];
        let web = Dest::file("/var/log/sup/web.log".into(), 100, 3, Some(33));
        let mut bytes = encode("web", &web, &lines);
        bytes.extend(encode("db@1", &Dest::console(true), &[]));
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
            assert_eq!(got[0].dest, web);
            assert_eq!(got[0].lines, 2);
            assert_eq!(got[0].text, b"a b\nc\n");
            assert_eq!(got[1].service, "db@1");
            assert_eq!(got[1].dest, Dest::console(true));
            assert_eq!(got[1].lines, 0);
            assert!(got[1].text.is_empty());
        }
    }

    #[test]
    fn a_corrupt_stream_is_an_error() {
        let mut d = Decoder::default();
        d.push(&u32::MAX.to_le_bytes());
        assert!(d.next_frame().is_err());
        let mut d = Decoder::default();
        d.push(&[4, 0, 0, 0, 0, 9, 0, b'x']);
        assert!(d.next_frame().is_err());
        let mut d = Decoder::default();
        d.push(&[1, 0, 0, 0, 7]);
        assert!(d.next_frame().is_err());
    }

    #[test]
    fn a_failed_write_is_reported_by_service() {
        let mut sinks = Sinks {
            files: BTreeMap::new(),
            console_failing: [false; 2],
        };
        let mut report = Vec::new();
        let lines = ["x".to_string(), "y".to_string()];
        let bytes = encode(
            "full",
            &Dest::file("/dev/full".into(), 1 << 20, 0, None),
            &lines,
        );
        let mut d = Decoder::default();
        d.push(&bytes);
        let f = d.next_frame().expect("ok").expect("a frame");
        write_frame(&mut sinks, f, &mut report);
        assert_eq!(String::from_utf8_lossy(&report), "dropped full 2\n");
    }

    #[test]
    fn console_lines_are_prefixed_and_never_cut_between_writes() {
        let chunks = console_chunks("web", b"one\n\ntwo\n");
        assert_eq!(chunks, vec![b"web: one\nweb: \nweb: two\n".to_vec()]);
        // Many short lines: packed, each write at most PIPE_BUF and of whole lines.
        let many: Vec<u8> = (0..1000)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        let chunks = console_chunks("db", &many);
        assert!(chunks.len() > 1);
        let mut all = Vec::new();
        for c in &chunks {
            assert!(c.len() <= PIPE_BUF, "{}", c.len());
            assert!(c.starts_with(b"db: ") && c.ends_with(b"\n"));
            all.extend_from_slice(c);
        }
        let want: Vec<u8> = (0..1000)
            .flat_map(|i| format!("db: line {i}\n").into_bytes())
            .collect();
        assert_eq!(all, want);
        // A line longer than a write: pieces, each prefixed and ended.
        let long = [vec![b'x'; 10_000], b"\n".to_vec()].concat();
        let chunks = console_chunks("db", &long);
        let text = String::from_utf8(chunks.concat()).expect("text");
        assert!(chunks.iter().all(|c| c.len() <= PIPE_BUF));
        assert_eq!(text.lines().count(), 3);
        assert!(text.lines().all(|l| l.starts_with("db: x")));
        assert_eq!(text.matches('x').count(), 10_000);
    }
}
