/* A program for the console (`mtrace run -i`, also --ptrace): it keeps ten
   blocks, loses one, then sleeps argv[1] ms (default 2000) for the
   console's commands, then keeps ten more and exits. While it sleeps a
   scan finds 777 bytes definitely lost and 10,045 still reachable. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

void *keep[20];

__attribute__((noinline)) static void grow(int i) {
    keep[i] = malloc(1000 + i); // @leak:kept
    memset(keep[i], 1, 8);
}

__attribute__((noinline)) static void lose(void) {
    char *volatile p = malloc(777); // @leak:lost
    memset(p, 2, 8);
    p = NULL;
}

/* Overwrites the dead stack below main, and the registers memset used,
   so that no stale copy of the lost pointer survives where a scan looks. */
__attribute__((noinline)) static void scrub(void) {
    volatile char junk[16384];
    memset((char *)junk, 0, sizeof junk);
}

int main(int argc, char **argv) {
    long ms = argc > 1 ? atol(argv[1]) : 2000;
    for (int i = 0; i < 10; i++) grow(i);
    lose();
    scrub();
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    for (int i = 10; i < 20; i++) grow(i);
    return 0;
}
