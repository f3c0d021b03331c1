/* One leak per C allocation function, each of a distinct size, plus blocks
   that are freed. Expected leaks are marked "@leak:NAME" on the allocating
   line; the tests read the line numbers from here. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdlib.h>

static void *keep[16];
static int n;

__attribute__((noinline)) void leak_malloc(void) { keep[n++] = malloc(101); } // @leak:malloc
__attribute__((noinline)) void leak_calloc(void) { keep[n++] = calloc(3, 34); } // @leak:calloc
__attribute__((noinline)) void leak_realloc(void) { keep[n++] = realloc(NULL, 103); } // @leak:realloc
__attribute__((noinline)) void leak_reallocarray(void) { keep[n++] = reallocarray(NULL, 2, 52); } // @leak:reallocarray
__attribute__((noinline)) void leak_posix_memalign(void) { posix_memalign(&keep[n++], 64, 105); } // @leak:posix_memalign
__attribute__((noinline)) void leak_aligned_alloc(void) { keep[n++] = aligned_alloc(32, 106); } // @leak:aligned_alloc
__attribute__((noinline)) void leak_valloc(void) { keep[n++] = valloc(107); } // @leak:valloc
__attribute__((noinline)) void leak_memalign(void) { keep[n++] = memalign(128, 108); } // @leak:memalign
__attribute__((noinline)) void leak_pvalloc(void) { keep[n++] = pvalloc(109); } // @leak:pvalloc

int main(void) {
    leak_malloc();
    leak_calloc();
    leak_realloc();
    leak_reallocarray();
    leak_posix_memalign();
    leak_aligned_alloc();
    leak_valloc();
    leak_memalign();
    leak_pvalloc();
    /* Freed: not reported. free(NULL) is not a free. */
    free(malloc(1000));
    free(calloc(10, 10));
    void *p;
    posix_memalign(&p, 16, 64);
    free(p);
    free(NULL);
    for (int i = 0; i < n; i++) keep[i] = (void *)((unsigned long)keep[i] ^ 1); /* hide pointers */
    return 0;
}
