//! Reading `/proc`: process start times and groups, so a pid that was reused is never
//! mistaken for a service left by a previous supd.

use std::fs;

/// What `/proc/PID/stat` says about one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub pid: i32,
    /// Process state letter (R, S, D, Z, ...).
    pub state: char,
    pub ppid: i32,
    pub pgrp: i32,
    /// The session: a service's processes keep its leader's unless they call `setsid`.
    pub session: i32,
    /// Start time in clock ticks since boot: with the pid, it names one process.
    pub start_time: u64,
}

/// Parses the text of `/proc/PID/stat`. The command name may hold spaces and
/// parentheses, so fields are counted from the last ')'.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let pid = text.split_whitespace().next()?.parse().ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) pgrp(5) session(6) ... starttime(22): indices from
    // 0 = field 3.
    Some(Stat {
        pid,
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
        start_time: f.get(19)?.parse().ok()?,
    })
}

/// The stat of a live (or zombie) process, or `None` when there is none.
pub fn stat(pid: i32) -> Option<Stat> {
    use std::io::Read;
    // One read, on every start's path: the line is a few hundred bytes, and procfs gives
    // all of it to a read of a buffer that holds it (`read_to_string` made six, growing
    // its buffer from 32 bytes).
    let mut buf = [0u8; 1024];
    let mut f = fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let n = loop {
        match f.read(&mut buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    };
    parse_stat(std::str::from_utf8(&buf[..n]).ok()?)
}

/// The text of `/proc/PID/cgroup` (a process's cgroup in each hierarchy), in one read;
/// `None` when there is no such process.
pub fn cgroup(pid: i32) -> Option<String> {
    use std::io::Read;
    let mut buf = [0u8; 4096];
    let mut f = fs::File::open(format!("/proc/{pid}/cgroup")).ok()?;
    let n = loop {
        match f.read(&mut buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    };
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// The environment `pid` was started with (`/proc/PID/environ`), or `None` when it
/// cannot be read. The file shows the process's memory at each read(2), and a process
/// that execs between two reads ends the file early: read piecemeal (as `fs::read`
/// does, from 32 bytes up), a fork caught on its way to exec shows only the first
/// variables of its environment. So it is read in one call, with a buffer grown and
/// the read made again until one call holds all of it.
pub fn environ(pid: i32) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = fs::File::open(format!("/proc/{pid}/environ")).ok()?;
    let mut buf = vec![0u8; ENVIRON_FIRST];
    loop {
        let n = loop {
            match file.read_at(&mut buf, 0) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => break r.ok()?,
            }
        };
        if n < buf.len() || buf.len() >= ENVIRON_MAX {
            buf.truncate(n);
            return Some(buf);
        }
        buf.resize(buf.len() * 2, 0);
    }
}

/// The first buffer for an environment, and the largest: argv and environment together
/// are bounded by a quarter of the stack limit, 2 MiB under the usual 8 MiB.
const ENVIRON_FIRST: usize = 64 << 10;
const ENVIRON_MAX: usize = 16 << 20;

/// Every process in the system, for a scan of groups; unreadable entries are skipped.
pub fn all() -> Vec<Stat> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter_map(stat)
        .collect()
}

/// Sends `sig` to `pid` if it is still the process that started at `start_time` (and
/// not a zombie): the stand-in for a pidfd's exact signal on kernels without pidfds
/// (before 5.3). The pid could be taken by another process between the check and the
/// kill only if the checked process were reaped in between; ESRCH is not an error.
pub fn kill_if_same(pid: i32, start_time: u64, sig: nix::sys::signal::Signal) {
    if is_same(pid, start_time) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

/// Whether `pid` is still the process that started at `start_time`, and not a zombie.
pub fn is_same(pid: i32, start_time: u64) -> bool {
    stat(pid).is_some_and(|s| s.start_time == start_time && s.state != 'Z')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_spaces_and_parens() {
        let text = "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10 18446744073709551615";
        let s = parse_stat(text).expect("parse");
        assert_eq!(
            (s.pid, s.state, s.ppid, s.pgrp, s.session, s.start_time),
            (1234, 'S', 1, 1234, 1234, 98765)
        );
    }

    #[test]
    fn reads_itself() {
        let me = stat(std::process::id() as i32).expect("own stat");
        assert_eq!(me.pid, std::process::id() as i32);
        assert!(me.start_time > 0);
        assert!(stat(i32::MAX).is_none());
    }
}
