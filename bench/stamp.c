/* A service for benchmarks: runs argv[2] milliseconds (default 0), appends
 * "<start_ns> <end_ns>\n" (CLOCK_MONOTONIC) to the file named by argv[1], and exits 0.
 * The gap from one line's end to the next line's start is the supervisor's restart
 * latency (exit → reap → spawn → exec → main). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    long long start = now_ns();
    if (argc < 2) return 2;
    if (argc > 2) {
        long ms = atol(argv[2]);
        struct timespec d = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&d, NULL);
    }
    int fd = open(argv[1], O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0) return 1;
    char line[64];
    long long end = now_ns();
    int n = snprintf(line, sizeof line, "%lld %lld\n", start, end);
    if (write(fd, line, (size_t)n) != n) return 1;
    close(fd);
    _exit(0);
}
