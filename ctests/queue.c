/* Producers pass blocks through a queue to consumers, which free them at
   once, so the allocator hands the same addresses out again while the
   tracer's buffers of different threads hold their events. Every block is
   freed, except one in a fifth of each producer's blocks (5 each) when
   argv[1] is "leak": consumers keep those (@leak:kept), and each producer
   leaks one block of its own at the end (@leak:producer). argv[2]: blocks
   per producer (default 250,000). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define PRODUCERS 2
#define CONSUMERS 2
#define PER_PRODUCER 250000
#define QUEUE 64

static void *queue[QUEUE];
static int head, tail, count, done;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t not_empty = PTHREAD_COND_INITIALIZER, not_full = PTHREAD_COND_INITIALIZER;
static int leak;
static void *kept[PRODUCERS * 5 + 1];
static int nkept;
static void *volatile producer_leak[PRODUCERS];

static void put(void *p) {
    pthread_mutex_lock(&lock);
    while (count == QUEUE) pthread_cond_wait(&not_full, &lock);
    queue[tail] = p;
    tail = (tail + 1) % QUEUE;
    count++;
    pthread_cond_signal(&not_empty);
    pthread_mutex_unlock(&lock);
}

static void *take(void) {
    pthread_mutex_lock(&lock);
    while (count == 0 && done < PRODUCERS) pthread_cond_wait(&not_empty, &lock);
    void *p = NULL;
    if (count > 0) {
        p = queue[head];
        head = (head + 1) % QUEUE;
        count--;
        pthread_cond_signal(&not_full);
    }
    pthread_mutex_unlock(&lock);
    return p;
}

/* Blocks each producer makes (argv[2]); every fifth of them one is kept. */
static int per_producer = PER_PRODUCER;

static void *producer(void *arg) {
    long id = (long)arg;
    for (int i = 0; i < per_producer; i++) {
        size_t size = 16 + (i * 7) % 100;
        char *p = malloc(size); // @leak:kept
        memset(p, 0, size);
        p[0] = (leak && i % (per_producer / 5) == per_producer / 5 - 1) ? 'k' : 'f';
        put(p);
    }
    if (leak) producer_leak[id] = malloc(777); // @leak:producer
    pthread_mutex_lock(&lock);
    done++;
    pthread_cond_broadcast(&not_empty);
    pthread_mutex_unlock(&lock);
    return NULL;
}

static void *consumer(void *arg) {
    (void)arg;
    char *p;
    while ((p = take()) != NULL) {
        if (p[0] == 'k') {
            pthread_mutex_lock(&lock);
            kept[nkept++] = p;
            pthread_mutex_unlock(&lock);
        } else {
            free(p);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    leak = argc > 1 && strcmp(argv[1], "leak") == 0;
    if (argc > 2) per_producer = atoi(argv[2]);
    pthread_t p[PRODUCERS], c[CONSUMERS];
    for (long i = 0; i < CONSUMERS; i++) pthread_create(&c[i], NULL, consumer, NULL);
    for (long i = 0; i < PRODUCERS; i++) pthread_create(&p[i], NULL, producer, (void *)i);
    for (int i = 0; i < PRODUCERS; i++) pthread_join(p[i], NULL);
    for (int i = 0; i < CONSUMERS; i++) pthread_join(c[i], NULL);
    return 0;
}
