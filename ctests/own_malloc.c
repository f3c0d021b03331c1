/* An allocator in the executable (as Chromium's PartitionAlloc shim, or a
   program linked statically with jemalloc): it defines malloc and friends,
   which win over any preload, and it holds its lock while it calls mmap,
   as jemalloc does while it grows an arena. A tracer that calls the
   allocator from its mmap hook (a thread-local's first touch through
   __tls_get_addr, a TLS destructor registered with
   __cxa_thread_atexit_impl, a parking mutex) re-enters it with its lock
   held: the error-checking mutex turns that deadlock into exit status 3
   and a message. Its malloc family wins over the preload's by name, so
   the preload hooks it by patching its entry points.

   own_malloc          four rounds of four threads, 64 blocks of 100,000
                       bytes each (1,024 blocks at the line marked keep, lost when each
                       thread's array of them dies with it; each 1 MiB
                       mapping holds 10), then exit 0 with "own_malloc: done"
   own_malloc SECONDS  four threads allocate and free 1 MiB blocks (each an
                       mmap) until then or until standard input ends, for
                       `mtrace attach`
   own_malloc fork     a forked child allocates 10 blocks of 1,000 bytes
                       (the line marked forked) and exits 0; then the
                       parent's output as without an argument */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_ERRORCHECK_MUTEX_INITIALIZER_NP;
static char *cur, *end;

static void take(void) {
    if (pthread_mutex_lock(&lock) == EDEADLK) {
        static const char msg[] = "own_malloc: malloc re-entered with its lock held (deadlock)\n";
        write(2, msg, sizeof msg - 1);
        _exit(3);
    }
}

/* A bump allocator: each block has its size in the 16 bytes before it;
   a block that does not fit in what is left gets a new mapping of at
   least 1 MiB, mapped with the lock held. */
void *malloc(size_t n) {
    take();
    n = (n + 15) & ~(size_t)15;
    if (!cur || (size_t)(end - cur) < n + 16) {
        size_t len = n + 16 > (1 << 20) ? n + 16 : (1 << 20);
        char *p = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            pthread_mutex_unlock(&lock);
            return 0;
        }
        cur = p;
        end = p + len;
    }
    char *p = cur + 16;
    ((size_t *)cur)[0] = n;
    cur += n + 16;
    pthread_mutex_unlock(&lock);
    return p;
}

void free(void *p) { (void)p; }

void *calloc(size_t a, size_t b) {
    void *p = malloc(a * b);
    if (p)
        memset(p, 0, a * b);
    return p;
}

void *realloc(void *p, size_t n) {
    void *q = malloc(n);
    if (p && q) {
        size_t old = ((size_t *)p)[-2];
        memcpy(q, p, old < n ? old : n);
    }
    return q;
}

int posix_memalign(void **out, size_t al, size_t n) {
    char *p = malloc(n + al);
    *out = (void *)(((size_t)p + al - 1) & ~(al - 1));
    return p ? 0 : ENOMEM;
}

void *aligned_alloc(size_t al, size_t n) {
    void *p;
    return posix_memalign(&p, al, n) == 0 ? p : 0;
}

void *memalign(size_t al, size_t n) { return aligned_alloc(al, n); }

size_t malloc_usable_size(void *p) { return p ? ((size_t *)p)[-2] : 0; }

static void *keep(void *arg) {
    (void)arg;
    void *kept[64];
    for (int i = 0; i < 64; i++)
        kept[i] = malloc(100000); // @leak:keep
    return kept[63];
}

static volatile int stop;

static void *churn(void *arg) {
    (void)arg;
    while (!stop) {
        free(malloc(1 << 20));
        usleep(100);
    }
    return 0;
}

/* In a forked child: the executable's functions are patched already,
   and the child's own stream must say so. */
static void child(void) {
    static void *volatile blocks[10];
    for (int i = 0; i < 10; i++)
        blocks[i] = malloc(1000); // @leak:forked
    exit(0);
}

int main(int argc, char **argv) {
    pthread_t t[4];
    if (argc > 1 && strcmp(argv[1], "fork") == 0) {
        pid_t pid = fork();
        if (pid == 0)
            child();
        int st;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            return 1;
    }
    if (argc > 1 && strcmp(argv[1], "fork") != 0) {
        for (int i = 0; i < 4; i++)
            pthread_create(&t[i], 0, churn, 0);
        /* Until the time is up or standard input ends (a test's pipe). */
        struct pollfd in = {.fd = 0, .events = POLLIN};
        int got = poll(&in, 1, atoi(argv[1]) * 1000);
        if (got > 0) {
            char c;
            while (read(0, &c, 1) > 0) {
            }
        } else if (got < 0) {
            /* A tracer must never make it fail (EINTR): said, for the test. */
            fprintf(stderr, "own_malloc: poll failed: %s\n", strerror(errno));
        }
        stop = 1;
        for (int i = 0; i < 4; i++)
            pthread_join(t[i], 0);
    } else {
        for (int round = 0; round < 4; round++) {
            for (int i = 0; i < 4; i++)
                pthread_create(&t[i], 0, keep, 0);
            for (int i = 0; i < 4; i++)
                pthread_join(t[i], 0);
        }
    }
    puts("own_malloc: done");
    return 0;
}
