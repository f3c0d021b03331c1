/* A library the program links, whose destructor runs at exit after the
   program's: it reads the environment, writes with stdio and allocates.
   Built twice from this file: with -DLIB -shared as libexit_order.so, and
   as the program that links it. Under a tracer that ran glibc's freeres
   before this destructor, getenv found nothing (freeres empties the
   environment) and stdio's buffers were gone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LIB
static char *kept;

__attribute__((destructor)) static void at_exit_of_lib(void) {
    const char *v = getenv("EXIT_ORDER");
    char *copy = strdup(v ? v : "(none)");
    printf("library destructor: EXIT_ORDER=%s\n", copy);
    free(copy);
    free(kept);
}

void lib_keep(size_t n) {
    kept = malloc(n);
    memset(kept, 1, n);
}
#else
void lib_keep(size_t n);

int main(void) {
    lib_keep(64);
    puts("main returns");
    return 0;
}
#endif
