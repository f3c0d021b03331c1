// A program with its own operator new and delete (plain and sized), which
// count their calls and print the count: the preload must leave them the
// program's (its new[] and delete[], libstdc++'s, call them). One block
// stays allocated (@leak:kept).
#include <cstdio>
#include <cstdlib>
#include <new>

static int calls;
void *operator new(size_t n) {
    calls++;
    return std::malloc(n ? n : 1); // @leak:kept
}
void operator delete(void *p) noexcept {
    calls += 100;
    std::free(p);
}
void operator delete(void *p, size_t) noexcept {
    calls += 100;
    std::free(p);
}

static int *volatile sink;

int main() {
    int *a = new int[10];
    delete[] a;
    int *b = new int;
    delete b;
    sink = new int;
    std::printf("%d\n", calls);
    return 0;
}
