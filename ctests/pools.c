/* Allocations the program records itself: a pool of connections, blocks
   of its own arena, and a pool block at the same address as a heap block.
   Each pool's addresses are its own: freeing the heap block does not free
   the pool block. */
#include <stdlib.h>

#include "../include/mtrace.h"

static char arena[4096];

int main(void) {
    for (long i = 1; i <= 8; i++) MTRACE(mtrace_alloc, "conn", (void *)i, 1); // @leak:conn
    for (long i = 1; i <= 6; i++) MTRACE(mtrace_free, "conn", (void *)i);
    MTRACE(mtrace_alloc, "arena", arena, 256); // @leak:arena
    MTRACE(mtrace_alloc, "arena", arena + 256, 512);
    MTRACE(mtrace_free, "arena", arena + 256);
    void *p = malloc(64);
    MTRACE(mtrace_alloc, "alias", p, 64); // @leak:alias
    free(p);
    return 0;
}
