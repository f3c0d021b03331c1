/* The leak scan where pointers sit among numbers that cannot be pointers
   (random values with the top bit set: no address, no block size): the
   snapshot keeps only the words that can matter (docs/SCAN.md, "What is
   read"), so these pieces are written sparse. Blocks held from a 4 MiB
   block of such noise (itself held by a global) and from 1 MiB of noise
   in .bss: one by its start (and a second block through it), one by an
   interior pointer 8 bytes in whose first 8 bytes hold the size of the
   rest (memcheck's length64 heuristic), one by an interior pointer 16
   bytes in (possibly lost), one by nothing (definitely lost). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t noise_bss[1 << 17];
uint64_t *noise;

static uint64_t x = 88172645463325252ULL;
static void fill(uint64_t *w, size_t n) {
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        w[i] = x | (1ULL << 63);
    }
}

__attribute__((noinline)) static void make(void) {
    noise = malloc(4 << 20); // @leak:noise
    fill(noise, (4 << 20) / 8);
    fill(noise_bss, 1 << 17);
    void **start = malloc(40); // @leak:by_start
    start[0] = malloc(24); // @leak:through_start
    noise[100000] = (uintptr_t)start;
    uint64_t *len = malloc(8 + 56); // @leak:length64
    len[0] = 56;
    noise[300001] = (uintptr_t)(len + 1);
    char *interior = malloc(64); // @leak:interior
    memset(interior, 0, 64);
    noise_bss[70000] = (uintptr_t)(interior + 16);
    char *bss_held = malloc(32); // @leak:from_bss
    noise_bss[123457] = (uintptr_t)bss_held;
    char *lost = malloc(48); // @leak:lost
    lost[0] = 1;
}

int main(void) {
    make();
    /* Scrub the dead stack: no stale copy of a pointer. */
    volatile char junk[8192];
    memset((char *)junk, 0, sizeof junk);
    return 0;
}
