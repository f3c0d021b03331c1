/* One thread allocates 50 blocks, then sleeps argv[1] ms (default 5000)
   holding them, with their events in its buffer, while two threads hand
   blocks to each other through a one-slot mailbox (the consumer frees each
   block at once, so the producer gets its address back) for as long; then
   it frees its blocks. Everything is freed. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int sleep_ms = 5000;
static void *slot;
static volatile int stop;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static void *sleeper(void *arg) {
    (void)arg;
    void *mine[50];
    for (int i = 0; i < 50; i++) mine[i] = malloc(64 + i);
    struct timespec ts = {sleep_ms / 1000, (long)(sleep_ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
    for (int i = 0; i < 50; i++) free(mine[i]);
    stop = 1;
    return NULL;
}

static void *producer(void *arg) {
    (void)arg;
    while (!stop) {
        char *p = malloc(48);
        p[0] = 1;
        pthread_mutex_lock(&lock);
        while (slot && !stop) pthread_cond_wait(&cv, &lock);
        if (slot) free(p); else slot = p;
        pthread_cond_broadcast(&cv);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

static void *consumer(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (!slot && !stop) pthread_cond_wait(&cv, &lock);
        void *p = slot;
        slot = NULL;
        pthread_cond_broadcast(&cv);
        pthread_mutex_unlock(&lock);
        if (p) free(p);
        else if (stop) return NULL;
    }
}

int main(int argc, char **argv) {
    if (argc > 1) sleep_ms = atoi(argv[1]);
    pthread_t s, p, c;
    pthread_create(&s, NULL, sleeper, NULL);
    pthread_create(&p, NULL, producer, NULL);
    pthread_create(&c, NULL, consumer, NULL);
    pthread_join(s, NULL);
    pthread_join(p, NULL);
    pthread_mutex_lock(&lock);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&lock);
    pthread_join(c, NULL);
    /* The producer's last block, if the consumer had gone already. */
    free(slot);
    return 0;
}
