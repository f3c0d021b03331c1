/* Each of THREADS threads frees a block main allocated and returns a block
   of its own, which main frees: everything is freed (valgrind: "All heap
   blocks were freed"), and an address often changes hands twice within
   one round of the tracer's writer. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 1000
#define AT_ONCE 8

static void *swap(void *arg) {
    free(arg);
    void *mine = malloc(48);
    memset(mine, 1, 48);
    return mine;
}

int main(void) {
    for (int i = 0; i < THREADS; i += AT_ONCE) {
        pthread_t t[AT_ONCE];
        for (int k = 0; k < AT_ONCE; k++) {
            void *b = malloc(48);
            memset(b, 2, 48);
            pthread_create(&t[k], NULL, swap, b);
        }
        for (int k = 0; k < AT_ONCE; k++) {
            void *back;
            pthread_join(t[k], &back);
            free(back);
        }
    }
    return 0;
}
