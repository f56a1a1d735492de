/* The floor of a supervisor's start (issue 26): posix_spawn of argv[1] copies of
 * argv[2..], one after the other. glibc's posix_spawn clones with CLONE_VM|CLONE_VFORK:
 * no page tables copied, and it returns once the child has exec'd. Prints the seconds
 * the N spawns took, then SIGKILLs and reaps every child (not timed). */
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int n = atoi(argv[1]);
    pid_t *pids = calloc((size_t)(n > 0 ? n : 1), sizeof *pids);
    if (!pids) return 1;
    int got = 0, rc = 0;
    double t0 = now_s();
    for (; got < n; got++) {
        if (posix_spawn(&pids[got], argv[2], NULL, NULL, argv + 2, environ) != 0) {
            perror("posix_spawn");
            rc = 1;
            break;
        }
    }
    double t = now_s() - t0;
    if (rc == 0) printf("%.6f\n", t);
    fflush(stdout);
    for (int i = 0; i < got; i++) kill(pids[i], SIGKILL);
    for (int i = 0; i < got; i++) waitpid(pids[i], NULL, 0);
    return rc;
}
