/* A server left running in a container: 100 bytes allocated and kept
   every 20 ms (the line marked tick), for ever. analyzer/tests/containers.rs
   starts it under `unshare` and `chroot` in a root only its own mount
   namespace sees, holding it, libc and the loader. */
#include <stdlib.h>
#include <unistd.h>

void *kept[1 << 16];

__attribute__((noinline)) static void tick(int i) {
    kept[i % (1 << 16)] = malloc(100); // @leak:tick
}

int main(void) {
    for (int i = 0;; i++) {
        tick(i);
        usleep(20000);
    }
}
