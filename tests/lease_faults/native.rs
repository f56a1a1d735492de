//! The two small C programs of the test, built with `cc` into its directory at test time:
//! the leader-only engine (one binary per kind of version), and the LD_PRELOAD shim that steps the wall clock.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The engine: notes CLOCK_BOOTTIME as its first act, connects to the witness socket
/// (`WITNESS`), tries an exclusive `flock` on the shared `LOCK` without waiting, and says
/// `start NODE TERM PID T0 T1 LOCKED VERSION` (`SUP_VERSION`, the tool's version supd
/// runs). Then, by `MODE` (fixed when it is built, one binary per kind of version):
/// - good (0): says `ready T` and sends `READY=1` on `NOTIFY_SOCKET` (its service is
///   `ready = "notify"`), and runs until SIGTERM;
/// - crash (1): exits 3 at once (a crash loop);
/// - hang (2): never says it is ready (a ready timeout), and runs until SIGTERM.
///
/// On SIGTERM it unlocks, says `stop T` and exits 0. A failing node (the file `FAIL`
/// exists, as a full disk would fail every start): it exits 1 right after `start`, and a
/// running engine exits 1 on SIGUSR1 when the file exists. Killed or failed, it says
/// nothing more: the witness sees its connection close (the kernel closes it, and drops
/// the lock, as the process dies).
const ENGINE: &str = r#"#define _GNU_SOURCE
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>
static int sock = -1, lockfd = -1, mine = 0;
static double boot(void) {
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}
static void say(const char *s) {
    size_t n = strlen(s), off = 0;
    while (off < n) {
        ssize_t w = write(sock, s + off, n - off);
        if (w <= 0) return;
        off += (size_t)w;
    }
}
/* sd_notify(READY=1): a datagram to NOTIFY_SOCKET ('@' for the abstract namespace). */
static void notify_ready(void) {
    const char *p = getenv("NOTIFY_SOCKET");
    if (!p || !*p) return;
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    size_t n = strlen(p);
    if (n >= sizeof a.sun_path) return;
    memcpy(a.sun_path, p, n);
    if (a.sun_path[0] == '@') a.sun_path[0] = 0;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    sendto(fd, "READY=1", 7, 0, (struct sockaddr *)&a,
           (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n));
    close(fd);
}
static void on_usr1(int sig) {
    const char *f = getenv("FAIL");
    (void)sig;
    if (f && access(f, F_OK) == 0) _exit(1);
}
static void on_term(int sig) {
    char b[64];
    (void)sig;
    if (mine) flock(lockfd, LOCK_UN);
    snprintf(b, sizeof b, "stop %.6f\n", boot());
    say(b);
    _exit(0);
}
int main(void) {
    double t0 = boot();
    sigset_t all, none;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &none);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, 0);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, 0);
    const char *w = getenv("WITNESS"), *lk = getenv("LOCK"), *node = getenv("NODE");
    const char *term = getenv("SUP_LEASE_TERM");
    if (!w || !lk || !node) return 2;
    sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, w, sizeof a.sun_path - 1);
    if (connect(sock, (struct sockaddr *)&a, sizeof a) != 0) return 3;
    lockfd = open(lk, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    mine = lockfd >= 0 && flock(lockfd, LOCK_EX | LOCK_NB) == 0;
    char b[256];
    const char *version = getenv("SUP_VERSION");
    snprintf(b, sizeof b, "start %s %s %d %.6f %.6f %d %s\n", node, term && *term ? term : "-",
             (int)getpid(), t0, boot(), mine, version && *version ? version : "-");
    say(b);
    const char *fail = getenv("FAIL");
    if (fail && *fail && access(fail, F_OK) == 0) _exit(1);
    if (MODE == 1) _exit(3);
    if (MODE == 0) {
        snprintf(b, sizeof b, "ready %.6f\n", boot());
        say(b);
        notify_ready();
    }
    for (;;) sigsuspend(&none);
}
"#;

/// Shifts CLOCK_REALTIME (and gettimeofday, time) by the seconds in the 8-byte native
/// integer at `SUP_TEST_CLOCK_FILE`, mapped shared: the test steps a running process's
/// wall clock by rewriting the file in place (never truncating it).
const SHIM: &str = r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
static volatile long long *off;
static int tried;
static long long offset(void) {
    if (!tried) {
        tried = 1;
        const char *p = getenv("SUP_TEST_CLOCK_FILE");
        if (p) {
            int fd = open(p, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                void *m = mmap(0, 8, PROT_READ, MAP_SHARED, fd, 0);
                if (m != MAP_FAILED) off = m;
                close(fd);
            }
        }
    }
    return off ? *off : 0;
}
int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = dlsym(RTLD_NEXT, "clock_gettime");
    int r = real(id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += offset();
    return r;
}
int gettimeofday(struct timeval *tv, void *tz) {
    static int (*real)(struct timeval *, void *);
    if (!real) real = dlsym(RTLD_NEXT, "gettimeofday");
    int r = real(tv, tz);
    if (r == 0 && tv) tv->tv_sec += offset();
    return r;
}
time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
"#;

fn cc(dir: &Path, name: &str, src: &str, args: &[&str]) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).expect("write C source");
    let out_path = dir.join(name);
    let out = Command::new("cc")
        .arg("-o")
        .arg(&out_path)
        .arg(&c)
        .args(args)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out_path
}

/// What a version of the engine does once it has said `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Ready at once, runs until SIGTERM.
    Good,
    /// Exits 3 at once.
    Crash,
    /// Never ready, runs until SIGTERM.
    Hang,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Good => "good",
            Mode::Crash => "crashing",
            Mode::Hang => "hanging",
        }
    }
}

/// Builds the engine of `mode`; returns its path.
pub fn engine(dir: &Path, mode: Mode) -> PathBuf {
    let (name, def) = match mode {
        Mode::Good => ("engine-good", "-DMODE=0"),
        Mode::Crash => ("engine-crash", "-DMODE=1"),
        Mode::Hang => ("engine-hang", "-DMODE=2"),
    };
    cc(dir, name, ENGINE, &["-O2", def])
}

/// Builds the clock shim; returns the path of the shared object.
pub fn shim(dir: &Path) -> PathBuf {
    cc(
        dir,
        "clockstep.so",
        SHIM,
        &["-shared", "-fPIC", "-O2", "-ldl"],
    )
}

/// A clock file for the shim: an offset of zero.
pub fn clock_file(path: &Path) {
    std::fs::write(path, 0i64.to_ne_bytes()).expect("clock file");
}

/// Steps the wall clock of every process reading `path` to `secs` from the real one.
pub fn set_clock(path: &Path, secs: i64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open clock file");
    f.write_all_at(&secs.to_ne_bytes(), 0)
        .expect("write clock file");
}

/// CLOCK_BOOTTIME in seconds: the one clock of every interval the test records.
pub fn boot() -> f64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).expect("boottime");
    ts.tv_sec() as f64 + ts.tv_nsec() as f64 / 1e9
}
