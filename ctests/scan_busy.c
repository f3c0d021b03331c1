/* Leak scans while threads allocate without pause: each scan stops the
   four workers, mostly inside the tracer's hooks (they park when they
   leave them). Main asks for one scan with mtrace_scan() after 50 ms and
   exits 50 ms later with the workers still running (the scan at exit stops
   them too). Each worker keeps one block in a global slot and frees the
   one before, so every scan must find exactly one definitely lost block:
   the one main drops. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "../include/mtrace.h"

#define WORKERS 4

static int started;
void *slot[WORKERS];

static void *worker(void *arg) {
    long id = (long)arg;
    unsigned x = (unsigned)id * 2654435761u + 1;
    __atomic_add_fetch(&started, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        x = x * 1103515245u + 12345u;
        void *p = malloc(16 + x % 200);
        void *old = __atomic_exchange_n(&slot[id], p, __ATOMIC_SEQ_CST);
        free(old);
    }
    return NULL;
}

__attribute__((noinline)) static void drop_one(void) {
    void *volatile p = malloc(4242); // @leak:dropped
    p = NULL;
    (void)p;
}

int main(void) {
    pthread_t t[WORKERS];
    for (long i = 0; i < WORKERS; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    while (__atomic_load_n(&started, __ATOMIC_SEQ_CST) < WORKERS)
        usleep(1000);
    drop_one();
    usleep(50000);
    if (mtrace_scan && mtrace_scan("busy.memlog") != 0)
        return 3;
    usleep(50000);
    return 0;
}
