/* Built with -O2 -fno-omit-frame-pointer -fno-asynchronous-unwind-tables
 * -fno-unwind-tables: no FDE covers its functions (Chromium's executable is
 * built so: FDEs for 8,850 of its functions), so its frames are found by
 * the frame pointer. The loop allocates from the same two backtraces again
 * and again, as a program's hot paths do. */
#include <stdlib.h>

static void *keep[30];

__attribute__((noinline)) void *level3(size_t n) { void *p = malloc(n); __asm__ volatile("" ::: "memory"); return p; } // @leak:level3
__attribute__((noinline)) void *level2(size_t n) { void *p = level3(n + 1); __asm__ volatile("" ::: "memory"); return p; } // @leak:level2
__attribute__((noinline)) void *level1(size_t n) { void *p = level2(n + 1); __asm__ volatile("" ::: "memory"); return p; } // @leak:level1
__attribute__((noinline)) void *other(size_t n) { void *p = level2(n + 2); __asm__ volatile("" ::: "memory"); return p; } // @leak:other

int main(int argc, char **argv) {
    (void)argv;
    for (int i = 0; i < 10000; i++) {
        free(level1(16));
        free(other(16));
    }
    for (int i = 0; i < 10; i++)
        keep[i] = level1(800 + (size_t)argc); // @leak:main1
    for (int i = 10; i < 30; i++)
        keep[i] = other(900 + (size_t)argc); // @leak:main2
    return 0;
}
