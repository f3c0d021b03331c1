/* A library whose constructor starts a thread that allocates and frees
   until the library's destructor: preloaded after libmtrace.so (`mtrace
   run` puts itself first in LD_PRELOAD, and the loader runs the later
   library's constructor first), its thread is inside the program's
   allocator while the preload patches the executable's functions. The
   thread is held from outside while the jumps are written. Its count goes
   to stderr at the end. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static volatile int go = 1;
static pthread_t thread;

static void *churn(void *arg) {
    (void)arg;
    long n = 0;
    while (go) {
        free(malloc(64));
        n++;
    }
    fprintf(stderr, "ctor_thread: %s\n", n > 0 ? "churned" : "idle");
    return 0;
}

__attribute__((constructor)) static void start(void) {
    pthread_create(&thread, 0, churn, 0);
    /* Running when the next constructor (the preload's) patches. */
    usleep(20000);
}

__attribute__((destructor)) static void end(void) {
    go = 0;
    pthread_join(thread, 0);
}
