/* Short-lived threads in batches (argv[1] at a time, 1,000 in all): each
   frees a 300-byte block main allocated for it, makes 100 short-lived
   blocks, and returns a 200-byte block that main frees after joining it.
   The returned blocks land at the same few addresses of the threads'
   arenas batch after batch, so one address sees an allocation by a new
   thread and a free by main hundreds of times, each thread's events in a
   buffer of its own. Everything is freed (valgrind: "All heap blocks were
   freed"), unless argv[2] says:
     leak    main keeps every 100th thread's block (10 blocks, @leak:returned)
     double  after the batches, one more thread frees a block main
             allocated for it, and main frees it again after joining: one
             double free across threads (@leak:once, @leak:first_free,
             @leak:second_free); glibc may not notice, so main ends at once,
             before the corrupted heap does more harm */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define THREADS 1000

static void *kept[THREADS / 100];
static int nkept;

static void *free_it(void *p) {
    free(p); // @leak:first_free
    return NULL;
}

static void *work(void *arg) {
    free(arg);
    for (int k = 0; k < 100; k++) {
        char *q = malloc(k + 1);
        q[0] = (char)k;
        free(q);
    }
    char *mine = malloc(200); // @leak:returned
    memset(mine, 1, 200);
    return mine;
}

int main(int argc, char **argv) {
    int at_once = argc > 1 ? atoi(argv[1]) : 8;
    const char *mode = argc > 2 ? argv[2] : "";
    if (at_once < 1 || at_once > 64) at_once = 8;
    for (int i = 0; i < THREADS; i += at_once) {
        pthread_t t[64];
        int n = THREADS - i < at_once ? THREADS - i : at_once;
        for (int k = 0; k < n; k++) {
            char *arg = malloc(300);
            memset(arg, 2, 300);
            pthread_create(&t[k], NULL, work, arg);
        }
        for (int k = 0; k < n; k++) {
            void *back;
            pthread_join(t[k], &back);
            if (strcmp(mode, "leak") == 0 && (i + k) % 100 == 0)
                kept[nkept++] = back;
            else
                free(back);
        }
    }
    if (strcmp(mode, "double") == 0) {
        pthread_t t;
        char *once = malloc(300); // @leak:once
        memset(once, 3, 300);
        pthread_create(&t, NULL, free_it, once);
        pthread_join(t, NULL);
        free(once); // @leak:second_free
        _exit(0);
    }
    return 0;
}
