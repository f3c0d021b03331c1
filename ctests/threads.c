/* Blocks allocated in one thread and freed in another, while both threads
   allocate: only the one block the worker keeps is a leak. */
#include <pthread.h>
#include <stdlib.h>

#define N 20000
static void *blocks[N];
static void *kept;

static void *producer(void *arg) {
    (void)arg;
    for (int i = 0; i < N; i++) blocks[i] = malloc(16 + i % 64);
    kept = malloc(301); // @leak:worker
    return NULL;
}

int main(void) {
    for (int round = 0; round < 5; round++) {
        pthread_t t;
        pthread_create(&t, NULL, producer, NULL);
        pthread_join(t, NULL);
        for (int i = 0; i < N; i++) free(blocks[i]);
        if (round < 4) free(kept);
    }
    return 0;
}
