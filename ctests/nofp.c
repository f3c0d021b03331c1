/* Built with -O2 -fomit-frame-pointer: the backtrace needs DWARF CFI. */
#include <stdlib.h>

static void *keep;

__attribute__((noinline)) void *level3(size_t n) { void *p = malloc(n); __asm__ volatile("" ::: "memory"); return p; } // @leak:level3
__attribute__((noinline)) void *level2(size_t n) { void *p = level3(n + 1); __asm__ volatile("" ::: "memory"); return p; } // @leak:level2
__attribute__((noinline)) void *level1(size_t n) { void *p = level2(n + 1); __asm__ volatile("" ::: "memory"); return p; } // @leak:level1

int main(int argc, char **argv) {
    (void)argv;
    keep = level1(800 + (size_t)argc); // @leak:main
    return 0;
}
