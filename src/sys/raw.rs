//! Small raw pieces the other parts of `sys` share: this thread's errno, C strings, and
//! the answers of the once-only probe of what the kernel lacks.

use std::ffi::CString;
use std::io;

/// This thread's errno.
pub(super) fn errno_now() -> i32 {
    // SAFETY: __errno_location returns a valid pointer to this thread's errno.
    unsafe { *libc::__errno_location() }
}

/// A C string for a path or name; interior NULs become an error instead of a panic.
pub fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "contains a NUL byte"))
}

/// What this kernel lacks, learned once by a probe and remembered (a forked child reads
/// its parent's answer, so the probe runs in the parent: `sys::probe_kernel`).
pub(super) const UNKNOWN: u8 = 0;
pub(super) const PRESENT: u8 = 1;
pub(super) const MISSING: u8 = 2;
