/* Writes a glibc MALLOC_TRACE log when run with MALLOC_TRACE=FILE and
   LD_PRELOAD=libc_malloc_debug.so.0 (glibc 2.34 and later). */
#include <mcheck.h>
#include <stdlib.h>

void *keep[4];

int main(void) {
    mtrace();
    void *a = malloc(100);
    void *b = malloc(200);
    b = realloc(b, 300); // @leak:realloc
    keep[0] = b;
    keep[1] = calloc(4, 10); // @leak:calloc
    free(a);
    muntrace();
    return 0;
}
