/* The leak scan's workload for scripts/bench: BLOCKS blocks of 16-256
   bytes, half in a list reachable from a global, half in a list nothing
   points to (one definitely lost block, the rest indirectly lost), and one
   reachable buffer of MIB MiB of non-pointer data. It then exits, and the
   scan at exit (MTRACE_SCAN=1) reads all of it.
   usage: bench_scan BLOCKS MIB */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct node {
    struct node *next;
};

struct node *reachable;
uint64_t *data;

int main(int argc, char **argv) {
    long blocks = argc > 1 ? atol(argv[1]) : 200000;
    long mib = argc > 2 ? atol(argv[2]) : 256;
    struct node *lost = NULL;
    uint64_t x = 88172645463325252ULL;
    for (long i = 0; i < blocks; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        struct node *n = malloc(16 + x % 241);
        if (i % 2) {
            n->next = reachable;
            reachable = n;
        } else {
            n->next = lost;
            lost = n;
        }
    }
    lost = NULL;
    size_t words = (size_t)mib << 17;
    data = malloc(words * 8);
    for (size_t i = 0; i < words; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        data[i] = x & 0xffffffff; /* small numbers: never a heap address */
    }
    /* Scrub the dead stack: no stale copy of a list pointer. */
    volatile char junk[16384];
    memset((char *)junk, 0, sizeof junk);
    return 0;
}
