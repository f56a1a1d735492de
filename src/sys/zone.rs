//! The local time zone (for `supctl watch`'s times).
/// The local time zone's offset from UTC, in seconds, at `unix_secs` (for `supctl
/// watch`'s times); 0 where it cannot be known.
pub fn utc_offset(unix_secs: i64) -> i64 {
    let t = unix_secs as libc::time_t;
    // SAFETY: `tm` is plain data that localtime_r fills (zeroed is a valid value of it);
    // both pointers are to locals that outlive the call; localtime_r is the reentrant
    // form and keeps no pointer to them.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return 0;
        }
        tm.tm_gmtoff as i64
    }
}
