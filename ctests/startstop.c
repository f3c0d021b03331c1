/* Collection switched on and off: MTRACE_START=off, then glibc's mtrace()
   and muntrace() and the mtrace_start()/mtrace_stop() API. Only the two
   marked blocks are recorded and never freed. */
#include <mcheck.h>
#include <stdlib.h>

#include "../include/mtrace.h"

void *keep[8];

int main(void) {
    keep[0] = malloc(901); /* before collection starts: not recorded */
    mtrace();              /* the first call starts collection */
    keep[1] = malloc(902); // @leak:after_start
    void *t = malloc(50); // @leak:temporary
    mtrace();              /* later calls: incremental report 1 */
    free(t);
    MTRACE(mtrace_stop);
    keep[2] = malloc(903); /* not recorded */
    free(keep[0]);         /* recorded: a block the trace never saw */
    MTRACE(mtrace_start);
    keep[3] = malloc(904); // @leak:after_restart
    muntrace();            /* stops, and report 2 */
    keep[4] = malloc(905); /* not recorded */
    return 0;
}
