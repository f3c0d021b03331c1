/* Threads nobody sees created: a SIGEV_THREAD timer's notifications run
   on threads glibc starts itself (its internal pthread_create, past the
   preload's hook), while the program's main thread has made none, so the
   tracer has no writer thread yet (docs/PROCESSES.md). Each of NOTIFY
   notifications keeps a 64-byte block (leaked) and frees one of 100.
   glibc's timer thread waits for the timer's signal (SIGRTMIN) with it
   blocked: if anything unblocks it there, the next expiry kills the
   process. */
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOTIFY 8

static atomic_int fired;
static atomic_int done;

static void notify(union sigval v) {
    (void)v;
    if (atomic_fetch_add(&fired, 1) >= NOTIFY)
        return;
    char *gone = malloc(100);
    char *kept = malloc(64); /* @leak:kept */
    memset(gone, 1, 100);
    memset(kept, 2, 64);
    free(gone);
    /* The pointer to `kept` is dropped here: definitely lost. */
    kept = NULL;
    atomic_fetch_add(&done, 1);
}

int main(void) {
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_THREAD;
    ev.sigev_notify_function = notify;
    timer_t t;
    if (timer_create(CLOCK_MONOTONIC, &ev, &t) != 0)
        return 1;
    struct itimerspec every = {{0, 10 * 1000 * 1000}, {0, 10 * 1000 * 1000}};
    timer_settime(t, 0, &every, NULL);
    /* The main thread allocates meanwhile: its events make the rounds.
       Status 2 when the notifications stopped coming (5 s). */
    for (int waited = 0; atomic_load(&done) < NOTIFY; waited++) {
        if (waited == 5000)
            return 2;
        free(malloc(32));
        usleep(1000);
    }
    timer_delete(t);
    return 0;
}
