/* A program with its own allocation wrappers (as git's xmalloc, redis's
   zmalloc): a `wrapper:` line of a suppressions file folds them with the
   allocator's frames, and the report names the caller (issue 65, item 3).
   Built without optimisation: each wrapper is a frame. */
#include <stdio.h>
#include <stdlib.h>

static void *kept;

__attribute__((noinline)) static void *xmalloc_checked(size_t n) {
    void *p = malloc(n);
    if (!p)
        abort();
    return p;
}

__attribute__((noinline)) static void *xmalloc(size_t n) { return xmalloc_checked(n); }

__attribute__((noinline)) static void make_table(void) {
    kept = xmalloc(200); /* @leak:table */
}

int main(void) {
    make_table(); /* @leak:main */
    kept = NULL;
    puts("done");
    return 0;
}
