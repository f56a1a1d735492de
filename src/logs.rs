//! Captured output of services: a pipe per service (and one for its stderr when
//! `log_stderr = "marked"`) that outlives its processes (so no output is lost across
//! restarts), read without blocking and at most [`READ_MAX`] bytes per wake-up, split
//! into stamped lines (stderr's marked [`STDERR_MARK`]) and kept in a small ring for
//! `supctl log`. supd never opens a log file: the lines go to the log writer
//! (`log_writer.rs`), a process of its own that appends them to rotated files
//! ([`LogFile`]), so a slow or hung log disk blocks only that process. Lines that cannot
//! be written are counted.

use crate::time;
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

/// At most this much is read from one service per wake-up.
pub const READ_MAX: usize = 64 * 1024;
/// Longer lines are cut into pieces of this size.
const LINE_MAX: usize = 4096;
/// Lines kept in memory per service for `supctl log`.
const RING_LINES: usize = 1000;
const RING_BYTES: usize = 256 * 1024;

/// A rotated log file.
pub struct LogFile {
    pub path: PathBuf,
    pub max_size: u64,
    pub keep: u32,
    file: Option<File>,
    size: u64,
    /// The last append failed (said once, until one works again).
    pub failing: bool,
    /// The group the file (and a directory made for it) is given: `socket_group`, so
    /// its members may read the logs.
    pub gid: Option<u32>,
}

impl LogFile {
    pub fn new(path: PathBuf, max_size: u64, keep: u32) -> LogFile {
        LogFile {
            path,
            max_size,
            keep,
            file: None,
            size: 0,
            failing: false,
            gid: None,
        }
    }

    /// Opens the file, making its directory first if it is missing (`log_dir` is made
    /// here, by the writer, so that a hung one blocks nothing else). A new file is mode
    /// 0640; with a `gid`, the file is given that group (a directory made here too, mode
    /// 0750), so that the group may read it.
    fn open(&mut self) -> io::Result<&mut File> {
        if self.file.is_none() {
            let open = || {
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o640)
                    .open(&self.path)
            };
            let f = match open() {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if let Some(dir) = self.path.parent() {
                        if !dir.exists() {
                            std::fs::create_dir_all(dir)?;
                            if let Some(gid) = self.gid {
                                give_group(dir, gid, 0o750);
                            }
                        }
                    }
                    open()?
                }
                other => other?,
            };
            let meta = f.metadata();
            if let (Some(gid), Ok(m)) = (self.gid, &meta) {
                use std::os::unix::fs::MetadataExt;
                // A regular file of ours with another group (made before `socket_group`
                // was set, or by an older version) is given the group too.
                if m.is_file() && m.gid() != gid {
                    if let Err(e) = std::os::unix::fs::fchown(&f, None, Some(gid)) {
                        log::debug!("cannot give {} to group {gid}: {e}", self.path.display());
                    }
                }
            }
            self.size = meta.map(|m| m.len()).unwrap_or(0);
            self.file = Some(f);
        }
        self.file
            .as_mut()
            .ok_or_else(|| io::Error::other("log file not open"))
    }

    /// Appends `bytes`, rotating first when they would pass `max_size`. On an error the
    /// file is closed, so the next append tries a fresh open (the disk may be freed).
    pub fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        let done = self.try_append(bytes);
        if done.is_err() {
            self.file = None;
        }
        done
    }

    fn try_append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.open()?;
        let mut rest = bytes;
        while !rest.is_empty() {
            let take = fitting(rest, self.size, self.max_size);
            if take == 0 {
                self.rotate()?;
                continue;
            }
            let f = self.open()?;
            f.write_all(&rest[..take])?;
            self.size += take as u64;
            rest = &rest[take..];
        }
        Ok(())
    }

    /// NAME.log → NAME.log.1 → ... → NAME.log.KEEP (the oldest is deleted).
    fn rotate(&mut self) -> io::Result<()> {
        self.file = None;
        let numbered = |n: u32| PathBuf::from(format!("{}.{n}", self.path.display()));
        if self.keep == 0 {
            File::create(&self.path)?;
        } else {
            let _ = std::fs::remove_file(numbered(self.keep));
            for n in (1..self.keep).rev() {
                let _ = std::fs::rename(numbered(n), numbered(n + 1));
            }
            std::fs::rename(&self.path, numbered(1))?;
        }
        self.size = 0;
        Ok(())
    }
}

/// How much of `text` (whole lines) goes into a file of `size` bytes before it is
/// rotated to stay within `max`: 0 means "rotate first". A line longer than `max` goes
/// whole into an empty file.
pub fn fitting(text: &[u8], size: u64, max: u64) -> usize {
    let room = max.saturating_sub(size).min(usize::MAX as u64) as usize;
    if text.len() <= room {
        return text.len();
    }
    match text[..room].iter().rposition(|&b| b == b'\n') {
        Some(end) => end + 1,
        None if size > 0 => 0,
        None => text
            .iter()
            .position(|&b| b == b'\n')
            .map_or(text.len(), |end| end + 1),
    }
}

/// Gives a directory made for logs to `gid` with `mode` (best effort: said, not fatal).
fn give_group(dir: &std::path::Path, gid: u32, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    if let Err(e) = std::os::unix::fs::chown(dir, None, Some(gid)) {
        log::warn!("cannot give {} to group {gid}: {e}", dir.display());
    }
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode));
}

/// One pipe of a service's output and its unfinished line.
struct Pipe {
    read: OwnedFd,
    /// Kept open by supd so the pipe never reports end-of-file between two processes;
    /// each process gets a duplicate.
    write: OwnedFd,
    partial: Vec<u8>,
}

impl Pipe {
    /// A new pipe; its read end is non-blocking.
    fn new() -> io::Result<Pipe> {
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
        // The write end must block in the service (a service expects normal stdout).
        nix::fcntl::fcntl(
            &write,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
        )?;
        Ok(Pipe::adopt(read, write))
    }

    fn adopt(read: OwnedFd, write: OwnedFd) -> Pipe {
        Pipe {
            read,
            write,
            partial: Vec::new(),
        }
    }
}

/// One service's output pipes (stdout, and stderr when it is kept apart) and its lines.
pub struct Output {
    out: Pipe,
    /// stderr's own pipe (`log_stderr = "marked"`); without it stderr shares `out`.
    err: Option<Pipe>,
    ring: VecDeque<String>,
    ring_bytes: usize,
    /// Lines lost since supd started: not taken by a stalled log writer, or not written
    /// by it (a full or failing disk).
    pub dropped: u64,
}

/// What follows the timestamp of a line from stderr kept apart, in the log file, `log`
/// and `log -f`: `2024-05-01T10:00:00.000Z [stderr] text`.
pub const STDERR_MARK: &str = "[stderr] ";

/// A stored line's text (without its timestamp and stderr mark), and whether it came
/// from stderr kept apart.
pub fn text_of(line: &str) -> (&str, bool) {
    let text = line.split_once(' ').map_or(line, |(_, t)| t);
    match text.strip_prefix(STDERR_MARK) {
        Some(t) => (t, true),
        None => (text, false),
    }
}

/// How a marker line's text begins: supd writes one at each start of a run and at
/// each exit of its main process, into the ring, to followers and to the log file, as
/// if the service had said it: `--- started: version 1.2.0, pid 1234`, `--- exited:
/// code 3 after 2.1s (pid 1234)`. Output of the service never reads as one in `log
/// --json` unless it begins with these very words.
const MARKERS: [&str; 2] = ["--- started: ", "--- exited: "];

/// Whether a stored line is a marker of a run's start or exit (not the service's own
/// output): its text begins with one of [`MARKERS`] and it is not from stderr.
pub fn is_marker(line: &str) -> bool {
    let (text, err) = text_of(line);
    !err && MARKERS.iter().any(|m| text.starts_with(m))
}

/// The text of the marker at a run's start.
pub fn started_marker(version: Option<&str>, pid: i32) -> String {
    match version {
        Some(v) => format!("{}version {v}, pid {pid}", MARKERS[0]),
        None => format!("{}pid {pid}", MARKERS[0]),
    }
}

/// The text of the marker at the exit of a run's main process: `how` it ended ("code
/// 3", "killed by signal TERM"), after how long it `ran`.
pub fn exited_marker(how: &str, ran: std::time::Duration, pid: i32) -> String {
    let ms = ran.as_millis();
    let ran = match ms {
        0..=999 => format!("{ms}ms"),
        1000..=59_999 => format!("{}.{}s", ms / 1000, ms % 1000 / 100),
        _ => time::Human(ran).to_string(),
    };
    format!("{}{how} after {ran} (pid {pid})", MARKERS[1])
}

/// The stamp of a stored line (`2024-05-01T10:00:00.000Z`).
pub fn stamp_of(line: &str) -> &str {
    line.split_once(' ').map_or(line, |(s, _)| s)
}

/// The last `n` lines of several services' kept lines, merged by their stamps: each
/// source gives its service's name and its lines newest first (already filtered). The
/// result is oldest first; lines of one service keep their order, and lines of equal
/// stamps come in the order of the sources. Costs O(sources + n log sources).
pub fn last_merged<'a>(
    sources: Vec<(&'a str, Box<dyn Iterator<Item = &'a String> + 'a>)>,
    n: usize,
) -> Vec<(&'a str, &'a String)> {
    use std::collections::BinaryHeap;
    let mut iters: Vec<_> = sources.into_iter().collect();
    let mut heap = BinaryHeap::new();
    for (i, (_, it)) in iters.iter_mut().enumerate() {
        if let Some(l) = it.next() {
            heap.push((stamp_of(l), i, l));
        }
    }
    let mut got = Vec::new();
    while got.len() < n {
        let Some((_, i, line)) = heap.pop() else {
            break;
        };
        got.push((iters[i].0, line));
        if let Some(l) = iters[i].1.next() {
            heap.push((stamp_of(l), i, l));
        }
    }
    got.reverse();
    got
}

impl Output {
    /// Stores a line that did not come from the pipes (a marker of a run's start or
    /// exit, a syslog message of the service's): stamped now and kept in the ring; returned, as [`Output::read_available`]
    /// returns its lines, for followers and the log file.
    pub fn note(&mut self, text: &str) -> String {
        let line = format!("{} {text}", time::utc_stamp(std::time::SystemTime::now()));
        self.store(std::slice::from_ref(&line));
        line
    }

    /// The lines kept in memory, oldest first.
    pub fn kept(&self) -> impl DoubleEndedIterator<Item = &String> {
        self.ring.iter()
    }
}

impl Output {
    /// New pipes, stderr's apart when `stderr_apart`; the read ends are non-blocking.
    pub fn new(stderr_apart: bool) -> io::Result<Output> {
        Ok(Output {
            out: Pipe::new()?,
            err: if stderr_apart {
                Some(Pipe::new()?)
            } else {
                None
            },
            ring: VecDeque::new(),
            ring_bytes: 0,
            dropped: 0,
        })
    }

    /// Gives stderr a pipe of its own, or takes it away (a reload changed `log_stderr`;
    /// the service is being restarted).
    pub fn set_stderr_apart(&mut self, apart: bool) -> io::Result<()> {
        match (apart, self.err.is_some()) {
            (true, false) => self.err = Some(Pipe::new()?),
            (false, true) => self.err = None,
            _ => {}
        }
        Ok(())
    }

    /// The stdout pipe's ends, for a handoff to a new supd image.
    pub fn fds(&self) -> (&OwnedFd, &OwnedFd) {
        (&self.out.read, &self.out.write)
    }

    /// The stderr pipe's ends, when stderr is kept apart.
    pub fn err_fds(&self) -> Option<(&OwnedFd, &OwnedFd)> {
        self.err.as_ref().map(|p| (&p.read, &p.write))
    }

    /// The output of a previous supd image: its pipe (with whatever is unread in it),
    /// its kept lines and its count of dropped lines.
    pub fn adopt(read: OwnedFd, write: OwnedFd, lines: Vec<String>, dropped: u64) -> Output {
        let ring_bytes = lines.iter().map(String::len).sum();
        Output {
            out: Pipe::adopt(read, write),
            err: None,
            ring: lines.into(),
            ring_bytes,
            dropped,
        }
    }

    /// The stderr pipe of a previous image.
    pub fn adopt_err(&mut self, read: OwnedFd, write: OwnedFd) {
        self.err = Some(Pipe::adopt(read, write));
    }

    /// The fd to poll for output on stdout (`err`: on stderr kept apart).
    pub fn fd(&self, err: bool) -> Option<BorrowedFd<'_>> {
        match err {
            false => Some(self.out.read.as_fd()),
            true => self.err.as_ref().map(|p| p.read.as_fd()),
        }
    }

    /// Duplicates of the write ends, for a new process's stdout and stderr.
    pub fn writers(&self) -> io::Result<(OwnedFd, OwnedFd)> {
        let err = self.err.as_ref().unwrap_or(&self.out);
        Ok((self.out.write.try_clone()?, err.write.try_clone()?))
    }

    /// Reads what is there on stdout (`err`: on stderr kept apart), bounded, keeps the
    /// complete lines, and returns them with their timestamps (and stderr's mark), for
    /// followers and the log file. `service` names the service in error messages.
    pub fn read_available(&mut self, service: &str, buf: &mut [u8], err: bool) -> Vec<String> {
        let limit = READ_MAX.min(buf.len());
        let pipe = match (err, self.err.as_mut()) {
            (false, _) => &mut self.out,
            (true, Some(p)) => p,
            (true, None) => return Vec::new(),
        };
        let n = match nix::unistd::read(&pipe.read, &mut buf[..limit]) {
            Ok(n) => n,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => return Vec::new(),
            Err(e) => {
                log::warn!("{service}: reading its output failed: {e}");
                return Vec::new();
            }
        };
        let stamp = time::utc_stamp(std::time::SystemTime::now());
        let mark = if err { STDERR_MARK } else { "" };
        let lines = split(&mut pipe.partial, &buf[..n], &format!("{stamp} {mark}"));
        self.store(&lines);
        lines
    }

    fn store(&mut self, lines: &[String]) {
        for l in lines {
            self.ring_bytes += l.len();
            self.ring.push_back(l.clone());
        }
        while self.ring.len() > RING_LINES || self.ring_bytes > RING_BYTES {
            match self.ring.pop_front() {
                Some(old) => self.ring_bytes -= old.len(),
                None => break,
            }
        }
    }

    /// The last `n` lines kept in memory (`stderr_only`: of those from stderr kept
    /// apart).
    pub fn tail(&self, n: usize, stderr_only: bool) -> Vec<String> {
        let mut got: Vec<String> = self
            .ring
            .iter()
            .rev()
            .filter(|l| !stderr_only || text_of(l).1)
            .take(n)
            .cloned()
            .collect();
        got.reverse();
        got
    }
}

/// Adds `data` to the unfinished line `partial` and returns the lines it completes, each
/// after `head`. A line longer than [`LINE_MAX`] is cut; the rest stays in `partial`.
fn split(partial: &mut Vec<u8>, data: &[u8], head: &str) -> Vec<String> {
    let mut lines = Vec::new();
    for &b in data {
        if b == b'\n' || partial.len() >= LINE_MAX {
            let text = String::from_utf8_lossy(partial);
            lines.push(format!("{head}{text}"));
            partial.clear();
            if b == b'\n' {
                continue;
            }
        }
        partial.push(b);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> crate::scratch::Scratch {
        crate::scratch::Scratch::new(&format!("logs-{name}"))
    }

    #[test]
    fn lines_are_split_and_kept() {
        let mut out = Output::new(false).expect("pipe");
        nix::unistd::write(&out.out.write, b"one\ntw").expect("write");
        let mut buf = vec![0; READ_MAX];
        let got = out.read_available("a", &mut buf, false);
        assert_eq!(got.len(), 1);
        assert!(got[0].ends_with(" one"), "{got:?}");
        nix::unistd::write(&out.out.write, b"o\n").expect("write");
        let got = out.read_available("a", &mut buf, false);
        assert!(got[0].ends_with(" two"), "{got:?}");
        assert_eq!(out.tail(5, false).len(), 2);
        assert_eq!(out.tail(1, false), got);
        // Nothing there: no lines, no blocking.
        assert!(out.read_available("a", &mut buf, false).is_empty());
        // Merged: stderr is stdout's pipe, unmarked.
        let (_, err) = out.writers().expect("dups");
        nix::unistd::write(&err, b"oops\n").expect("write");
        let got = out.read_available("a", &mut buf, false);
        assert_eq!(text_of(&got[0]), ("oops", false));
    }

    #[test]
    fn stderr_apart_is_marked_and_kept_apart() {
        let mut out = Output::new(true).expect("pipes");
        let (o, e) = out.writers().expect("dups");
        nix::unistd::write(&o, b"fine\n").expect("write");
        nix::unistd::write(&e, b"half").expect("write");
        nix::unistd::write(&o, b"also fine\n").expect("write");
        nix::unistd::write(&e, b" broken\n").expect("write");
        let mut buf = vec![0; READ_MAX];
        let outs = out.read_available("a", &mut buf, false);
        let errs = out.read_available("a", &mut buf, true);
        assert_eq!(outs.len(), 2);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].contains(" [stderr] half broken"), "{errs:?}");
        assert_eq!(text_of(&errs[0]), ("half broken", true));
        assert_eq!(text_of(&outs[1]), ("also fine", false));
        assert_eq!(out.tail(10, true), errs);
        assert_eq!(out.tail(10, false).len(), 3);
        out.set_stderr_apart(false).expect("merge");
        assert!(out.fd(true).is_none());
    }

    #[test]
    fn a_missing_log_dir_is_made() {
        let dir = scratch("mkdir");
        let mut f = LogFile::new(dir.join("new/a.log"), 1 << 20, 2);
        f.append(b"one\n").expect("append");
        let text = std::fs::read_to_string(dir.join("new/a.log")).expect("log file");
        assert_eq!(text, "one\n");
    }

    #[test]
    fn rotation_keeps_n_files() {
        let dir = scratch("rotate");
        let mut f = LogFile::new(dir.join("r.log"), 100, 2);
        for i in 0..10 {
            f.append(format!("{i:>59}\n").as_bytes()).expect("append");
        }
        assert!(dir.join("r.log").exists());
        assert!(dir.join("r.log.1").exists());
        assert!(dir.join("r.log.2").exists());
        assert!(!dir.join("r.log.3").exists());
        assert!(std::fs::metadata(dir.join("r.log")).expect("meta").len() <= 100);
    }

    #[test]
    fn rotation_decisions() {
        // Fits: all of it.
        assert_eq!(fitting(b"a\nb\n", 0, 10), 4);
        // Only whole lines that fit.
        assert_eq!(fitting(b"aaa\nbbb\n", 2, 8), 4);
        // Not one line fits: rotate first.
        assert_eq!(fitting(b"aaa\nbbb\n", 7, 8), 0);
        // A line longer than the limit goes whole into an empty file.
        assert_eq!(fitting(b"aaaaaaaaaaaa\nb\n", 0, 5), 13);
    }

    #[test]
    fn one_big_append_is_rotated_at_line_ends() {
        let dir = scratch("big");
        let mut f = LogFile::new(dir.join("b.log"), 100, 3);
        let text: String = (0..10).map(|i| format!("{i:>29}\n")).collect();
        f.append(text.as_bytes()).expect("append");
        let mut back = String::new();
        for name in ["b.log.3", "b.log.2", "b.log.1", "b.log"] {
            let t = std::fs::read_to_string(dir.join(name)).expect(name);
            assert!(t.len() <= 100 && t.ends_with('\n'), "{name}: {t:?}");
            back += &t;
        }
        assert_eq!(back, text);
    }

    #[test]
    fn a_write_error_is_returned_and_the_file_opened_again() {
        // /dev/full fails every write with ENOSPC, like a full disk.
        let mut f = LogFile::new("/dev/full".into(), 1 << 20, 0);
        assert!(f.append(b"a\n").is_err());
        assert!(
            f.file.is_none(),
            "closed, so the next append opens it again"
        );
    }

    #[test]
    fn rings_merge_by_stamp_and_keep_the_last_n() {
        let a: Vec<String> = ["2026-01-01T00:00:01.000Z a1", "2026-01-01T00:00:03.000Z a3"]
            .map(String::from)
            .to_vec();
        let b: Vec<String> = [
            "2026-01-01T00:00:02.000Z b2",
            "2026-01-01T00:00:03.000Z b3",
            "2026-01-01T00:00:04.000Z b4",
        ]
        .map(String::from)
        .to_vec();
        let run = |n: usize| -> Vec<String> {
            let sources: Vec<(&str, Box<dyn Iterator<Item = &String>>)> = vec![
                ("a", Box::new(a.iter().rev())),
                ("b", Box::new(b.iter().rev())),
            ];
            last_merged(sources, n)
                .into_iter()
                .map(|(s, l)| format!("{s}:{}", text_of(l).0))
                .collect()
        };
        // In time order; equal stamps in the order of the sources.
        assert_eq!(run(10), ["a:a1", "b:b2", "a:a3", "b:b3", "b:b4"]);
        assert_eq!(run(3), ["a:a3", "b:b3", "b:b4"]);
        assert!(run(0).is_empty());
    }

    #[test]
    fn markers_are_told_from_output() {
        let mut out = Output::new(true).expect("pipes");
        let started = out.note(&started_marker(Some("1.2.0"), 1234));
        assert!(
            started.ends_with(" --- started: version 1.2.0, pid 1234"),
            "{started}"
        );
        assert!(is_marker(&started));
        let ran = std::time::Duration::from_millis(2150);
        let exited = exited_marker("code 3", ran, 1234);
        assert_eq!(exited, "--- exited: code 3 after 2.1s (pid 1234)");
        assert!(is_marker(&format!("2026-01-01T00:00:00.000Z {exited}")));
        assert!(!is_marker("2026-01-01T00:00:00.000Z --- a yaml document"));
        assert!(!is_marker(
            "2026-01-01T00:00:00.000Z [stderr] --- started: x"
        ));
        assert_eq!(out.kept().count(), 1);
        assert_eq!(stamp_of(&started).len(), 24);
    }

    #[test]
    fn long_lines_are_cut() {
        let mut partial = Vec::new();
        let lines = split(&mut partial, &vec![b'x'; LINE_MAX * 2 + 10], "t ");
        assert_eq!(lines.len(), 2);
        assert!(lines.iter().all(|l| l.len() == LINE_MAX + 2));
        assert_eq!(partial.len(), 10);
    }
}
