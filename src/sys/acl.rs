//! The POSIX access ACL of a path, for the access rule's edge (`access.rs`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
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
