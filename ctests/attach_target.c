/* A long-running program for `mtrace attach`: it waits in read() for
   commands on stdin, one per line, and answers each on stdout:
     leak N   allocate N bytes and keep them (@leak:window)
     tmp N    allocate N bytes and free them
     free     free the oldest kept block
     quit     print how many blocks it holds and exit with status 3
   It holds one block from before any attach (@leak:before). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *kept[100000];
static int nkept, first;

static void *keep(size_t n) {
    char *p = malloc(n); // @leak:window
    memset(p, 'k', n);
    return p;
}

int main(void) {
    char *before = malloc(1000); // @leak:before
    memset(before, 'b', 1000);
    char line[256];
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    while (fgets(line, sizeof line, stdin)) {
        size_t n = 0;
        if (sscanf(line, "leak %zu", &n) == 1) {
            kept[nkept++] = keep(n);
        } else if (sscanf(line, "tmp %zu", &n) == 1) {
            char *volatile p = malloc(n);
            free(p);
        } else if (strncmp(line, "free", 4) == 0 && first < nkept) {
            free(kept[first++]);
        } else if (strncmp(line, "quit", 4) == 0) {
            printf("holding %d blocks\n", nkept - first);
            return 3;
        }
        printf("ok %s", line);
    }
    return 0;
}
