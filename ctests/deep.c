/* Leaks at three depths, for the text report's frames (--num-callers):
   main leaks 10 bytes itself, a thread's start routine 20 bytes, and
   main leaks 30 bytes at the bottom of 20 recursive calls (a backtrace of
   22 frames up to main). Build without optimisation (no inlining, no
   tail calls). */
#include <pthread.h>
#include <stdlib.h>

static void *sink[3];

static void leaf(void) {
    sink[2] = malloc(30); /* @leak:leaf */
    sink[2] = 0;
}

static void down(int n) {
    if (n == 0)
        leaf(); /* @leak:down_last */
    else
        down(n - 1); /* @leak:down */
}

static void *routine(void *arg) {
    (void)arg;
    sink[1] = malloc(20); /* @leak:routine */
    sink[1] = 0;
    return NULL;
}

int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, routine, NULL);
    pthread_join(t, NULL);
    sink[0] = malloc(10); /* @leak:main */
    sink[0] = 0;
    down(19); /* @leak:main_down */
    return 0;
}
