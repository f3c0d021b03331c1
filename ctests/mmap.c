/* mmap leaks, a partial munmap that leaves two pieces, and mremap. */
#define _GNU_SOURCE
#include <sys/mman.h>

#define PAGE 4096

int main(void) {
    char *a = mmap(0, 5 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); // @leak:mmap_split
    munmap(a + PAGE, PAGE);          /* leaves [a, a+1p) and [a+2p, a+5p) */
    char *b = mmap(0, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(b, 2 * PAGE);             /* fully unmapped: not reported */
    char *c = mmap(0, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    c[0] = 1;
    c = mremap(c, PAGE, 3 * PAGE, MREMAP_MAYMOVE); // @leak:mremap
    return c[0] == 1 ? 0 : 1;
}
