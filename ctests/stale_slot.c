/* A free() whose return-address slot is left as it was, then an
   allocation deeper down the stack: the ptrace tracer must not take the
   allocation for part of the free (its return address is still in the
   slot, since nothing wrote there). */
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) void release(void *p) { free(p); }

/* A frame whose locals are not written: the old slot stays as it was. */
__attribute__((noinline)) void *deep(int n) {
    volatile char pad[512];
    pad[511] = (char)n;
    if (n > 0) return deep(n - 1);
    return malloc(24); // @leak:deep
}

int main(void) {
    release(malloc(16));
    void *p = deep(3);
    memset(p, 0, 24);
    return 0;
}
