/* The analyzer at scale, for `scripts/bench --only scale`: allocates N
   blocks of 16..79 bytes and keeps them all (argv[1]), then makes M random
   replacements (argv[2]): a block picked at random is freed and a new one
   of a random size takes its place. N live blocks at the end; N + 2M
   events. Sizes and picks come from a fixed generator, so every run is
   the same. */
#include <stdio.h>
#include <stdlib.h>

static unsigned long long state = 88172645463325252ULL;
static unsigned long long next(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    unsigned long n = strtoul(argv[1], NULL, 10), m = strtoul(argv[2], NULL, 10);
    void **live = malloc(n * sizeof *live);
    if (!live)
        return 1;
    for (unsigned long i = 0; i < n; i++)
        live[i] = malloc(16 + next() % 64);
    for (unsigned long j = 0; j < m; j++) {
        unsigned long i = next() % n;
        free(live[i]);
        live[i] = malloc(16 + next() % 64);
    }
    /* Escapes, so that nothing is optimised away. */
    printf("%p\n", live[next() % n]);
    return 0;
}
