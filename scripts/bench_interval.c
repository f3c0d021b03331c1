/* A steady allocator for `scripts/bench --only interval`: until it is
   killed, every millisecond it allocates 100 blocks of 16..271 bytes into
   a ring of 100,000 and frees the block each one replaces; one block in
   100 is also kept for good (a slow leak, so the live books grow). About
   200,000 events a second. */
#include <stdlib.h>
#include <unistd.h>

static void *ring[100000];
static void *kept[10000000];

int main(void) {
    unsigned long n = 0, k = 0;
    for (;;) {
        for (int i = 0; i < 100; i++, n++) {
            void *p = malloc(16 + n % 256);
            void **slot = &ring[n % 100000];
            free(*slot);
            *slot = p;
            if (n % 100 == 0 && k < 10000000)
                kept[k++] = malloc(32);
        }
        usleep(1000);
    }
}
