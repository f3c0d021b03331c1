/* A library that leaks; the test program dlcloses it before exit. Built
   with -O2 -fomit-frame-pointer: unwinding through it needs its CFI, which
   the tracer learns about only after the dlopen. */
#include <stdlib.h>

void *dl_leak(void) {
    void *p = malloc(601); // @leak:in_library
    __asm__ volatile("" ::: "memory"); /* not a tail call */
    return p;
}
