//! Captured output of services: a pipe per service that outlives its processes (so no
//! output is lost across restarts), read without blocking and at most [`READ_MAX`]
//! bytes per wake-up, split into stamped lines and kept in a small ring for `supctl log`.
//! supd never opens a log file: the lines go to the log writer (`log_writer.rs`), a
//! process of its own that appends them to rotated files ([`LogFile`]), so a slow or hung
//! log disk blocks only that process. Lines that cannot be written are counted.

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

/// One service's output pipe and where its lines go.
pub struct Output {
    read: OwnedFd,
    /// Kept open by supd so the pipe never reports end-of-file between two processes;
    /// each process gets a duplicate as stdout and stderr.
    write: OwnedFd,
    partial: Vec<u8>,
    ring: VecDeque<String>,
    ring_bytes: usize,
    /// Lines lost since supd started: not taken by a stalled log writer, or not written
    /// by it (a full or failing disk).
    pub dropped: u64,
}

/// A rotated log file.
pub struct LogFile {
    pub path: PathBuf,
    pub max_size: u64,
    pub keep: u32,
    file: Option<File>,
    size: u64,
    /// The last append failed (said once, until one works again).
    pub failing: bool,
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
        }
    }

    /// Opens the file, making its directory first if it is missing (`log_dir` is made
    /// here, by the writer, so that a hung one blocks nothing else).
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
                        std::fs::create_dir_all(dir)?;
                    }
                    open()?
                }
                other => other?,
            };
            self.size = f.metadata().map(|m| m.len()).unwrap_or(0);
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
        if self.size > 0 && self.size + bytes.len() as u64 > self.max_size {
            self.rotate()?;
        }
        let f = self.open()?;
        f.write_all(bytes)?;
        self.size += bytes.len() as u64;
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

impl Output {
    /// A new pipe; its read end is non-blocking.
    pub fn new() -> io::Result<Output> {
        let (read, write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
        // The write end must block in the service (a service expects normal stdout).
        nix::fcntl::fcntl(
            &write,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
        )?;
        Ok(Output {
            read,
            write,
            partial: Vec::new(),
            ring: VecDeque::new(),
            ring_bytes: 0,
            dropped: 0,
        })
    }

    /// Both ends, for a handoff to a new supd image.
    pub fn fds(&self) -> (&OwnedFd, &OwnedFd) {
        (&self.read, &self.write)
    }

    /// The output of a previous supd image: its pipe (with whatever is unread in it),
    /// its kept lines and its count of dropped lines.
    pub fn adopt(read: OwnedFd, write: OwnedFd, lines: Vec<String>, dropped: u64) -> Output {
        let ring_bytes = lines.iter().map(String::len).sum();
        Output {
            read,
            write,
            partial: Vec::new(),
            ring: lines.into(),
            ring_bytes,
            dropped,
        }
    }

    /// The fd to poll for output.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }

    /// A duplicate of the write end, for a new process's stdout or stderr.
    pub fn writer(&self) -> io::Result<OwnedFd> {
        self.write.try_clone()
    }

    /// Reads what is there (bounded), keeps the complete lines, and returns them with
    /// their timestamps (for followers and the log file). `service` names the service in
    /// error messages.
    pub fn read_available(&mut self, service: &str, buf: &mut [u8]) -> Vec<String> {
        let limit = READ_MAX.min(buf.len());
        let n = match nix::unistd::read(&self.read, &mut buf[..limit]) {
            Ok(n) => n,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => return Vec::new(),
            Err(e) => {
                log::warn!("{service}: reading its output failed: {e}");
                return Vec::new();
            }
        };
        let lines = self.split(&buf[..n]);
        self.store(&lines);
        lines
    }

    fn split(&mut self, data: &[u8]) -> Vec<String> {
        let stamp = time::utc_stamp(std::time::SystemTime::now());
        let mut lines = Vec::new();
        for &b in data {
            if b == b'\n' || self.partial.len() >= LINE_MAX {
                let text = String::from_utf8_lossy(&self.partial);
                lines.push(format!("{stamp} {text}"));
                self.partial.clear();
                if b == b'\n' {
                    continue;
                }
            }
            self.partial.push(b);
        }
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

    /// The last `n` lines kept in memory.
    pub fn tail(&self, n: usize) -> Vec<String> {
        let skip = self.ring.len().saturating_sub(n);
        self.ring.iter().skip(skip).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sup-logs-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn lines_are_split_and_kept() {
        let mut out = Output::new().expect("pipe");
        nix::unistd::write(&out.write, b"one\ntw").expect("write");
        let mut buf = vec![0; READ_MAX];
        let got = out.read_available("a", &mut buf);
        assert_eq!(got.len(), 1);
        assert!(got[0].ends_with(" one"), "{got:?}");
        nix::unistd::write(&out.write, b"o\n").expect("write");
        let got = out.read_available("a", &mut buf);
        assert!(got[0].ends_with(" two"), "{got:?}");
        assert_eq!(out.tail(5).len(), 2);
        assert_eq!(out.tail(1), got);
        // Nothing there: no lines, no blocking.
        assert!(out.read_available("a", &mut buf).is_empty());
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
    fn long_lines_are_cut() {
        let mut out = Output::new().expect("pipe");
        let lines = out.split(&vec![b'x'; LINE_MAX * 2 + 10]);
        assert_eq!(lines.len(), 2);
        assert_eq!(out.partial.len(), 10);
    }
}
