// operator new when malloc fails: the program's new-handler runs (it gives
// memory back once, then uninstalls itself) and std::bad_alloc is thrown
// through the tracer's hook; the program prints what it saw. One block
// stays allocated (@leak:kept); the failed news allocate nothing.
#include <cstdio>
#include <cstdlib>
#include <new>

static int handler_calls;
static char *reserve;

static void handler() {
    handler_calls++;
    delete[] reserve;
    reserve = nullptr;
    std::set_new_handler(nullptr);
}

static void *volatile sink;

int main() {
    reserve = new char[1000];
    sink = new char[300]; // @leak:kept
    std::set_new_handler(handler);
    int caught = 0;
    for (int i = 0; i < 2; i++) {
        try {
            sink = new char[(size_t)1 << 62];
        } catch (const std::bad_alloc &) {
            caught++;
        }
    }
    try {
        sink = ::operator new((size_t)1 << 62);
    } catch (const std::bad_alloc &) {
        caught++;
    }
    std::printf("handler %d, caught %d\n", handler_calls, caught);
    return 0;
}
