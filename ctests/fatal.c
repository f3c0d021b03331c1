/* Programs that die of a signal: the leak scan runs on the way out, and the
   process still dies of its signal (docs/SCAN.md). Every mode first leaks
   200 bytes (definitely lost) and keeps 100 in a global (still reachable),
   then:
     assert     an assert fails (glibc's own abort: SIGABRT)
     abort      calls abort()
     segv       writes through a null pointer (SIGSEGV)
     term       raises SIGTERM
     double2    two threads free a block twice at the same moment (glibc
                aborts in both)
     segvabort  one thread faults while another aborts
   Build without optimisation: the lost block's pointer must be gone. */
#include <assert.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

static char *kept;
static pthread_barrier_t together;

static void leak(void) {
    char *lost = malloc(200); /* @leak:lost */
    lost[0] = 1;
    lost = 0;
}

static void *double_free(void *arg) {
    (void)arg;
    char *p = malloc(32);
    free(p);
    pthread_barrier_wait(&together);
    free(p);
    return NULL;
}

static void *fault(void *arg) {
    (void)arg;
    pthread_barrier_wait(&together);
    *(volatile int *)arg = 1;
    return NULL;
}

static void *aborts(void *arg) {
    (void)arg;
    pthread_barrier_wait(&together);
    abort();
}

static void two(void *(*a)(void *), void *(*b)(void *)) {
    pthread_t t[2];
    pthread_barrier_init(&together, NULL, 2);
    pthread_create(&t[0], NULL, a, NULL);
    pthread_create(&t[1], NULL, b, NULL);
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    kept = malloc(100); /* @leak:kept */
    leak();
    if (!strcmp(mode, "assert"))
        assert(argc == 0);
    if (!strcmp(mode, "abort"))
        abort();
    if (!strcmp(mode, "segv"))
        *(volatile int *)(argv[0] - (long)argv[0]) = 1;
    if (!strcmp(mode, "term"))
        raise(SIGTERM);
    if (!strcmp(mode, "double2"))
        two(double_free, double_free);
    if (!strcmp(mode, "segvabort"))
        two(fault, aborts);
    return 0;
}
