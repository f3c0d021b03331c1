/* A thread busy inside the dynamic loader while main returns: the leak
   scan at exit stops it there, holding the loader's lock, and must not
   wait for that lock (LLVM's LeakSanitizer has a regression test of the
   same shape, for the same reason).

   loader_busy iterate: the thread calls dl_iterate_phdr, whose callback
     allocates and frees 1,000 blocks 50 times; main returns once the
     first round is done (the callback still running).
   loader_busy dlopen LIB: the thread dlopens and dlcloses LIB in a loop;
     main returns after its tenth round.

   A watchdog thread sleeps 20 s (usleep: a stop by signal would cut it
   short) and then, if the process still runs, prints "stuck" and ends it
   with status 1. Natively: exit status 0, always. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rounds;
static const char *lib;

static int busy_callback(struct dl_phdr_info *info, size_t size, void *data) {
    (void)info, (void)size, (void)data;
    for (int round = 0; round < 50; round++) {
        void *p[1000];
        for (int i = 0; i < 1000; i++)
            p[i] = malloc(16 * i + 1);
        for (int i = 0; i < 1000; i++)
            free(p[i]);
        __atomic_add_fetch(&rounds, 1, __ATOMIC_SEQ_CST);
    }
    return 1;
}

static void *iterate(void *arg) {
    (void)arg;
    dl_iterate_phdr(busy_callback, NULL);
    return NULL;
}

static void *open_close(void *arg) {
    (void)arg;
    for (;;) {
        void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "%s\n", dlerror());
            exit(2);
        }
        dlclose(h);
        __atomic_add_fetch(&rounds, 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

static void *watchdog(void *arg) {
    (void)arg;
    usleep(20 * 1000 * 1000);
    fprintf(stderr, "stuck\n");
    _exit(1);
}

int main(int argc, char **argv) {
    int dl = argc > 2 && !strcmp(argv[1], "dlopen");
    if (!dl && !(argc > 1 && !strcmp(argv[1], "iterate"))) {
        fprintf(stderr, "usage: loader_busy iterate | dlopen LIB\n");
        return 2;
    }
    lib = dl ? argv[2] : NULL;
    pthread_t t, w;
    pthread_create(&w, NULL, watchdog, NULL);
    pthread_detach(w);
    pthread_create(&t, NULL, dl ? open_close : iterate, NULL);
    pthread_detach(t);
    while (__atomic_load_n(&rounds, __ATOMIC_SEQ_CST) < (dl ? 10 : 1))
        usleep(100);
    return 0;
}
