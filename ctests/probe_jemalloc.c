/* Probes for jemalloc as folly does: a weak reference to mallocx, and the
   global scope asked for it. Prints "jemalloc: yes" or "jemalloc: no". A
   tracer must not change the answer (it must export no mallocx of its
   own). Allocates through mallocx when it is there: one block freed with
   sdallocx, one kept (@leak:probe). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

extern void *mallocx(size_t size, int flags) __attribute__((weak));
extern void sdallocx(void *p, size_t size, int flags) __attribute__((weak));

static void *volatile keep;

int main(void) {
    int weak = mallocx != NULL;
    int global = dlsym(RTLD_DEFAULT, "mallocx") != NULL;
    if (weak && sdallocx) {
        sdallocx(mallocx(64, 0), 64, 0);
        keep = mallocx(77, 0); // @leak:probe
    }
    printf("jemalloc: %s\n", weak && global ? "yes" : weak || global ? "half" : "no");
    return 0;
}
