/* Threads that start and end while leak scans stop the world: main starts
   1,000 short-lived threads (each allocates and frees a few blocks), four
   at a time, while a scanning thread asks for 100 scans with mtrace_scan()
   one after the other. Then main joins everything, drops one block of
   4,321 bytes and returns. So no scan may hang or leave a thread stopped
   (main would never join it), and the scan at exit finds exactly one
   definitely lost block. Run with MTRACE_SCAN=1; build without
   optimisation. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "../include/mtrace.h"

#define THREADS 1000
#define AT_ONCE 4
#define SCANS 100

static int scans_done;

static void *short_lived(void *arg) {
    long id = (long)arg;
    void *p[8];
    for (int i = 0; i < 8; i++)
        p[i] = malloc(16 + (id + i) % 200);
    for (int i = 0; i < 8; i++)
        free(p[i]);
    return NULL;
}

static void *scanner(void *arg) {
    (void)arg;
    for (int i = 0; i < SCANS; i++) {
        if (mtrace_scan && mtrace_scan("churn.memlog") != 0) {
            fprintf(stderr, "scan %d failed\n", i);
            exit(3);
        }
        __atomic_add_fetch(&scans_done, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

__attribute__((noinline)) static void drop_one(void) {
    void *volatile p = malloc(4321); // @leak:dropped
    p = NULL;
    (void)p;
}

int main(void) {
    pthread_t s;
    pthread_create(&s, NULL, scanner, NULL);
    pthread_t t[AT_ONCE];
    for (long i = 0; i < THREADS; i += AT_ONCE) {
        for (int j = 0; j < AT_ONCE; j++)
            pthread_create(&t[j], NULL, short_lived, (void *)(i + j));
        for (int j = 0; j < AT_ONCE; j++)
            pthread_join(t[j], NULL);
    }
    pthread_join(s, NULL);
    drop_one();
    printf("%d threads, %d scans\n", THREADS, __atomic_load_n(&scans_done, __ATOMIC_SEQ_CST));
    return 0;
}
