//! A clock that steps: an LD_PRELOAD library, built with `cc` at test time, that shifts
//! what the wall clock says to a process (CLOCK_MONOTONIC and CLOCK_BOOTTIME are left
//! alone), for the tests that no deadline of supd or sup-lease follows it.

use super::Sandbox;
use std::path::PathBuf;

/// An LD_PRELOAD library that shifts CLOCK_REALTIME (and gettimeofday, time) by
/// `SUP_TEST_CLOCK_OFFSET_MS` milliseconds; built with `cc` into the sandbox.
pub fn clock_shim(sb: &Sandbox) -> PathBuf {
    super::preload::build(
        sb,
        "shift",
        r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
static long long offset_ms(void) {
    const char *s = getenv("SUP_TEST_CLOCK_OFFSET_MS");
    return s ? atoll(s) : 0;
}
static void shift(struct timespec *ts) {
    long long ns = ts->tv_nsec + (offset_ms() % 1000) * 1000000LL;
    ts->tv_sec += offset_ms() / 1000 + ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
}
int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *);
    if (!real) real = dlsym(RTLD_NEXT, "clock_gettime");
    int r = real(id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) shift(ts);
    return r;
}
int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0 && tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    return r;
}
time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
"#,
    )
}
