/* A mapping of the program's own that the kernel merges with one of
   malloc's: a large block is a mapping of its own (malloc's mmap), and the
   program maps anonymous memory right next to it, which /proc/self/maps then
   shows as one mapping. The only pointer to a small block (@leak:kept) is
   in the program's part: still reachable, as memcheck says. A block only
   that part pointed to before it was cleared (@leak:lost) is definitely
   lost. Exit status 2 if the kernel did not merge the mappings (the same
   blocks are made, but the layout the test is about is not there). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void *big;

/* The mapping of /proc/self/maps that holds `p`: [lo, hi). */
static int mapping_of(void *p, unsigned long *lo, unsigned long *hi) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long a, b;
        if (sscanf(line, "%lx-%lx", &a, &b) == 2 && a <= (unsigned long)p && (unsigned long)p < b) {
            *lo = a, *hi = b, found = 1;
        }
    }
    if (f)
        fclose(f);
    return found;
}

int main(void) {
    /* Another thread (the tracer's writer) may map something next to
       malloc's mapping first: try again with a new large block. */
    void **mine = MAP_FAILED;
    unsigned long lo, hi, lo2, hi2;
    for (int attempt = 0; attempt < 50 && mine == MAP_FAILED; attempt++) {
        big = malloc(1 << 20);
        memset(big, 0, 1 << 20);
        if (!mapping_of(big, &lo, &hi))
            return 2;
        /* Just below malloc's mapping, else just above it. */
        int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE;
        mine = mmap((void *)(lo - 65536), 65536, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (mine == MAP_FAILED)
            mine = mmap((void *)hi, 65536, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (mine != MAP_FAILED && !(mapping_of(mine, &lo2, &hi2) && lo2 <= lo && hi <= hi2)) {
            munmap(mine, 65536);
            mine = MAP_FAILED;
        }
        if (mine == MAP_FAILED)
            free(big);
    }
    int merged = mine != MAP_FAILED;
    if (!merged) {
        /* The same blocks, without the layout (under valgrind, say). */
        big = malloc(1 << 20);
        mine = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mine == MAP_FAILED)
            return 1;
    }
    mine[100] = malloc(40); // @leak:kept
    void *volatile gone = malloc(56); // @leak:lost
    mine[200] = gone;
    gone = NULL;
    mine[200] = NULL;
    return merged ? 0 : 2;
}
