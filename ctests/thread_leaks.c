/* Blocks lost through threads that are gone, 100 threads one after the
   other, argv[1] saying how (valgrind: each block definitely lost):
     arg       main allocates a block for each thread and forgets it; the
               thread reads it and returns (@leak:arg)
     ret       each thread returns a block; main joins it and drops the
               value (@leak:ret)
     detached  each detached thread allocates a block it drops before
               returning (@leak:detached)
     tsd       a thread-specific-data destructor allocates 1,337 bytes and
               drops them (one thread; @leak:tsd)
     none      each thread allocates and frees, and main dlopens a library
               (valgrind: no leak of any kind)
   The exited threads' stacks stay mapped in glibc's cache, with stale
   pointers to the blocks in their dead frames. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define THREADS 100

static volatile long sink;

static void *reads_arg(void *p) {
    sink += ((char *)p)[0];
    return NULL;
}

static void *returns_block(void *p) {
    (void)p;
    char *b = malloc(40); // @leak:ret
    b[0] = 1;
    return b;
}

static void *drops_block(void *p) {
    (void)p;
    char *volatile b = malloc(24); // @leak:detached
    b[0] = 2;
    sink += b[0];
    return NULL;
}

static void *frees_block(void *p) {
    (void)p;
    char *b = malloc(64);
    b[0] = 4;
    free(b);
    return NULL;
}

static pthread_key_t key;

static void destructor(void *v) {
    (void)v;
    char *volatile b = malloc(1337); // @leak:tsd
    memset(b, 3, 1337);
}

static void *sets_specific(void *p) {
    (void)p;
    pthread_setspecific(key, (void *)1);
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "arg";
    pthread_t t;
    if (strcmp(mode, "tsd") == 0) {
        pthread_key_create(&key, destructor);
        pthread_create(&t, NULL, sets_specific, NULL);
        pthread_join(t, NULL);
        return 0;
    }
    if (strcmp(mode, "none") == 0) {
        void *h = dlopen("libm.so.6", RTLD_NOW);
        for (int i = 0; i < THREADS; i++) {
            pthread_create(&t, NULL, frees_block, NULL);
            pthread_join(t, NULL);
        }
        if (h)
            dlclose(h);
        return 0;
    }
    for (int i = 0; i < THREADS; i++) {
        if (strcmp(mode, "arg") == 0) {
            char *volatile a = malloc(32); // @leak:arg
            a[0] = 1;
            pthread_create(&t, NULL, reads_arg, a);
            a = NULL;
            pthread_join(t, NULL);
        } else if (strcmp(mode, "ret") == 0) {
            void *r;
            pthread_create(&t, NULL, returns_block, NULL);
            pthread_join(t, &r);
            r = NULL;
        } else {
            pthread_attr_t at;
            pthread_attr_init(&at);
            pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
            pthread_create(&t, &at, drops_block, NULL);
            pthread_attr_destroy(&at);
        }
    }
    /* Detached threads end on their own. */
    usleep(200000);
    return 0;
}
