/* Blocks allocated and freed through an allocator's own entry points, not
   the malloc family's names: build with -DJEMALLOC (-ljemalloc), -DMIMALLOC
   (-lmimalloc) or -DTCMALLOC (-ltcmalloc). Each allocator's blocks may also
   be freed with free(), which is no wrong free. Two blocks stay allocated
   (@leak:kept, 100 bytes, and @leak:grown, 500 bytes after a resize); every
   other block is freed, through the allocator's own frees, with no wrong
   free. Built at -O0: the compiler must keep every call. */
#include <stdio.h>
#include <stdlib.h>

#if defined(JEMALLOC)
#include <jemalloc/jemalloc.h>
#define ALLOC(n) mallocx(n, 0)
#define ALLOC_ALIGNED(n) mallocx(n, MALLOCX_ALIGN(64))
#define RESIZE(p, n) rallocx(p, n, 0)
#define FREE(p) dallocx(p, 0)
#define FREE_SIZED(p, n) sdallocx(p, n, 0)
#elif defined(MIMALLOC)
#include <mimalloc.h>
#define ALLOC(n) mi_malloc(n)
#define ALLOC_ALIGNED(n) mi_malloc_aligned(n, 64)
#define RESIZE(p, n) mi_realloc(p, n)
#define FREE(p) mi_free(p)
#define FREE_SIZED(p, n) mi_free_size(p, n)
#elif defined(TCMALLOC)
#include <gperftools/tcmalloc.h>
#define ALLOC(n) tc_malloc(n)
#define ALLOC_ALIGNED(n) tc_memalign(64, n)
#define RESIZE(p, n) tc_realloc(p, n)
#define FREE(p) tc_free(p)
#define FREE_SIZED(p, n) tc_free_sized(p, n)
#else
#error "build with -DJEMALLOC, -DMIMALLOC or -DTCMALLOC"
#endif

static void *volatile keep[2];

int main(void) {
    keep[0] = ALLOC(100); // @leak:kept
    for (int i = 0; i < 1000; i++) {
        void *a = ALLOC(200);
        FREE_SIZED(a, 200);
        void *b = ALLOC_ALIGNED(300);
        FREE(b);
        void *c = ALLOC(64);
        free(c);
        /* Addresses handed out again: a free the tracer missed would make
           these look like allocations over live blocks. */
        void *d = malloc(200);
        FREE(d);
    }
    void *g = ALLOC(50);
    keep[1] = RESIZE(g, 500); // @leak:grown
    puts("allocator_api: done");
    return 0;
}
