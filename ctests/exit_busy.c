/* Exit while another thread works: a thread inside a dl_iterate_phdr
   callback (holding the loader's lock, as in LLVM's LeakSanitizer test
   libdl_deadlock) makes up to 50 steps of 1,000 allocations and frees,
   writing "step N" on standard output after each; main returns once the
   first step has begun, writing "exit at step N" first (N: the steps done
   then). Natively the process ends within a step of its exit: the thread
   never gets far. A tracer whose end of exit lets the thread run on shows
   many more steps. */
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t started = PTHREAD_MUTEX_INITIALIZER;
static volatile int steps;

static void say(const char *what, int n) {
    char line[64];
    int len = snprintf(line, sizeof line, "%s %d\n", what, n);
    if (write(1, line, len) != len)
        _exit(2);
}

static int callback(struct dl_phdr_info *info, size_t size, void *data) {
    (void)info, (void)size, (void)data;
    for (int step = 0; step < 50; step++) {
        void *p[1000];
        for (int i = 0; i < 1000; i++)
            p[i] = malloc(10 * i + 1);
        if (step == 0)
            pthread_mutex_unlock(&started);
        for (int i = 0; i < 1000; i++)
            free(p[i]);
        steps = step + 1;
        say("step", step + 1);
    }
    return 1;
}

static void *work(void *arg) {
    (void)arg;
    dl_iterate_phdr(callback, NULL);
    return NULL;
}

int main(void) {
    pthread_mutex_lock(&started);
    pthread_t t;
    pthread_create(&t, NULL, work, NULL);
    pthread_detach(t);
    pthread_mutex_lock(&started);
    say("exit at step", steps);
    return 0;
}
