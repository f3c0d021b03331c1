/* Leak scans while the program runs. Block "hidden" has its only pointer
   stored XORed while the program asks for two scans (the scan signal, then
   mtrace_scan()), and is found again before exit; block "kept" is reachable
   from a global during the scans and dropped before exit. So the scans
   must report hidden definitely lost and kept still reachable, and the scan
   at exit the opposite. Run it with MTRACE_SCAN_SIGNAL=USR2. While it
   waits for the signal's report it allocates and frees a byte every 5 ms:
   a process with one thread answers at its next allocation call. With the
   argument "signal" (for mtrace run --ptrace, where the tracer takes the
   signal and scans before the program goes on) only the signal's scan. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../include/mtrace.h"

#define MASK ((uintptr_t)0x5a5a5a5a5a5a5a5aULL)

uintptr_t hidden;
void *found;
void *kept;

__attribute__((noinline)) static void make(void) {
    hidden = (uintptr_t)malloc(201) ^ MASK; // @leak:hidden
    kept = malloc(202); // @leak:kept
}

/* Overwrites the dead stack below main so no stale copy of a pointer from
   make() survives there. */
__attribute__((noinline)) static void scrub(void) {
    volatile char junk[16384];
    memset((char *)junk, 0, sizeof junk);
}

int main(int argc, char **argv) {
    make();
    scrub();
    if (argc > 1 && strcmp(argv[1], "signal") == 0) {
        raise(SIGUSR2);
        found = (void *)(hidden ^ MASK);
        kept = NULL;
        return 0;
    }
    if (!mtrace_scan)
        return 0; /* not traced: SIGUSR2 would end the program */
    raise(SIGUSR2);
    /* A process with one thread has no writer thread: it scans at its
       next allocation call (docs/PROCESSES.md), the first of this loop;
       its report appears after. */
    char name[64];
    snprintf(name, sizeof name, "scan_live-%d-1.memlog", (int)getpid());
    for (int i = 0; i < 4000 && access(name, F_OK) != 0; i++) {
        free(malloc(1));
        usleep(5000);
    }
    if (mtrace_scan("api.memlog") != 0)
        return 3;
    found = (void *)(hidden ^ MASK);
    kept = NULL;
    return 0;
}
