/* The baseline: the least a supervisor can do, a fork/exec/waitpid loop of argv[2..],
 * argv[1] times. */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int n = atoi(argv[1]);
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            execv(argv[2], argv + 2);
            _exit(127);
        }
        int status;
        waitpid(pid, &status, 0);
    }
    return 0;
}
