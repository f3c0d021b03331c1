/* Two callers with identical frames call the same allocating function, so
   that function's frame has the same return address and stack pointer
   under both: only the stack word holding its own return address tells
   them apart. The unwinder reuses the previous walk of a thread where the
   words it read still hold (preload/src/unwind/walk.rs); it must see that
   one change. Built -O2 without frame pointers. */
#include <stdlib.h>

static void *kept[64];
static int nkept;

__attribute__((noinline)) static void *alloc_here(size_t n) { void *p = malloc(n); __asm__ volatile("" ::: "memory"); return p; } // @leak:alloc_here
__attribute__((noinline)) static void *via_a(size_t n) { void *p = alloc_here(n); __asm__ volatile("" ::: "memory"); return p; } // @leak:via_a
__attribute__((noinline)) static void *via_b(size_t n) { void *p = alloc_here(n + 1); __asm__ volatile("" ::: "memory"); return p; } // @leak:via_b

int main(void) {
    for (int i = 0; i < 10; i++) {
        kept[nkept++] = via_a(10); // @leak:call_a
        if (i % 2)
            kept[nkept++] = via_b(20); // @leak:call_b
    }
    return 0;
}
