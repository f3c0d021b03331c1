/* For scripts/sigkill_loss: allocates and frees without pause, counting
   the pairs in a shared file (its path is argv[1]) that outlives a SIGKILL. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC, 0600);
    ftruncate(fd, 4096);
    volatile unsigned long *c = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    for (;;) {
        void *volatile p = malloc(64);
        free(p);
        c[0]++;
        struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
        c[1] = t.tv_sec * 1000000000UL + t.tv_nsec;
    }
}
