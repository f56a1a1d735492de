//! An old kernel for one process tree, on a new one: a seccomp filter, installed in the
//! child before it execs supd (and inherited by everything supd starts), that fails
//! every system call Linux 3.10 did not have with ENOSYS, and CLOCK_BOOTTIME timers
//! (Linux 3.15) with EINVAL, as the old kernels do; and an LD_PRELOAD library that
//! hides the cgroup files of newer kernels (`cgroup.kill`, 5.14; `cgroup.freeze`, 5.2),
//! which a filter on system calls cannot tell apart.

use super::Sandbox;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

/// The first system call number (x86_64) that Linux 3.10 did not have: 314 is
/// sched_setattr (3.14); everything after it is newer still (getrandom, statx,
/// pidfd_send_signal, pidfd_open, clone3, close_range, ...).
const FIRST_AFTER_3_10: u32 = 314;
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const CLOCK_BOOTTIME: u32 = 7;
const CLOCK_BOOTTIME_ALARM: u32 = 9;

fn stmt(code: u32, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The filter program: see the module's comment. Other architectures pass unfiltered
/// (the tests then say they are skipped: [`supported`]).
fn program() -> Vec<libc::sock_filter> {
    use libc::{BPF_ABS, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let allow = libc::SECCOMP_RET_ALLOW;
    let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    let einval = libc::SECCOMP_RET_ERRNO | libc::EINVAL as u32;
    // struct seccomp_data: nr at 0, arch at 4, args[0] at 16 (its low half first).
    vec![
        /* 0 */ stmt(BPF_LD | BPF_W | BPF_ABS, 4),
        /* 1 */ jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        /* 2 */ stmt(BPF_RET | BPF_K, allow),
        /* 3 */ stmt(BPF_LD | BPF_W | BPF_ABS, 0),
        /* 4 */ jump(BPF_JMP | BPF_JGE | BPF_K, FIRST_AFTER_3_10, 0, 1),
        /* 5 */ stmt(BPF_RET | BPF_K, enosys),
        /* 6 */
        jump(
            BPF_JMP | BPF_JEQ | BPF_K,
            libc::SYS_timerfd_create as u32,
            1,
            0,
        ),
        /* 7 */ stmt(BPF_RET | BPF_K, allow),
        /* 8 */ stmt(BPF_LD | BPF_W | BPF_ABS, 16),
        /* 9 */ jump(BPF_JMP | BPF_JEQ | BPF_K, CLOCK_BOOTTIME, 2, 0),
        /* 10 */ jump(BPF_JMP | BPF_JEQ | BPF_K, CLOCK_BOOTTIME_ALARM, 1, 0),
        /* 11 */ stmt(BPF_RET | BPF_K, allow),
        /* 12 */ stmt(BPF_RET | BPF_K, einval),
    ]
}

/// Whether this machine can pretend: the filter's numbers are x86_64's.
pub fn supported() -> bool {
    cfg!(target_arch = "x86_64")
}

/// Makes `cmd` (supd) and everything it starts see the system calls of Linux 3.10.
pub fn linux_3_10(cmd: &mut Command) {
    let filter = program();
    // SAFETY: the closure runs in the forked child before exec; it makes two prctl
    // calls on a program built before the fork (no allocation), and reports failure
    // as an error instead of running supd unfiltered.
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// An LD_PRELOAD library, built with `cc` into the sandbox, whose `open` family fails
/// with ENOENT for a path ending in any name `SUP_TEST_HIDE` lists (comma-separated).
pub fn hide_files_shim(sb: &Sandbox) -> PathBuf {
    super::preload::build(
        sb,
        "hide",
        r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
static int hidden(const char *path) {
    const char *list = getenv("SUP_TEST_HIDE");
    if (!list || !path) return 0;
    size_t plen = strlen(path);
    while (*list) {
        const char *end = strchr(list, ',');
        size_t n = end ? (size_t)(end - list) : strlen(list);
        if (n && plen > n && path[plen - n - 1] == '/' && !strncmp(path + plen - n, list, n))
            return 1;
        if (!end) break;
        list = end + 1;
    }
    return 0;
}
#define WRAP(name, ...) \
    static int (*real)(__VA_ARGS__); \
    if (!real) real = dlsym(RTLD_NEXT, name);
static mode_t mode_of(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, mode_t) : 0;
}
int open(const char *p, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t m = mode_of(flags, ap); va_end(ap);
    if (hidden(p)) { errno = ENOENT; return -1; }
    WRAP("open", const char *, int, mode_t) return real(p, flags, m);
}
int open64(const char *p, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t m = mode_of(flags, ap); va_end(ap);
    if (hidden(p)) { errno = ENOENT; return -1; }
    WRAP("open64", const char *, int, mode_t) return real(p, flags, m);
}
int openat(int d, const char *p, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t m = mode_of(flags, ap); va_end(ap);
    if (hidden(p)) { errno = ENOENT; return -1; }
    WRAP("openat", int, const char *, int, mode_t) return real(d, p, flags, m);
}
int openat64(int d, const char *p, int flags, ...) {
    va_list ap; va_start(ap, flags); mode_t m = mode_of(flags, ap); va_end(ap);
    if (hidden(p)) { errno = ENOENT; return -1; }
    WRAP("openat64", int, const char *, int, mode_t) return real(d, p, flags, m);
}
"#,
    )
}

/// Whether supd would get cgroups here: root, and a cgroup2 hierarchy holding this
/// process's cgroup.
pub fn has_cgroup2() -> bool {
    super::is_root()
        && fs::read_to_string("/proc/self/cgroup")
            .is_ok_and(|t| t.lines().any(|l| l.starts_with("0::")))
        && fs::read_to_string("/proc/self/mountinfo")
            .is_ok_and(|t| t.lines().any(|l| l.contains(" - cgroup2 ")))
}
