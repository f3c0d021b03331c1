/* Two threads allocating and freeing without pause until standard input
   ends (or for SECONDS, argv[1]), each keeping 64 blocks live at a time,
   for `mtrace attach` to come and go while they run. Prints "done ok" and
   exits 0. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile int stop;

static void *work(void *arg) {
    long id = (long)arg;
    unsigned long n = 0;
    void *slots[64] = {0};
    while (!stop) {
        int i = n % 64;
        free(slots[i]);
        slots[i] = malloc(16 + (n * 7 + id) % 500);
        memset(slots[i], 1, 16);
        n++;
    }
    for (int i = 0; i < 64; i++) free(slots[i]);
    return (void *)n;
}

int main(int argc, char **argv) {
    pthread_t t[2];
    for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, work, (void *)i);
    if (argc > 1) {
        sleep(atoi(argv[1]));
    } else {
        char buf[64];
        while (read(0, buf, sizeof buf) > 0) {
        }
    }
    stop = 1;
    unsigned long total = 0;
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(t[i], &r);
        total += (unsigned long)r;
    }
    printf("done %s\n", total > 0 ? "ok" : "none");
    return 0;
}
