/* Paired, alternating timing of two commands, each run as a whole process:
 *   pair N A-PROGRAM [ARG...] -- B-PROGRAM [ARG...]
 * N pairs, the order within a pair alternating (A B, B A, ...) so that a drift of the
 * machine's speed falls on both alike. Each run is fork, execv, waitpid, timed with the
 * monotonic clock; its output goes to /dev/null. Prints the medians of A and of B (us),
 * the median of the pairs' ratios A/B and its 10th and 90th percentiles, and the number
 * of runs that did not exit 0. Five pairs are run first and not counted. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int failed;

static double run(char **argv) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
    return (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, int n, int p) {
    qsort(v, n, sizeof *v, cmp);
    return v[(n - 1) * p / 100];
}

int main(int argc, char **argv) {
    int sep = 0;
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--") == 0) sep = i;
    if (argc < 5 || sep < 3 || sep == argc - 1) {
        fprintf(stderr, "usage: pair N A-PROGRAM [ARG...] -- B-PROGRAM [ARG...]\n");
        return 2;
    }
    int n = atoi(argv[1]);
    argv[sep] = NULL;
    char **a = argv + 2, **b = argv + sep + 1;
    double *ta = malloc(n * sizeof *ta), *tb = malloc(n * sizeof *tb), *r = malloc(n * sizeof *r);
    for (int i = 0; i < 5; i++) run(a), run(b);
    failed = 0;
    for (int i = 0; i < n; i++) {
        if (i % 2 == 0) {
            ta[i] = run(a);
            tb[i] = run(b);
        } else {
            tb[i] = run(b);
            ta[i] = run(a);
        }
        r[i] = ta[i] / tb[i];
    }
    double ma = pct(ta, n, 50), mb = pct(tb, n, 50);
    printf("%.0f %.0f %.3f %.3f %.3f %d\n", ma, mb, pct(r, n, 50), pct(r, n, 10), pct(r, n, 90), failed);
    return 0;
}
