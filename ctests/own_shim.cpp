// An allocator in the executable with paths of its own, as Chromium's
// PartitionAlloc shim: it defines malloc, free and the C++ operators (the
// preload hooks them by patching), and also hands blocks out and takes
// them back through functions of its own (shim_unchecked_malloc and
// shim_unchecked_free, as Chromium's base::UncheckedMalloc), which no hook
// sees. A freed block goes on a list per size and is the first handed out
// again (last in, first out), so an address freed unseen comes back.
//
// main: a new'd block freed unseen, its address handed out unseen and
// freed with free() (the line marked mixed), then handed out unseen again
// and freed with free() a second time (the line marked again); prints
// "own_shim: done" and exits 0 (1 if an address did not come back).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <pthread.h>
#include <sys/mman.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char *cur, *end;
// Freed blocks of up to 4,096 bytes, by size / 16.
static void *freed[257];

static size_t &size_of(void *p) { return ((size_t *)p)[-2]; }

extern "C" void *shim_unchecked_malloc(size_t n) {
    n = (n + 15) & ~(size_t)15;
    pthread_mutex_lock(&lock);
    void *p = n / 16 < 257 ? freed[n / 16] : nullptr;
    if (p) {
        freed[n / 16] = *(void **)p;
    } else {
        if (!cur || (size_t)(end - cur) < n + 16) {
            size_t len = n + 16 > (1 << 20) ? n + 16 : (1 << 20);
            char *m = (char *)mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED) {
                pthread_mutex_unlock(&lock);
                return nullptr;
            }
            cur = m;
            end = m + len;
        }
        p = cur + 16;
        cur += n + 16;
        size_of(p) = n;
    }
    pthread_mutex_unlock(&lock);
    return p;
}

extern "C" void shim_unchecked_free(void *p) {
    if (!p || size_of(p) / 16 >= 257)
        return;
    pthread_mutex_lock(&lock);
    *(void **)p = freed[size_of(p) / 16];
    freed[size_of(p) / 16] = p;
    pthread_mutex_unlock(&lock);
}

extern "C" {
void *malloc(size_t n) { return shim_unchecked_malloc(n); }
void free(void *p) { shim_unchecked_free(p); }
void *calloc(size_t a, size_t b) {
    void *p = malloc(a * b);
    if (p)
        memset(p, 0, a * b);
    return p;
}
void *realloc(void *p, size_t n) {
    void *q = malloc(n);
    if (p && q) {
        memcpy(q, p, size_of(p) < n ? size_of(p) : n);
        free(p);
    }
    return q;
}
int posix_memalign(void **out, size_t al, size_t n) {
    // Its size slot says "not one of the lists'": free() leaves it.
    char *p = (char *)shim_unchecked_malloc(n + al + 16);
    if (!p)
        return ENOMEM;
    *out = (void *)(((size_t)p + 16 + al - 1) & ~(al - 1));
    size_of(*out) = (size_t)-1;
    return 0;
}
void *aligned_alloc(size_t al, size_t n) {
    void *p;
    return posix_memalign(&p, al, n) == 0 ? p : nullptr;
}
void *memalign(size_t al, size_t n) { return aligned_alloc(al, n); }
size_t malloc_usable_size(void *p) { return p ? size_of(p) : 0; }
}

void *operator new(size_t n) { return malloc(n ? n : 1); }
void operator delete(void *p) noexcept { free(p); }
void operator delete(void *p, size_t) noexcept { free(p); }

struct Obj {
    char bytes[4000];
};

int main() {
    Obj *o = new Obj;
    shim_unchecked_free(o);
    void *q = shim_unchecked_malloc(sizeof(Obj));
    if (q != (void *)o)
        return 1;
    free(q); // the line marked mixed
    void *r = shim_unchecked_malloc(sizeof(Obj));
    if (r != q)
        return 1;
    free(r); // the line marked again
    std::puts("own_shim: done");
    return 0;
}
