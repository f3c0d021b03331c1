// Allocations and frees outside main: in a constructor, in a static
// destructor, in an atexit handler and in a thread_local destructor. All
// are traced; only the two marked blocks are never freed.
#include <cstdlib>
#include <pthread.h>

static void *keep[2];
static void *at_exit_block;

struct Holder {
    void *p;
    Holder() : p(malloc(111)) {}
    ~Holder() { free(p); }  // runs in exit(), after main
} holder;

struct PerThread {
    void *p = nullptr;
    ~PerThread() { free(p); }  // runs at thread exit
};
thread_local PerThread per_thread;

__attribute__((constructor)) static void early() {
    keep[0] = malloc(114); // @leak:constructor
}

static void at_exit_handler() {
    free(at_exit_block);
    keep[1] = malloc(113); // @leak:in_atexit
}

static void *worker(void *) {
    per_thread.p = malloc(112);
    return nullptr;
}

int main() {
    at_exit_block = malloc(115);
    atexit(at_exit_handler);
    pthread_t t;
    pthread_create(&t, nullptr, worker, nullptr);
    pthread_join(t, nullptr);
    return 0;
}
