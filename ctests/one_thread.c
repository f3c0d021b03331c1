/* A program that must stay single-threaded until it starts a thread of
   its own: it counts its threads (/proc/self/task) after its first
   allocations, unshares a user namespace (the kernel refuses that to a
   process with more than one thread: EINVAL), then starts one thread,
   which leaks 16 bytes, and counts again. A tracer that adds a thread
   before the program's second one changes the first count and the
   unshare's answer.

   one_thread   prints "threads: 1", "unshare: ok" (or the error, as
                natively), "threads: 2" natively (3 under mtrace: its
                writer came with the program's thread); 100 blocks of
                100-199 bytes stay reachable from `keep`, but the first,
                freed; the thread's 16 bytes are definitely lost */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int threads(void) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

/* Held by main until it counted the threads: the thread is alive then. */
static pthread_mutex_t counted = PTHREAD_MUTEX_INITIALIZER;

static void *run(void *arg) {
    (void)arg;
    pthread_mutex_lock(&counted);
    pthread_mutex_unlock(&counted);
    return malloc(16); /* @leak:thread */
}

void *keep[100];

int main(void) {
    for (int i = 0; i < 100; i++)
        keep[i] = malloc(100 + i); /* @leak:kept */
    printf("threads: %d\n", threads());
    int rc = unshare(CLONE_NEWUSER);
    printf("unshare: %s\n", rc == 0 ? "ok" : strerror(errno));
    pthread_t t;
    pthread_mutex_lock(&counted);
    if (pthread_create(&t, NULL, run, NULL) != 0)
        return 1;
    printf("threads: %d\n", threads());
    fflush(stdout);
    pthread_mutex_unlock(&counted);
    void *r;
    pthread_join(t, &r);
    free(keep[0]);
    return 0;
}
