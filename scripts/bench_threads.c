/* The exit path with many live threads, for scripts/bench: THREADS threads
   that each allocate one block and wait on a condition variable for ever;
   main returns once all of them wait, and the scan at exit
   (MTRACE_SCAN=1) stops them all.
   usage: bench_threads THREADS */
#include <pthread.h>
#include <stdlib.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t never = PTHREAD_COND_INITIALIZER;
static pthread_cond_t started_cv = PTHREAD_COND_INITIALIZER;
static long started;
void *volatile held[4096];

static void *waiter(void *arg) {
    long i = (long)arg;
    held[i % 4096] = malloc(64);
    pthread_mutex_lock(&mu);
    started++;
    pthread_cond_signal(&started_cv);
    for (;;)
        pthread_cond_wait(&never, &mu);
    return NULL;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    for (long i = 0; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, &attr, waiter, (void *)i) != 0)
            return 1;
    }
    pthread_mutex_lock(&mu);
    while (started < n)
        pthread_cond_wait(&started_cv, &mu);
    pthread_mutex_unlock(&mu);
    return 0;
}
