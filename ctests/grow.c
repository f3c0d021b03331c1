/* A steady leak beside a one-time larger one: 12 rounds 20 ms apart each
   leak 100 bytes; a single 5,000-byte block is kept from the start. */
#include <stdlib.h>
#include <unistd.h>

void *keep[16];
void *once;

int main(void) {
    once = malloc(5000); // @leak:once
    for (int i = 0; i < 12; i++) {
        keep[i] = malloc(100); // @leak:grow
        usleep(20 * 1000);
    }
    return 0;
}
