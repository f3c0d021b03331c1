/* The child of a fork is traced into its own file; the parent's trace is
   unaffected. */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void *keep[4];

int main(void) {
    keep[0] = malloc(401); // @leak:before_fork
    pid_t pid = fork();
    if (pid == 0) {
        keep[1] = malloc(402); // @leak:in_child
        free(keep[0]);         /* the parent's block: unknown to the child's trace */
        exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    keep[2] = malloc(403); // @leak:after_fork
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
