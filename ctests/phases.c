/* Three phases a tenth of a second apart, each leaving blocks of its own
   (marked "@leak:NAME"), with markers between them, for the HTML report's
   time ranges: a range over phase 2 shows phase 2's blocks only. Each phase
   also allocates and frees a temporary 4 MiB buffer (memory over time). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../include/mtrace.h"

static void *keep[64];
static int n;

__attribute__((noinline)) static void phase_one(void) {
    for (int i = 0; i < 10; i++) keep[n++] = malloc(1000); // @leak:one
}

__attribute__((noinline)) static void phase_two(void) {
    for (int i = 0; i < 5; i++) keep[n++] = malloc(3000); // @leak:two
}

__attribute__((noinline)) static void phase_three(void) {
    keep[n++] = malloc(7000); // @leak:three
}

__attribute__((noinline)) static void buffer(void) {
    char *b = malloc(4 << 20); // @leak:buffer
    memset(b, 1, 4 << 20);
    usleep(50 * 1000);
    free(b);
}

int main(void) {
    MTRACE(mtrace_marker, "one");
    phase_one();
    buffer();
    usleep(50 * 1000);
    MTRACE(mtrace_marker, "two");
    phase_two();
    buffer();
    usleep(50 * 1000);
    MTRACE(mtrace_marker, "three");
    phase_three();
    buffer();
    usleep(50 * 1000);
    MTRACE(mtrace_marker, "end");
    /* The pointers are dropped: every block is definitely lost. */
    memset(keep, 0, sizeof keep);
    return 0;
}
