/* The leak scan of a sampled trace (docs/SAMPLING.md), run with a rate of
   64 KiB: blocks of at least 64 KiB are always sampled; a 16-byte holder
   is sampled with a chance of 1 in 4096 (the test's seed keeps it out).
   - lost: a 200,000-byte block nothing points to: definitely lost;
   - lost_child: a 100,000-byte block only `lost` points to: indirectly
     lost;
   - held: a 150,000-byte block whose only pointer is in a small block the
     program keeps: still reachable (the unsampled block is memory the
     scan reads as a root);
   - behind: a 170,000-byte block whose only pointer is in a small block
     the program lost: the scan cannot tell, and calls it reachable.
   - kept: a 120,000-byte block a global points to: still reachable. */
#include <stdlib.h>
#include <string.h>

struct holder {
    void *p;
    long pad;
};

struct holder *root;
void *kept;

__attribute__((noinline)) static void make(void) {
    void **lost = malloc(200000); // @leak:lost
    lost[0] = malloc(100000);     // @leak:lost_child
    root = malloc(sizeof *root);
    root->p = malloc(150000); // @leak:held
    struct holder *gone = malloc(sizeof *gone);
    gone->p = malloc(170000); // @leak:behind
    kept = malloc(120000);    // @leak:kept
}

/* Overwrites the dead stack below main so no stale copy of a pointer from
   make() survives there. */
__attribute__((noinline)) static void scrub(void) {
    volatile char junk[16384];
    memset((char *)junk, 0, sizeof junk);
}

int main(void) {
    make();
    scrub();
    return 0;
}
