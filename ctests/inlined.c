/* Built with -O2: make_buffer is inlined into its caller, and the report
   must show both, the inlined one marked as such. */
#include <stdlib.h>

void *keep[4]; /* global: -O2 must not drop the allocations */

static inline __attribute__((always_inline)) void *make_buffer(size_t n) {
    return malloc(n * 2); // @leak:inlined
}

__attribute__((noinline)) void fill(int i) {
    keep[i] = make_buffer(450 + (size_t)i); // @leak:caller
}

__attribute__((noinline)) void many(void) {
    for (int i = 0; i < 3; i++) keep[1 + i] = malloc(10); // @leak:three_small
}

int main(void) {
    fill(0);
    many();
    return 0;
}
