/* A long-running program for incremental reports. Each round leaks 10
   blocks of 100 bytes from one backtrace and allocates and frees in balance
   elsewhere; round 1 also keeps 5 blocks of 64 bytes, which round 2 frees.
   After each round it asks for a report: with argument "api" through
   mtrace_report(), otherwise by printing "ready" and waiting for the report
   signal (in sigsuspend, pause() without its race: the signal stays blocked
   until the wait begins); with argument "sleep", by printing "ready" and
   sleeping half a second (for --ptrace, where the signal is taken by the
   tracer and no handler ends a wait). In api mode it also checks that the reports
   leave no trace in the program: mtrace_report() returns 0, no SIGCHLD
   arrives and waitpid(-1) finds no child (exit status 4 otherwise). */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../include/mtrace.h"

void *leaks[100];
static int nleaks;
void *kept[5];

__attribute__((noinline)) static void leak_steadily(void) {
    leaks[nleaks++] = malloc(100); // @leak:steady
}

__attribute__((noinline)) static void keep_some(int i) {
    kept[i] = malloc(64); // @leak:kept
}

__attribute__((noinline)) static void balanced(void) {
    for (int i = 0; i < 1000; i++) free(malloc(32 + i % 100)); // @leak:balanced
}

static volatile sig_atomic_t sigchld;

static void on_sigchld(int sig) {
    (void)sig;
    sigchld = 1;
}

int main(int argc, char **argv) {
    int api = argc > 1 && strcmp(argv[1], "api") == 0;
    int sleepy = argc > 1 && strcmp(argv[1], "sleep") == 0;
    int failed = 0;
    if (api)
        signal(SIGCHLD, on_sigchld);
    sigset_t usr1, waiting;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(sleepy ? SIG_SETMASK : SIG_BLOCK, sleepy ? NULL : &usr1, &waiting);
    sigdelset(&waiting, SIGUSR1);
    for (int round = 1; round <= 3; round++) {
        for (int i = 0; i < 10; i++) leak_steadily();
        balanced();
        if (round == 1)
            for (int i = 0; i < 5; i++) keep_some(i);
        if (round == 2)
            for (int i = 0; i < 5; i++) free(kept[i]);
        if (api) {
            MTRACE(mtrace_marker, round == 1 ? "first" : "later");
            if (mtrace_report && mtrace_report(NULL) != 0)
                failed = 1;
        } else if (sleepy) {
            if (write(1, "ready\n", 6) != 6) return 1;
            usleep(500000);
        } else {
            if (write(1, "ready\n", 6) != 6) return 1;
            sigsuspend(&waiting);
        }
    }
    if (api) {
        usleep(100000);
        int status;
        if (failed || sigchld || waitpid(-1, &status, WNOHANG) != -1)
            return 4;
    }
    return 0;
}
