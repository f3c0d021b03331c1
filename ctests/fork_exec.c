/* Forks a child that execs /bin/true (a fork-then-exec, as git and make
   start their commands), waits for it, and exits 0. Traced, the child
   is one process of two images: the copy of this program the fork made,
   then true. */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    void *keep = malloc(10);
    pid_t p = fork();
    if (p == 0) {
        execl("/bin/true", "true", (char *)NULL);
        _exit(127);
    }
    int status;
    waitpid(p, &status, 0);
    free(keep);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
