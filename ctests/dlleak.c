/* A library that leaks; the test program dlcloses it before exit. */
#include <stdlib.h>

void *dl_leak(void) {
    return malloc(601); // @leak:in_library
}
