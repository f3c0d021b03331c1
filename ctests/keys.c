/* Takes every pthread key there is (PTHREAD_KEYS_MAX, 1,024 with glibc)
   in a thread that allocated first, and prints how many it got: a tracer
   that took one of the program's keys leaves it one fewer. */
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static void *take_all(void *arg) {
    (void)arg;
    char *p = malloc(16);
    p[0] = 1;
    free(p);
    pthread_key_t k;
    long n = 0;
    while (pthread_key_create(&k, NULL) == 0)
        n++;
    return (void *)n;
}

int main(void) {
    pthread_t t;
    void *n;
    pthread_create(&t, NULL, take_all, NULL);
    pthread_join(t, &n);
    printf("%ld of %d keys\n", (long)n, PTHREAD_KEYS_MAX);
    return 0;
}
