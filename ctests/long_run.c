/* A steady run for bounded traces: two threads, each ROUNDS rounds (first
   argument; a millisecond's sleep between rounds) of 1,000 allocations
   into a ring of 500 live blocks (each replacing the oldest, every 10th
   through realloc), of which every 100th is also forgotten (a leak:
   ROUNDS * 10 blocks of 24 bytes per thread, from `forget`). At the end
   each thread's ring is still live (reachable from `rings`), and so is
   one 64 KiB mapping made in round 1. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { RING = 500 };
void *rings[2][RING];
void *volatile sink;
static int rounds;

__attribute__((noinline)) static void *make(size_t n) {
    void *p = malloc(n); // @live:make
    memset(p, 1, n);
    return p;
}

__attribute__((noinline)) static void forget(void) {
    void *p = malloc(24); // @leak:forget
    memset(p, 2, 24);
    sink = p;
}

static void *run(void *arg) {
    void **ring = rings[(long)arg];
    unsigned long i = 0;
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < 1000; k++, i++) {
            void **slot = &ring[i % RING];
            if (*slot && i % 10 == 0)
                *slot = realloc(*slot, 16 + i % 300); // @live:grow
            else {
                free(*slot);
                *slot = make(16 + i % 200);
            }
            if (i % 100 == 0)
                forget();
        }
        usleep(1000);
    }
    return NULL;
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atoi(argv[1]) : 1000;
    void *map = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); // @live:map
    memset(map, 3, 65536);
    pthread_t t;
    pthread_create(&t, NULL, run, (void *)1);
    run((void *)0);
    pthread_join(t, NULL);
    sink = map;
    return 0;
}
