/* Call sites whose live and allocated bytes are known exactly, for the
   accuracy of sampled recording (analyzer/tests/sampling.rs), plus churn
   that frees everything it allocates.

   Site (marker)  block     blocks   live at exit
   small          1 KiB    12288    12 MiB
   four           4 KiB     3072    12 MiB
   sixteen         16 KiB      768    12 MiB
   fortyeight      48 KiB      256    12 MiB
   big            1 MiB         12    12 MiB
   tenfold         1 KiB       640   640 KiB (10x a 64 KiB rate)
   churn: 400000 blocks of 16..4111 bytes, each freed at once; their sizes
   come from a fixed generator, so the total is fixed too (printed).
   Blocks are written to, so that nothing is optimised away, and kept in
   a global array until exit. Optional argument: "realloc" grows each
   "four" block from 1 KiB by realloc instead; "small" makes a 16th of
   every site's blocks and of the churn (for --ptrace, which stops at
   every call). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *keep[20000];
static int kept;
/* 1, or 16 in the "small" mode. */
static int part = 1;

static void hold(void *p, size_t n) {
    memset(p, 1, n < 64 ? n : 64);
    keep[kept++] = p;
}

__attribute__((noinline)) static void site_small(void) {
    for (int i = 0; i < 12288 / part; i++) hold(malloc(1024), 1024); // @leak:small
}

__attribute__((noinline)) static void site_four(int grow) {
    for (int i = 0; i < 3072 / part; i++) {
        if (grow) {
            char *p = malloc(1024);
            p[0] = 1;
            hold(realloc(p, 4096), 4096); // @leak:four_grown
        } else {
            hold(malloc(4096), 4096); // @leak:four
        }
    }
}

__attribute__((noinline)) static void site_sixteen(void) {
    for (int i = 0; i < 768 / part; i++) hold(malloc(16384), 16384); // @leak:sixteen
}

__attribute__((noinline)) static void site_fortyeight(void) {
    for (int i = 0; i < 256 / part; i++) hold(calloc(1, 49152), 49152); // @leak:fortyeight
}

__attribute__((noinline)) static void site_big(void) {
    for (int i = 0; i < (part == 1 ? 12 : 2); i++) hold(malloc(1 << 20), 1 << 20); // @leak:big
}

__attribute__((noinline)) static void site_tenfold(void) {
    for (int i = 0; i < 640 / part; i++) hold(malloc(1024), 1024); // @leak:tenfold
}

__attribute__((noinline)) static unsigned long churn(void) {
    unsigned long total = 0;
    unsigned x = 12345;
    for (int i = 0; i < 400000 / part; i++) {
        x = x * 1103515245u + 12345u;
        size_t n = 16 + (x >> 8) % 4096;
        char *p = malloc(n); // @leak:churn
        p[0] = 1;
        total += n;
        free(p);
    }
    return total;
}

int main(int argc, char **argv) {
    int grow = argc > 1 && strcmp(argv[1], "realloc") == 0;
    if (argc > 1 && strcmp(argv[1], "small") == 0) part = 16;
    site_small();
    unsigned long churned = churn();
    site_four(grow);
    site_sixteen();
    site_fortyeight();
    site_big();
    site_tenfold();
    printf("churn %lu bytes\n", churned);
    return 0;
}
