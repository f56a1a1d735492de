//! Unpacking a verified .tar.gz into a new directory, trusting no entry.
//!
//! Every entry is checked before it is written, and one refused entry fails the whole
//! unpack (the caller removes the half-made directory):
//! - its path is relative and has no `..` (`.` components are dropped; `./` is the root);
//! - it is a regular file, a directory or a symlink (a pax global header, as `git archive`
//!   writes, is skipped); hard links, devices, fifos and unknown kinds are refused;
//! - its path goes through no symlink, and it replaces nothing but a regular file by a
//!   regular file or a directory by a directory, so every entry, symlinks included, lands at
//!   the real place its name says;
//! - a symlink's target is relative, with `..` only at its start and no more of them than
//!   the link is deep (`bin/tool -> ../lib/tool` is fine, `a/../b` and `../../x` from
//!   `bin/` are not).
//!
//! Why that keeps every symlink inside: a link's leading `..`s climb from its real parent
//! directory to a real directory inside; the names after it only go down, and where one is
//! itself a symlink, that link too resolves inside by the same rule. So nothing can be
//! reached outside the version directory through the unpacked tree.
//!
//! Modes are kept less group and other write (setuid, setgid and sticky bits are dropped);
//! owners are never set from the archive (files belong to who unpacks: root); mtimes are
//! kept. Directory modes are set at the end, deepest first, so a read-only directory in the
//! archive does not stop its own content from being written.

use super::FetchError;
use flate2::bufread::MultiGzDecoder;
use std::fs::{self, DirBuilder, File};
use std::io::{self, BufReader};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use tar::EntryType;

/// Mode bits never taken from the archive.
const MASK: u32 = 0o022;

/// Unpacks the .tar.gz open as `file` (named `archive` in messages) into `dst`, which
/// must not exist yet.
pub(super) fn unpack(file: File, archive: &Path, dst: &Path) -> Result<(), FetchError> {
    DirBuilder::new()
        .mode(0o700)
        .create(dst)
        .and_then(|()| fs::set_permissions(dst, fs::Permissions::from_mode(0o755)))
        .map_err(|e| FetchError::Io(format!("cannot make {}: {e}", dst.display())))?;

    let mut tar = tar::Archive::new(MultiGzDecoder::new(BufReader::new(file)));
    tar.set_mask(MASK);
    tar.set_preserve_permissions(false);
    tar.set_preserve_ownerships(false);
    tar.set_unpack_xattrs(false);
    let bad = |e: &dyn std::error::Error| {
        FetchError::Unpack(format!(
            "{} is not a good .tar.gz: {}",
            archive.display(),
            chain(e)
        ))
    };
    let mut dirs: Vec<(PathBuf, u32)> = Vec::new();
    for entry in tar.entries().map_err(|e| bad(&e))? {
        let mut entry = entry.map_err(|e| bad(&e))?;
        let kind = entry.header().entry_type();
        if kind == EntryType::XGlobalHeader {
            continue;
        }
        let name = entry.path().map_err(|e| bad(&e))?.into_owned();
        let refused =
            |why: String| FetchError::Unpack(format!("the archive's entry {name:?} {why}"));
        let rel = relative(&name).map_err(refused)?;
        let shape = match kind {
            EntryType::Directory => Shape::Dir,
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => Shape::File,
            EntryType::Symlink => Shape::Symlink,
            EntryType::Link => return Err(refused("is a hard link: refused".into())),
            EntryType::Char | EntryType::Block => {
                return Err(refused("is a device file: refused".into()))
            }
            EntryType::Fifo => return Err(refused("is a fifo: refused".into())),
            other => return Err(refused(format!("is of a kind not taken ({other:?})"))),
        };
        if rel.as_os_str().is_empty() {
            match shape {
                Shape::Dir => continue, // `./`: the version directory itself
                _ => return Err(refused("has no name".into())),
            }
        }
        if shape == Shape::Symlink {
            let target = entry
                .link_name()
                .map_err(|e| bad(&e))?
                .ok_or_else(|| refused("is a symlink without a target".into()))?
                .into_owned();
            let depth = rel.components().count() - 1;
            link_target_ok(depth, &target)
                .map_err(|why| refused(format!("is a symlink to {target:?}, which {why}")))?;
        }
        let path = place(dst, &rel, shape).map_err(|e| match e {
            Placed::Refused(why) => refused(why),
            Placed::Io(m) => FetchError::Unpack(m),
        })?;
        if shape == Shape::Dir {
            let mode = entry.header().mode().unwrap_or(0o755);
            dirs.push((path, mode & 0o777 & !MASK));
            continue;
        }
        entry.unpack(&path).map_err(|e| {
            FetchError::Unpack(format!(
                "cannot unpack {name:?} to {}: {}",
                path.display(),
                chain(&e)
            ))
        })?;
    }
    for (path, mode) in dirs.iter().rev() {
        fs::set_permissions(path, fs::Permissions::from_mode(*mode)).map_err(|e| {
            FetchError::Unpack(format!("cannot set the mode of {}: {e}", path.display()))
        })?;
    }
    Ok(())
}

/// An error and its causes, in one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Dir,
    File,
    Symlink,
}

/// An entry's path made relative to the version directory: no root, no `..`.
fn relative(name: &Path) -> Result<PathBuf, String> {
    let mut rel = PathBuf::new();
    for c in name.components() {
        match c {
            Component::Normal(n) => rel.push(n),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err("has an absolute path: refused".into())
            }
            Component::ParentDir => return Err("has '..' in its path: refused".into()),
        }
    }
    Ok(rel)
}

/// Whether a symlink whose parent is `depth` directories below the version directory may
/// point to `target`; else why not.
fn link_target_ok(depth: usize, target: &Path) -> Result<(), &'static str> {
    if target.as_os_str().is_empty() {
        return Err("is empty");
    }
    let mut ups = 0;
    let mut named = false;
    for c in target.components() {
        match c {
            Component::RootDir | Component::Prefix(_) => return Err("is absolute"),
            Component::CurDir => {}
            Component::ParentDir if named => {
                return Err("has '..' after a name (only leading '..' are taken)")
            }
            Component::ParentDir => {
                ups += 1;
                if ups > depth {
                    return Err("leads out of the version directory");
                }
            }
            Component::Normal(_) => named = true,
        }
    }
    Ok(())
}

enum Placed {
    Refused(String),
    Io(String),
}

/// Makes the entry's missing parent directories (mode 0755) under `root` and returns where
/// it goes; refused when a parent is a symlink or not a directory, or when the entry would
/// replace anything but a regular file by one or a directory by one. A new directory entry
/// is made here (0700 until its mode is set at the end).
fn place(root: &Path, rel: &Path, shape: Shape) -> Result<PathBuf, Placed> {
    let io = |p: &Path, e: io::Error| Placed::Io(format!("cannot make {}: {e}", p.display()));
    let mut path = root.to_path_buf();
    let mut parts = rel.components().peekable();
    while let Some(part) = parts.next() {
        path.push(part);
        let last = parts.peek().is_none();
        let found = match fs::symlink_metadata(&path) {
            Ok(m) => Some(m.file_type()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&path, e)),
        };
        let shown = path.strip_prefix(root).unwrap_or(&path).display();
        match (last, found) {
            (false, Some(t)) if t.is_dir() => {}
            (false, Some(t)) if t.is_symlink() => {
                return Err(Placed::Refused(format!(
                    "goes through the symlink {shown}: refused"
                )))
            }
            (false, Some(_)) => {
                return Err(Placed::Refused(format!(
                    "goes through {shown}, which is not a directory"
                )))
            }
            (false, None) => DirBuilder::new()
                .mode(0o755)
                .create(&path)
                .map_err(|e| io(&path, e))?,
            (true, None) if shape == Shape::Dir => DirBuilder::new()
                .mode(0o700)
                .create(&path)
                .map_err(|e| io(&path, e))?,
            (true, None) => {}
            (true, Some(t)) => {
                let same = match shape {
                    Shape::Dir => t.is_dir(),
                    Shape::File => t.is_file(),
                    Shape::Symlink => false,
                };
                if !same {
                    return Err(Placed::Refused(format!(
                        "would replace {shown}, an earlier entry of another kind or a symlink"
                    )));
                }
            }
        }
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_paths_stay_relative() {
        assert_eq!(relative(Path::new("./a/./b")), Ok(PathBuf::from("a/b")));
        assert_eq!(relative(Path::new("./")), Ok(PathBuf::new()));
        assert!(relative(Path::new("/etc/x")).is_err());
        assert!(relative(Path::new("a/../../x")).is_err());
        assert!(relative(Path::new("a/..")).is_err());
    }

    #[test]
    fn symlink_targets_stay_inside() {
        assert!(link_target_ok(0, Path::new("lib/x")).is_ok());
        assert!(link_target_ok(0, Path::new(".")).is_ok());
        assert!(link_target_ok(1, Path::new("../lib/x")).is_ok());
        assert!(link_target_ok(2, Path::new("./../../x")).is_ok());
        assert!(link_target_ok(0, Path::new("../x")).is_err());
        assert!(link_target_ok(1, Path::new("../../x")).is_err());
        assert!(link_target_ok(3, Path::new("a/../x")).is_err());
        assert!(link_target_ok(3, Path::new("/etc/passwd")).is_err());
        assert!(link_target_ok(3, Path::new("")).is_err());
    }
}
