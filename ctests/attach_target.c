/* A long-running program for `mtrace attach`: it waits in read() for
   commands on stdin, one per line, and answers each on stdout:
     leak N   allocate N bytes and keep them (@leak:window)
     tmp N    allocate N bytes and free them
     free     free the oldest kept block
     lose N   allocate N bytes and drop the only pointer (@leak:lost)
     hang N   allocate N bytes, pointed to only from the block from before
              any attach (@leak:hang)
     mismatch N  allocate N bytes with malloc and free them with C++'s
              operator delete where one is loaded (libmtrace.so has one): a
              mismatched free (@leak:mismatch_alloc, @leak:mismatch_free)
     nudge    allocate a byte and free it (@leak:nudge): with one thread
              the tracer carries out what was asked of it at its next
              allocation call (docs/PROCESSES.md)
     title    zero its environment's strings where the kernel put them, as
              a process title does (redis-server's): /proc/PID/environ
              shows no LD_PRELOAD then
     quit     print how many blocks it holds and exit with status 3
   It holds one block from before any attach (@leak:before). */
#define _GNU_SOURCE
#include <dlfcn.h>
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

static char **before;

/* Out of line and with its stack scrubbed after, so that no copy of the
   pointer stays where the leak scan looks. */
__attribute__((noinline)) static void lose(size_t n) {
    char *volatile p = malloc(n); // @leak:lost
    memset(p, 'l', n);
    p = NULL;
}

/* In a frame of its own: main's frame keeps no copy of the pointer (a
   stale one there made a block lost later at that address look
   reachable). */
__attribute__((noinline)) static void nudge(void) {
    free(malloc(1)); // @leak:nudge
}

__attribute__((noinline)) static void scrub(void) {
    volatile char junk[4096];
    memset((char *)junk, 0, sizeof junk);
}

int main(void) {
    before = malloc(1000); // @leak:before
    memset(before, 0, 1000);
    char line[256];
    /* Buffers of its own: glibc would allocate stdin's at the first read,
       which may come after an attach. */
    static char inbuf[4096], outbuf[4096];
    setvbuf(stdin, inbuf, _IOFBF, sizeof inbuf);
    setvbuf(stdout, outbuf, _IOLBF, sizeof outbuf);
    printf("ready\n");
    while (fgets(line, sizeof line, stdin)) {
        size_t n = 0;
        if (sscanf(line, "leak %zu", &n) == 1) {
            kept[nkept++] = keep(n);
        } else if (sscanf(line, "tmp %zu", &n) == 1) {
            char *volatile p = malloc(n); // @leak:tmp
            free(p);
        } else if (sscanf(line, "lose %zu", &n) == 1) {
            lose(n);
            scrub();
        } else if (sscanf(line, "hang %zu", &n) == 1) {
            before[0] = malloc(n); // @leak:hang
            scrub();
        } else if (sscanf(line, "mismatch %zu", &n) == 1) {
            char *p = malloc(n); // @leak:mismatch_alloc
            void (*del)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "_ZdlPv");
            if (del) {
                del(p); // @leak:mismatch_free
            } else {
                free(p);
            }
        } else if (strncmp(line, "title", 5) == 0) {
            extern char **environ;
            for (char **e = environ; *e; e++)
                memset(*e, 0, strlen(*e));
        } else if (strncmp(line, "nudge", 5) == 0) {
            nudge();
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
