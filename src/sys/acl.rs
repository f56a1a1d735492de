//! The access rule's edge (the rule is `access.rs`): what `stat` and the POSIX access
//! ACL say of each component of a path, and a refused child's diagnosis, as its user.

use crate::access::{check, parse_acl, search, Node, Want, Who};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
/// The POSIX access ACL of `path` (its `system.posix_acl_access` extended attribute,
/// following symbolic links), raw; `None` when it has none or it cannot be read.
pub fn posix_acl(path: &std::path::Path) -> Option<Vec<u8>> {
    let p = CString::new(path.as_os_str().as_bytes()).ok()?;
    let name = c"system.posix_acl_access";
    let mut buf = vec![0u8; 4096];
    // SAFETY: getxattr reads two NUL-terminated strings that live across the call and
    // writes at most `buf.len()` bytes into `buf`, which is that long.
    let n = unsafe {
        libc::getxattr(
            p.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n <= 0 {
        return None;
    }
    buf.truncate(n as usize);
    Some(buf)
}

/// Gives `path` (mode 0660) an access ACL that lets group `gid` read and write it as
/// its owning group does: `u::rw-, g::rw-, g:GID:rw-, m::rw-, o::---` (the
/// `system.posix_acl_access` attribute, as `parse_acl` reads it).
pub fn grant_group_rw(path: &Path, gid: u32) -> std::io::Result<()> {
    const UNDEFINED: u32 = u32::MAX;
    let entries: [(u16, u16, u32); 5] = [
        (0x01, 6, UNDEFINED), // ACL_USER_OBJ
        (0x04, 6, UNDEFINED), // ACL_GROUP_OBJ
        (0x08, 6, gid),       // ACL_GROUP
        (0x10, 6, UNDEFINED), // ACL_MASK
        (0x20, 0, UNDEFINED), // ACL_OTHER
    ];
    let mut value = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        value.extend_from_slice(&tag.to_le_bytes());
        value.extend_from_slice(&perm.to_le_bytes());
        value.extend_from_slice(&id.to_le_bytes());
    }
    let p = CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let name = c"system.posix_acl_access";
    // SAFETY: setxattr reads two NUL-terminated strings and `value.len()` bytes of
    // `value`, all of which live across the call.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The components of `path` from `/` down, as `stat` sees them (symbolic links resolved
/// first), each owner said by `owner`. The edge of `check`.
pub fn stat_chain(path: &Path, owner: fn(u32, u32) -> String) -> Result<Vec<Node>, String> {
    let real = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut chain = Vec::new();
    let mut at = PathBuf::new();
    for part in real.components() {
        at.push(part);
        chain.push(node(&at, owner).map_err(|e| format!("{}: {e}", at.display()))?);
    }
    Ok(chain)
}

fn node(at: &Path, owner: fn(u32, u32) -> String) -> std::io::Result<Node> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(at)?;
    Ok(Node {
        path: at.to_path_buf(),
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        owner: owner(m.uid(), m.gid()),
        acl: posix_acl(at).and_then(|b| parse_acl(&b)),
        is_dir: m.is_dir(),
        script: m.is_file() && starts_with_shebang(at),
    })
}

/// An owner by name ("root:sup"; numbers where a name is unknown). Reads the user
/// database: only in a service's forked child, never in supd.
pub fn owner_names(uid: u32, gid: u32) -> String {
    use nix::unistd::{Gid, Group, Uid, User};
    let user = User::from_uid(Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or(uid.to_string(), |u| u.name);
    let group = Group::from_gid(Gid::from_raw(gid))
        .ok()
        .flatten()
        .map_or(gid.to_string(), |g| g.name);
    format!("{user}:{group}")
}

/// Why `who` was refused `path` (made absolute against `cwd`), told by the service's
/// child after its `chdir` or `execve` failed with EACCES, as its user, owners named.
/// As that user, a path below a directory it may not search cannot be resolved or
/// stated: then the components are stated as far as they can be, and the last one
/// reached is the directory that refuses. `None` when nothing on the way refuses (a
/// `noexec` mount, a security module): the caller says what the kernel said.
pub fn diagnose(path: &Path, cwd: &Path, who: &Who, want: Want) -> Option<String> {
    let path = cwd.join(path);
    if let Ok(chain) = stat_chain(&path, owner_names) {
        return check(&chain, who, want).err();
    }
    let mut chain = Vec::new();
    let mut at = PathBuf::new();
    for part in path.components() {
        at.push(part);
        match node(&at, owner_names) {
            Ok(n) => chain.push(n),
            Err(_) => return search(&chain, who).err(),
        }
    }
    check(&chain, who, want).err()
}

fn starts_with_shebang(p: &Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; 2];
    std::fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && head == *b"#!"
}
