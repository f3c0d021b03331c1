/* Built for another C library than glibc (musl-gcc): libmtrace.so cannot
   be preloaded, so `mtrace run` traces it with --ptrace and says so in
   one line (issue 66, item 3). One block of 3,000 bytes definitely lost;
   stdout says it ran. */
#include <stdio.h>
#include <stdlib.h>

void *volatile sink;

int main(void) {
    sink = malloc(3000); /* @leak:lost */
    sink = NULL;
    puts("ran");
    return 0;
}
