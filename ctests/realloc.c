/* realloc chains, a failed realloc (the old block survives) and
   realloc(p, 0) (a free, as glibc defines it). Exactly 5 allocation calls
   and 1 free reach the tracer. */
#include <stdint.h>
#include <stdlib.h>

static void *keep[4];

int main(void) {
    char *p = malloc(10);
    p = realloc(p, 20);
    p = realloc(p, 30); // @leak:chain
    char *q = malloc(40); // @leak:survivor
    char *r = realloc(q, SIZE_MAX / 2); /* fails */
    char *z = malloc(50);
    z = realloc(z, 0); /* frees */
    free(r);           /* free(NULL): nothing */
    keep[0] = p;
    keep[1] = q;
    keep[2] = z;
    return 0;
}
