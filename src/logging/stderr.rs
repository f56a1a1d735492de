//! supd's own standard error, never waited for. Its messages wait in a bounded queue
//! (64 KiB) as records of whole lines of at most `PIPE_BUF` bytes, each written in one
//! write when fd 2 can take it: at once when it can, else when the loop sees `POLLOUT`
//! ([`waiting`]). What does not fit is counted and said once stderr has taken all
//! that waited.
//!
//! fd 2 is shared (a terminal, a pipe to a logger, the log writer's console lines of
//! `log = "inherit"` services), so `O_NONBLOCK` is never set on its open file
//! description. Instead:
//! - a pipe, FIFO or terminal is opened again through `/proc/self/fd/2`, non-blocking:
//!   a description of supd's own of the same pipe or terminal (a write of at most
//!   `PIPE_BUF` bytes to a pipe is whole or not at all, so no line is torn or mixed
//!   with the writer's);
//! - a socket (journald's stream) is written with `send(MSG_DONTWAIT)`;
//! - a regular file or a block device with plain writes (a file on an NFS mount that
//!   hangs would block them: not covered);
//! - when the reopen fails (no /proc, no permission, a pty master, whose reopen would
//!   make a new terminal): a poll for room with no timeout, then one write of at most
//!   `PIPE_BUF` bytes, which a pipe with room takes without waiting (another writer
//!   filling it between the two, or a terminal with less room than the write, could
//!   still make it wait: the reopen is tried again whenever stderr is full).

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::stat::{Mode, SFlag};
use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;

/// The longest write that a pipe takes whole or not at all.
pub const PIPE_BUF: usize = 4096;
/// Bytes of messages that wait for stderr, at most.
pub const CAP: usize = 64 * 1024;

/// What waits for stderr.
#[derive(Debug)]
pub struct Queue {
    /// Whole lines, each record at most `PIPE_BUF` bytes.
    records: VecDeque<Vec<u8>>,
    /// Bytes of the first record already written (a partial write to a terminal).
    head: usize,
    bytes: usize,
    cap: usize,
    /// Messages that did not fit since stderr last took everything.
    lost: u64,
}

impl Queue {
    pub fn new(cap: usize) -> Queue {
        Queue {
            records: VecDeque::new(),
            head: 0,
            bytes: 0,
            cap,
            lost: 0,
        }
    }

    /// Queues one message's records, all of them or (counted as lost) none.
    pub fn push(&mut self, records: Vec<Vec<u8>>) {
        let len: usize = records.iter().map(Vec::len).sum();
        if self.bytes + len > self.cap {
            self.lost += 1;
            return;
        }
        self.bytes += len;
        self.records.extend(records);
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    #[cfg(test)]
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// The next write: what is left of the first record, then whole records, at most
    /// `PIPE_BUF` bytes (never a record cut at its end).
    pub fn chunk(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, r) in self.records.iter().enumerate() {
            let r = if i == 0 {
                &r[self.head.min(r.len())..]
            } else {
                r
            };
            if i > 0 && out.len() + r.len() > PIPE_BUF {
                break;
            }
            out.extend_from_slice(r);
        }
        out
    }

    /// `n` bytes of the last [`chunk`](Self::chunk) were written.
    pub fn written(&mut self, mut n: usize) {
        while n > 0 {
            let Some(first) = self.records.front() else {
                return;
            };
            let left = first.len() - self.head;
            if n < left {
                self.head += n;
                return;
            }
            n -= left;
            self.bytes -= first.len();
            self.head = 0;
            self.records.pop_front();
        }
    }

    /// Once everything that waited is written: how many messages were lost, to be said
    /// (said once: the count starts again).
    pub fn take_lost(&mut self) -> Option<u64> {
        if !self.is_empty() || self.lost == 0 {
            return None;
        }
        Some(std::mem::take(&mut self.lost))
    }

    /// Queues the notice of what was lost (beyond the bound: it is one line).
    pub fn push_notice(&mut self, records: Vec<Vec<u8>>) {
        self.bytes += records.iter().map(Vec::len).sum::<usize>();
        self.records.extend(records);
    }

    /// stderr cannot be written at all (nobody can read it): everything goes.
    pub fn drop_all(&mut self) {
        *self = Queue::new(self.cap);
    }
}

/// A formatted message (lines each ending in a newline) as records: whole lines packed
/// into records of at most `PIPE_BUF` bytes, a longer line cut into pieces that each end
/// in a newline (cut between characters).
pub fn records(text: &str) -> Vec<Vec<u8>> {
    if text.len() <= PIPE_BUF {
        return vec![text.as_bytes().to_vec()];
    }
    let mut out = Vec::new();
    let mut cur: Vec<u8> = Vec::new();
    for line in text.split_inclusive('\n') {
        let line = line.strip_suffix('\n').unwrap_or(line);
        let mut rest = line;
        loop {
            let mut cut = rest.len().min(PIPE_BUF - 1);
            while !rest.is_char_boundary(cut) {
                cut -= 1;
            }
            let (piece, more) = rest.split_at(cut);
            if cur.len() + piece.len() + 1 > PIPE_BUF {
                out.push(std::mem::take(&mut cur));
            }
            cur.extend_from_slice(piece.as_bytes());
            cur.push(b'\n');
            rest = more;
            if rest.is_empty() {
                break;
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// How supd writes to its stderr without waiting.
#[derive(Debug)]
pub enum Out {
    /// Its own non-blocking description of fd 2's pipe, FIFO or terminal.
    Own(&'static OwnedFd),
    /// A socket: `send(MSG_DONTWAIT)`.
    Socket,
    /// A regular file or block device: plain writes.
    File,
    /// A poll with no timeout, then one write of at most `PIPE_BUF` bytes.
    Guarded,
    /// fd 2 is closed: messages go nowhere.
    Closed,
}

/// supd's own description of fd 2's pipe or terminal, opened once.
static OWN: OnceLock<OwnedFd> = OnceLock::new();

fn fd2() -> std::io::Stderr {
    std::io::stderr()
}

/// The way to write fd 2, looked at once (and again while it is `Guarded`).
pub fn open() -> Out {
    let st = match nix::sys::stat::fstat(fd2().as_fd()) {
        Ok(st) => st,
        Err(_) => return Out::Closed,
    };
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    match kind {
        SFlag::S_IFSOCK => Out::Socket,
        SFlag::S_IFIFO | SFlag::S_IFCHR => {
            // /dev/ptmx (5, 2): opening it again would make a new terminal.
            let ptmx = kind == SFlag::S_IFCHR && st.st_rdev == nix::sys::stat::makedev(5, 2);
            if ptmx {
                return Out::Guarded;
            }
            reopen(&st).map_or(Out::Guarded, Out::Own)
        }
        _ => Out::File,
    }
}

/// fd 2's pipe or terminal opened anew (non-blocking, close-on-exec, never taken as a
/// controlling terminal), if it is the same file.
fn reopen(st: &nix::sys::stat::FileStat) -> Option<&'static OwnedFd> {
    if let Some(fd) = OWN.get() {
        return Some(fd);
    }
    let flags = OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY;
    let fd = nix::fcntl::open("/proc/self/fd/2", flags, Mode::empty()).ok()?;
    let again = nix::sys::stat::fstat(&fd).ok()?;
    if (again.st_dev, again.st_ino, again.st_rdev) != (st.st_dev, st.st_ino, st.st_rdev) {
        return None;
    }
    Some(OWN.get_or_init(|| fd))
}

impl Out {
    /// One write of `chunk` (at most `PIPE_BUF` bytes), never waiting.
    pub fn write(&self, chunk: &[u8]) -> Result<usize, Errno> {
        match self {
            Out::Own(fd) => nix::unistd::write(fd, chunk),
            Out::Socket => nix::sys::socket::send(
                fd2().as_fd().as_raw_fd(),
                chunk,
                nix::sys::socket::MsgFlags::MSG_DONTWAIT | nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
            ),
            Out::File => nix::unistd::write(fd2().as_fd(), chunk),
            Out::Guarded => {
                let err = fd2();
                let mut fds = [PollFd::new(err.as_fd(), PollFlags::POLLOUT)];
                match poll(&mut fds, PollTimeout::ZERO) {
                    Ok(n) if n > 0 => nix::unistd::write(err.as_fd(), chunk),
                    Ok(_) => Err(Errno::EAGAIN),
                    Err(e) => Err(e),
                }
            }
            Out::Closed => Ok(chunk.len()),
        }
    }
}

/// The fd the loop polls for `POLLOUT` while messages wait.
pub enum Waiting {
    Own(&'static OwnedFd),
    Fd2(std::io::Stderr),
}

impl AsFd for Waiting {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Waiting::Own(fd) => fd.as_fd(),
            Waiting::Fd2(e) => e.as_fd(),
        }
    }
}

/// supd's stderr: how it is written and what waits for it.
pub struct Stderr {
    pub out: Out,
    pub queue: Queue,
}

impl Stderr {
    pub fn new() -> Stderr {
        Stderr {
            out: open(),
            queue: Queue::new(CAP),
        }
    }

    /// Writes what waits as far as stderr takes it now; once all is written, the notice
    /// of what was lost (`notice` formats it) is queued and written too.
    pub fn write_some(&mut self, notice: impl Fn(u64) -> String) {
        loop {
            if self.queue.is_empty() {
                match self.queue.take_lost() {
                    Some(n) => self.queue.push_notice(records(&notice(n))),
                    None => return,
                }
            }
            let chunk = self.queue.chunk();
            match self.out.write(&chunk) {
                Ok(0) => return self.queue.drop_all(),
                Ok(n) => self.queue.written(n),
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => {
                    // Full: a `Guarded` stderr may be reopened by now (/proc mounted).
                    if matches!(self.out, Out::Guarded) {
                        if let Out::Own(fd) = open() {
                            self.out = Out::Own(fd);
                        }
                    }
                    return;
                }
                // Nobody can read it (EPIPE: the reader is gone; EIO: a hung-up
                // terminal): nothing is kept for it.
                Err(_) => return self.queue.drop_all(),
            }
        }
    }

    /// The fd to poll for room while something waits.
    pub fn waiting(&self) -> Option<Waiting> {
        if self.queue.is_empty() {
            return None;
        }
        match self.out {
            Out::Own(fd) => Some(Waiting::Own(fd)),
            Out::Closed => None,
            Out::Socket | Out::File | Out::Guarded => Some(Waiting::Fd2(fd2())),
        }
    }
}

impl Default for Stderr {
    fn default() -> Self {
        Stderr::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(s: &str) -> Vec<Vec<u8>> {
        vec![s.as_bytes().to_vec()]
    }

    #[test]
    fn a_message_that_does_not_fit_is_counted_whole() {
        let mut q = Queue::new(10);
        q.push(rec("aaaa\n"));
        q.push(rec("bbbbbb\n"));
        q.push(rec("cc\n"));
        assert_eq!(q.chunk(), b"aaaa\ncc\n");
        assert_eq!(q.lost(), 1);
        assert_eq!(q.take_lost(), None, "said once all that waited is written");
        q.written(8);
        assert!(q.is_empty());
        assert_eq!(q.take_lost(), Some(1));
        assert_eq!(q.take_lost(), None, "said once");
    }

    #[test]
    fn a_chunk_holds_whole_records_up_to_pipe_buf_and_a_partial_write_goes_on() {
        let mut q = Queue::new(CAP);
        let line = format!("{}\n", "x".repeat(1999));
        for _ in 0..3 {
            q.push(rec(&line));
        }
        assert_eq!(
            q.chunk().len(),
            4000,
            "two records; the third would pass PIPE_BUF"
        );
        q.written(2500);
        let c = q.chunk();
        assert_eq!(
            c.len(),
            1500 + 2000,
            "the rest of the second, then the third"
        );
        assert_eq!(c.iter().filter(|&&b| b == b'\n').count(), 2);
        q.written(c.len());
        assert!(q.is_empty());
        q.push(rec(&line));
        assert_eq!(
            q.chunk().len(),
            2000,
            "nothing left over of the last record"
        );
    }

    #[test]
    fn long_messages_are_whole_lines_of_at_most_pipe_buf() {
        let text = format!("[x] {}\nsecond\n{}\n", "é".repeat(3000), "y".repeat(10));
        let recs = records(&text);
        assert!(recs
            .iter()
            .all(|r| r.len() <= PIPE_BUF && r.ends_with(b"\n")));
        let joined: Vec<u8> = recs.concat();
        let s = String::from_utf8(joined).expect("cut between characters");
        assert_eq!(s.replace('\n', ""), text.replace('\n', ""));
        assert_eq!(records("short\n"), rec("short\n"));
    }

    #[test]
    fn a_full_pipe_is_never_waited_for_and_lines_stay_whole() {
        // A pipe written through a non-blocking description, as supd's own reopened
        // one, with the blocking one kept as fd 2 would be.
        let (rd, wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe");
        let path = format!("/proc/self/fd/{}", wr.as_raw_fd());
        let own = nix::fcntl::open(
            path.as_str(),
            OFlag::O_WRONLY | OFlag::O_NONBLOCK,
            Mode::empty(),
        )
        .expect("reopen the pipe");
        let own: &'static OwnedFd = Box::leak(Box::new(own));
        let mut s = Stderr {
            out: Out::Own(own),
            queue: Queue::new(CAP),
        };
        let line = format!("{}\n", "z".repeat(99));
        for _ in 0..2000 {
            s.queue.push(rec(&line));
            s.write_some(|n| format!("{n} lost\n"));
        }
        assert!(s.waiting().is_some(), "the pipe is full: the rest waits");
        assert!(s.queue.lost() > 0);
        let mut got = Vec::new();
        let mut f = std::fs::File::from(rd);
        nix::fcntl::fcntl(&f, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).expect("fcntl");
        let mut buf = vec![0u8; 65536];
        loop {
            use std::io::Read;
            match f.read(&mut buf) {
                Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => {}
            }
            s.write_some(|n| format!("{n} lost\n"));
            if s.waiting().is_none() {
                let _ = f.read(&mut buf).map(|n| got.extend_from_slice(&buf[..n]));
                break;
            }
        }
        let text = String::from_utf8(got).expect("utf-8");
        let (body, last) = text.trim_end().rsplit_once('\n').expect("lines");
        assert!(body.lines().all(|l| l.len() == 99), "whole lines only");
        let n: usize = last
            .strip_suffix(" lost")
            .expect("the notice")
            .parse()
            .expect("n");
        assert_eq!(
            body.lines().count() + n,
            2000,
            "each line written or counted"
        );
        drop(wr);
    }
}
