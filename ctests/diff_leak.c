/* Two runs to compare with `mtrace diff`: 100 blocks of 32 bytes from one
   line (@leak:loop), of which the first N (argv[1], default 0) are kept,
   and one block of 64 bytes kept in every run (@leak:always). */
#include <stdlib.h>

void *volatile kept[100];
void *volatile always;

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 0;
    always = malloc(64); // @leak:always
    for (int i = 0; i < 100; i++) {
        void *p = malloc(32); // @leak:loop
        if (i < n)
            kept[i] = p;
        else
            free(p);
    }
    return 0;
}
