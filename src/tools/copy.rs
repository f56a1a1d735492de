//! The copy of an install, run in a helper process (`sys::fork_worker`): `cp -a` less
//! what is dangerous. Every entry keeps its mode exactly (set with `fchmod` after it is
//! made, so supd's umask, 0 as an init or 077 under a service manager, changes
//! nothing), its owner when supd is root, its times, symbolic links as links and hard
//! links within the tree as links. Nothing is ever made readable, writable or
//! executable by anyone the source did not allow.
//!
//! Refused unless the operator asks for them (`install --allow-special`): set-user-ID
//! and set-group-ID files, device nodes, FIFOs and sockets (a build has none; a FIFO
//! read would block the copy; a setuid program or a device node gives its rights to
//! whoever can reach it). Asked for, they are made with their own mode, no wider.
//!
//! Not copied: extended attributes (so file capabilities and SELinux labels are not
//! carried: nothing gains a right) and access ACLs, whose files are refused: their group
//! bits are the ACL's mask, which would become the group's own right.
//!
//! The first entry that cannot be copied as it is ends the copy with its path and the
//! reason; supd then deletes the staging, so nothing is half installed.

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{
    fchmod, fchmodat, fstat, fstatat, futimens, mkdirat, mknodat, utimensat, FchmodatFlags,
    FileStat, Mode, SFlag, UtimensatFlags,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, symlinkat, Gid, Uid};
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// What an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

impl Kind {
    fn of(mode: u32) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFCHR => Kind::CharDevice,
            libc::S_IFBLK => Kind::BlockDevice,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            _ => Kind::File,
        }
    }
}

/// Why an entry of kind `kind` and permission bits `mode` (07777) is not copied without
/// `--allow-special`; `None`: it is copied as it is.
pub fn refusal(kind: Kind, mode: u32) -> Option<String> {
    let what = match kind {
        Kind::File | Kind::Dir | Kind::Symlink => {
            // A directory's setgid bit gives no right (new files take its group), and
            // Linux ignores its setuid bit: kept as they are.
            if kind != Kind::File {
                return None;
            }
            match (mode & 0o4000 != 0, mode & 0o2000 != 0) {
                (false, false) => return None,
                (true, false) => "is set-user-ID",
                (false, true) => "is set-group-ID",
                (true, true) => "is set-user-ID and set-group-ID",
            }
        }
        Kind::CharDevice => "is a character device",
        Kind::BlockDevice => "is a block device",
        Kind::Fifo => "is a FIFO",
        Kind::Socket => "is a socket",
    };
    Some(format!(
        "{what} (mode {mode:04o}): install copies such files only with --allow-special"
    ))
}

/// How a copy goes.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Set-user-ID and set-group-ID files, device nodes, FIFOs and sockets are copied.
    pub allow_special: bool,
}

/// Copies the contents of directory `src` into the empty directory `dst` (the staging,
/// made by supd), then gives `dst` the mode, owner and times of `src`. On error: the
/// path (in `src`) and why.
pub fn copy_tree(src: &Path, dst: &Path, opts: Options) -> Result<(), String> {
    let at = |p: &Path, e: &dyn std::fmt::Display| format!("{}: {e}", p.display());
    let d = openat(
        nix::fcntl::AT_FDCWD,
        dst,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| at(dst, &e))?;
    // Private while it is filled: no one plants anything in it, whatever the umask
    // it was made with; and it must be empty (made by supd for this copy).
    fchmod(&d, Mode::from_bits_truncate(0o700)).map_err(|e| at(dst, &e))?;
    if entries(&d).map_err(|e| at(dst, &e))?.next().is_some() {
        return Err(format!("{}: the staging is not empty", dst.display()));
    }
    let s = openat(
        nix::fcntl::AT_FDCWD,
        src,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| at(src, &e))?;
    let st = fstat(&s).map_err(|e| at(src, &e))?;
    let staging = fstat(&d).map_err(|e| at(dst, &e))?;
    let staging = (staging.st_dev, staging.st_ino);
    if (st.st_dev, st.st_ino) == staging {
        return Err(format!("{}: {INTO_ITSELF}", src.display()));
    }
    let mut copy = Copy {
        opts,
        root: src.to_path_buf(),
        staging,
        root_dst: d.try_clone().map_err(|e| at(dst, &e))?,
        links: BTreeMap::new(),
        root_uid: Uid::effective().is_root(),
    };
    copy.dir_contents(&s, &d, Path::new(""))?;
    copy.finish(&d, &st, Path::new(""))?;
    nix::unistd::syncfs(&d).map_err(|e| at(dst, &e))
}

/// Why a source that holds the staging is refused (it would be copied into itself,
/// level after level, until the copy ran out of descriptors or stack).
const INTO_ITSELF: &str =
    "is this install's destination: the source holds it, and a directory is not copied into itself";

struct Copy {
    opts: Options,
    root: PathBuf,
    /// The staging's (device, inode): met in the source, it is not gone into.
    staging: (u64, u64),
    root_dst: OwnedFd,
    /// Files with more than one link: (device, inode) → their first copy's path in dst.
    links: BTreeMap<(u64, u64), PathBuf>,
    root_uid: bool,
}

/// The names in a directory, `.` and `..` left out.
fn entries(dir: &OwnedFd) -> nix::Result<impl Iterator<Item = OsString>> {
    let mut d = nix::dir::Dir::from_fd(dir.try_clone().map_err(|_| Errno::EMFILE)?)?;
    let names: nix::Result<Vec<OsString>> = d
        .iter()
        .filter_map(|e| {
            e.map(|e| OsStr::from_bytes(e.file_name().to_bytes()).to_os_string())
                .map(|n| (n != "." && n != "..").then_some(n))
                .transpose()
        })
        .collect();
    Ok(names?.into_iter())
}

impl Copy {
    fn path(&self, rel: &Path) -> String {
        self.root.join(rel).display().to_string()
    }

    fn err(&self, rel: &Path, what: &str, e: impl std::fmt::Display) -> String {
        format!("{}: {what}: {e}", self.path(rel))
    }

    fn dir_contents(&mut self, s: &OwnedFd, d: &OwnedFd, rel: &Path) -> Result<(), String> {
        let names = entries(s).map_err(|e| self.err(rel, "cannot list it", e))?;
        for name in names {
            let rel = rel.join(&name);
            self.entry(s, d, &name, &rel)?;
        }
        Ok(())
    }

    fn entry(&mut self, s: &OwnedFd, d: &OwnedFd, name: &OsStr, rel: &Path) -> Result<(), String> {
        let st = fstatat(s, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| self.err(rel, "cannot stat it", e))?;
        let kind = Kind::of(st.st_mode);
        let perm = st.st_mode & 0o7777;
        if !self.opts.allow_special {
            if let Some(why) = refusal(kind, perm) {
                return Err(format!("{}: {why}", self.path(rel)));
            }
        }
        if kind != Kind::Symlink && has_acl(&self.root.join(rel)) {
            return Err(format!(
                "{}: has an access ACL, which install does not copy (its group bits are the ACL's mask)",
                self.path(rel)
            ));
        }
        if kind != Kind::Dir && st.st_nlink > 1 {
            let key = (st.st_dev, st.st_ino);
            if let Some(first) = self.links.get(&key) {
                return linkat(&self.root_dst, first, d, name, AtFlags::empty())
                    .map_err(|e| self.err(rel, "cannot link it", e));
            }
            self.links.insert(key, rel.to_path_buf());
        }
        match kind {
            Kind::Dir => {
                mkdirat(d, name, Mode::from_bits_truncate(0o700))
                    .map_err(|e| self.err(rel, "cannot make it", e))?;
                let flags =
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
                let sub = openat(s, name, flags, Mode::empty())
                    .map_err(|e| self.err(rel, "cannot open it", e))?;
                same(&sub, &st).map_err(|e| self.err(rel, "cannot open it", e))?;
                if (st.st_dev, st.st_ino) == self.staging {
                    return Err(format!("{}: {INTO_ITSELF}", self.path(rel)));
                }
                let dsub = openat(d, name, flags, Mode::empty())
                    .map_err(|e| self.err(rel, "cannot open its copy", e))?;
                self.dir_contents(&sub, &dsub, rel)?;
                self.finish(&dsub, &st, rel)
            }
            Kind::File => {
                let from =
                    open_file(s, name, &st).map_err(|e| self.err(rel, "cannot open it", e))?;
                let to = openat(
                    d,
                    name,
                    OFlag::O_WRONLY
                        | OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                )
                .map_err(|e| self.err(rel, "cannot make its copy", e))?;
                let (from, to) = (File::from(from), File::from(to));
                copy_data(&from, &to, st.st_size as u64)
                    .map_err(|e| self.err(rel, "cannot copy it", e))?;
                self.finish(&OwnedFd::from(to), &st, rel)
            }
            Kind::Symlink => {
                let target = nix::fcntl::readlinkat(s, name)
                    .map_err(|e| self.err(rel, "cannot read the link", e))?;
                symlinkat(target.as_os_str(), d, name)
                    .map_err(|e| self.err(rel, "cannot make the link", e))?;
                if self.root_uid {
                    fchownat(
                        d,
                        name,
                        Some(Uid::from_raw(st.st_uid)),
                        Some(Gid::from_raw(st.st_gid)),
                        AtFlags::AT_SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| self.err(rel, "cannot keep its owner", e))?;
                }
                let (a, m) = times(&st);
                utimensat(d, name, &a, &m, UtimensatFlags::NoFollowSymlink)
                    .map_err(|e| self.err(rel, "cannot keep its times", e))
            }
            Kind::CharDevice | Kind::BlockDevice | Kind::Fifo | Kind::Socket => {
                let flag = SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT);
                // Made with no permission at all, then given its own: never wider.
                mknodat(d, name, flag, Mode::empty(), st.st_rdev)
                    .map_err(|e| self.err(rel, "cannot make it", e))?;
                self.owner_and_special_mode(d, name, &st, rel)?;
                let (a, m) = times(&st);
                utimensat(d, name, &a, &m, UtimensatFlags::NoFollowSymlink)
                    .map_err(|e| self.err(rel, "cannot keep its times", e))
            }
        }
    }

    /// A node's owner, then its mode (the staging is private: it is the node just made).
    fn owner_and_special_mode(
        &self,
        d: &OwnedFd,
        name: &OsStr,
        st: &FileStat,
        rel: &Path,
    ) -> Result<(), String> {
        self.check_owner_kept(st, rel)?;
        if self.root_uid {
            fchownat(
                d,
                name,
                Some(Uid::from_raw(st.st_uid)),
                Some(Gid::from_raw(st.st_gid)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| self.err(rel, "cannot keep its owner", e))?;
        }
        fchmodat(
            d,
            name,
            Mode::from_bits_truncate(st.st_mode & 0o7777),
            FchmodatFlags::FollowSymlink,
        )
        .map_err(|e| self.err(rel, "cannot keep its mode", e))
    }

    /// Not root, supd cannot give a copy another owner: a set-user-ID or set-group-ID
    /// file whose owner would change would mean another user's rights.
    fn check_owner_kept(&self, st: &FileStat, rel: &Path) -> Result<(), String> {
        if self.root_uid {
            return Ok(());
        }
        let suid = st.st_mode & 0o4000 != 0 && Kind::of(st.st_mode) == Kind::File;
        let sgid = st.st_mode & 0o2000 != 0 && Kind::of(st.st_mode) == Kind::File;
        if (suid && st.st_uid != Uid::effective().as_raw())
            || (sgid && st.st_gid != Gid::effective().as_raw())
        {
            return Err(format!(
                "{}: is set-user-ID or set-group-ID to an owner ({}:{}) that supd, not root, cannot keep",
                self.path(rel),
                st.st_uid,
                st.st_gid
            ));
        }
        Ok(())
    }

    /// Owner (as root), then mode (a change of owner clears setuid bits), then times.
    fn finish(&self, fd: &OwnedFd, st: &FileStat, rel: &Path) -> Result<(), String> {
        self.check_owner_kept(st, rel)?;
        if self.root_uid {
            fchown(
                fd,
                Some(Uid::from_raw(st.st_uid)),
                Some(Gid::from_raw(st.st_gid)),
            )
            .map_err(|e| self.err(rel, "cannot keep its owner", e))?;
        }
        let mode = st.st_mode & 0o7777;
        fchmod(fd, Mode::from_bits_truncate(mode))
            .map_err(|e| self.err(rel, "cannot keep its mode", e))?;
        // What fchmod did is checked: a file system may drop bits (setgid of a file
        // whose group the writer is not in), and a mode not kept fails the install.
        let got = fstat(fd).map_err(|e| self.err(rel, "cannot stat its copy", e))?;
        if got.st_mode & 0o7777 != mode {
            return Err(format!(
                "{}: its mode {mode:04o} was not kept (the copy has {:04o})",
                self.path(rel),
                got.st_mode & 0o7777
            ));
        }
        let (a, m) = times(st);
        futimens(fd, &a, &m).map_err(|e| self.err(rel, "cannot keep its times", e))
    }
}

/// The fd opened is the entry that was looked at.
fn same(fd: &OwnedFd, st: &FileStat) -> Result<(), String> {
    let now = fstat(fd).map_err(|e| e.to_string())?;
    if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)
        && now.st_mode & libc::S_IFMT == st.st_mode & libc::S_IFMT
    {
        Ok(())
    } else {
        Err("it was replaced while it was copied".into())
    }
}

/// Opens the regular file `name` (as `st` saw it) for reading, never anything else in
/// its place: opened with `O_NONBLOCK`, so a FIFO swapped in after the look at it does
/// not wait for a writer (a blocking open of a FIFO would, for ever), then checked to
/// be what was looked at, and made blocking again. A file held by a lease answers
/// `EWOULDBLOCK` then: it is opened again, blocking, through an `O_PATH` descriptor
/// checked first (`/proc/self/fd`: that inode, a regular file), so the open waits for
/// the lease's break as any reader's does.
fn open_file(s: &OwnedFd, name: &OsStr, st: &FileStat) -> Result<OwnedFd, String> {
    use nix::fcntl::{fcntl, FcntlArg};
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let fd = match openat(s, name, flags | OFlag::O_NONBLOCK, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::EAGAIN) => {
            let path = openat(
                s,
                name,
                OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| e.to_string())?;
            same(&path, st)?;
            let proc = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&path));
            // Followed: the magic link is that inode (O_NOFOLLOW would refuse it).
            let reopen = flags - OFlag::O_NOFOLLOW;
            openat(nix::fcntl::AT_FDCWD, proc.as_str(), reopen, Mode::empty()).map_err(|e| {
                format!("{e} (held by a lease, and /proc is needed to wait for it safely)")
            })?
        }
        Err(e) => return Err(e.to_string()),
    };
    same(&fd, st)?;
    let fl = OFlag::from_bits_truncate(fcntl(&fd, FcntlArg::F_GETFL).map_err(|e| e.to_string())?);
    fcntl(&fd, FcntlArg::F_SETFL(fl - OFlag::O_NONBLOCK)).map_err(|e| e.to_string())?;
    Ok(fd)
}

fn times(st: &FileStat) -> (TimeSpec, TimeSpec) {
    (
        TimeSpec::new(st.st_atime, st.st_atime_nsec),
        TimeSpec::new(st.st_mtime, st.st_mtime_nsec),
    )
}

/// Whether an entry has an access ACL beyond its mode bits (named users or groups).
fn has_acl(path: &Path) -> bool {
    use crate::access::{parse_acl, ACL_GROUP, ACL_MASK, ACL_USER};
    crate::sys::posix_acl(path)
        .and_then(|b| parse_acl(&b))
        .is_some_and(|acl| {
            acl.iter()
                .any(|e| matches!(e.tag, ACL_USER | ACL_GROUP | ACL_MASK))
        })
}

/// Copies `size` bytes, holes kept as holes where the file system tells them
/// (`SEEK_DATA`/`SEEK_HOLE`).
fn copy_data(from: &File, to: &File, size: u64) -> std::io::Result<()> {
    use nix::unistd::{lseek, Whence};
    let end = size as i64;
    let mut pos = 0i64;
    let mut buf = vec![0u8; 128 * 1024];
    while pos < end {
        let data = match lseek(from, pos, Whence::SeekData) {
            Ok(d) => d,
            // The rest is a hole.
            Err(Errno::ENXIO) => break,
            // No SEEK_DATA here: all of it is data.
            Err(_) => pos,
        };
        if data >= end {
            break;
        }
        let hole = match lseek(from, data, Whence::SeekHole) {
            Ok(h) if h > data => h.min(end),
            _ => end,
        };
        let mut off = data;
        while off < hole {
            let want = ((hole - off) as usize).min(buf.len());
            let n = from.read_at(&mut buf[..want], off as u64)?;
            if n == 0 {
                // It shrank meanwhile.
                return to.set_len(off as u64);
            }
            to.write_all_at(&buf[..n], off as u64)?;
            off += n as i64;
        }
        pos = hole;
    }
    to.set_len(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_files_and_directories_are_copied_whatever_their_mode() {
        for m in [0o644, 0o600, 0o640, 0o700, 0o755, 0o1777, 0o000] {
            assert_eq!(refusal(Kind::File, m), None);
            assert_eq!(refusal(Kind::Dir, m), None);
        }
        assert_eq!(refusal(Kind::Dir, 0o2775), None, "a setgid directory");
        assert_eq!(refusal(Kind::Symlink, 0o777), None);
    }

    #[test]
    fn setuid_setgid_devices_fifos_and_sockets_are_refused_saying_why() {
        let r = refusal(Kind::File, 0o4700).expect("setuid");
        assert!(r.contains("set-user-ID") && r.contains("4700") && r.contains("--allow-special"));
        assert!(refusal(Kind::File, 0o2755)
            .expect("setgid")
            .contains("set-group-ID"));
        assert!(refusal(Kind::CharDevice, 0o600)
            .expect("char")
            .contains("character device (mode 0600)"));
        assert!(refusal(Kind::BlockDevice, 0o600).is_some());
        assert!(refusal(Kind::Fifo, 0o644).expect("fifo").contains("FIFO"));
        assert!(refusal(Kind::Socket, 0o755)
            .expect("sock")
            .contains("socket"));
    }

    #[test]
    fn kinds_come_from_the_mode() {
        assert_eq!(Kind::of(libc::S_IFREG | 0o644), Kind::File);
        assert_eq!(Kind::of(libc::S_IFDIR | 0o755), Kind::Dir);
        assert_eq!(Kind::of(libc::S_IFLNK | 0o777), Kind::Symlink);
        assert_eq!(Kind::of(libc::S_IFCHR | 0o600), Kind::CharDevice);
        assert_eq!(Kind::of(libc::S_IFBLK), Kind::BlockDevice);
        assert_eq!(Kind::of(libc::S_IFIFO), Kind::Fifo);
        assert_eq!(Kind::of(libc::S_IFSOCK), Kind::Socket);
    }
}
