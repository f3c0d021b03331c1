/* A long-running program for incremental reports. Each round leaks 10
   blocks of 100 bytes from one backtrace and allocates and frees in balance
   elsewhere; round 1 also keeps 5 blocks of 64 bytes, which round 2 frees.
   After each round it asks for a report: with argument "api" through
   mtrace_report(), otherwise by printing "ready" and waiting for the report
   signal (in sigsuspend, pause() without its race: the signal stays blocked
   until the wait begins). */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
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

int main(int argc, char **argv) {
    int api = argc > 1 && strcmp(argv[1], "api") == 0;
    sigset_t usr1, waiting;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, &waiting);
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
            MTRACE(mtrace_report, NULL);
        } else {
            if (write(1, "ready\n", 6) != 6) return 1;
            sigsuspend(&waiting);
        }
    }
    return 0;
}
