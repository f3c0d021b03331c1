/* The program's children are its own: a tracer's processes (a report's
   analyzer, the leak scan's helper) must never be among them.

   children   asks for a report (raises SIGUSR1, whose handler the tracer
              installs; natively it ignores it), then waits for any child
              with wait(), and prints "wait: ECHILD" when it has none;
              then forks a child that exits with status 7 after 300 ms,
              asks for a second report, and reaps with waitpid(-1, …,
              __WALL), which sees every kind of child, printing "reaped:
              own, status 7" when it was that child, then "after: ECHILD"
              when no other is left. Exits 0. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void report(void) {
    /* Natively nobody answers: ignored, not fatal. */
    struct sigaction old;
    sigaction(SIGUSR1, NULL, &old);
    if (old.sa_handler == SIG_DFL)
        signal(SIGUSR1, SIG_IGN);
    raise(SIGUSR1);
    /* The report's processes start now: give them time to be seen. */
    struct timespec t = {0, 50 * 1000000L};
    nanosleep(&t, NULL);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    report();
    errno = 0;
    pid_t w = wait(NULL);
    printf("wait: %s\n", w == -1 && errno == ECHILD ? "ECHILD" : "a child");
    pid_t child = fork();
    if (child == 0) {
        struct timespec t = {0, 300 * 1000000L};
        nanosleep(&t, NULL);
        _exit(7);
    }
    report();
    int st = 0;
    pid_t r = waitpid(-1, &st, __WALL);
    if (r == child && WIFEXITED(st))
        printf("reaped: own, status %d\n", WEXITSTATUS(st));
    else
        printf("reaped: %d (not the program's child %d), status %#x\n", r, child, st);
    errno = 0;
    r = waitpid(-1, &st, __WALL);
    printf("after: %s\n", r == -1 && errno == ECHILD ? "ECHILD" : "a child");
    return 0;
}
