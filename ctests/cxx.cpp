// C++ leaks through new, new[], nothrow and aligned new, and std containers.
#include <memory>
#include <new>
#include <string>
#include <vector>

struct Node { long a, b, c; };                  // 24 bytes
struct alignas(64) Wide { char data[192]; };    // 192 bytes, 64-aligned

static void *sink[8];

__attribute__((noinline)) void leak_new() { sink[0] = new Node(); } // @leak:new
__attribute__((noinline)) void leak_new_array() { sink[1] = new int[50]; } // @leak:new_array
__attribute__((noinline)) void leak_nothrow() { sink[2] = new (std::nothrow) char[77]; } // @leak:nothrow
__attribute__((noinline)) void leak_aligned() { sink[3] = new Wide(); } // @leak:aligned
__attribute__((noinline)) void leak_vector() {
    auto *v = new std::vector<int>(); // @leak:vector_object
    v->reserve(60);                   // @leak:vector_buffer
    sink[4] = v;
}

int main() {
    leak_new();
    leak_new_array();
    leak_nothrow();
    leak_aligned();
    leak_vector();
    // Freed through every delete form: not reported.
    delete new Node();
    delete[] new int[10];
    delete new Wide();
    auto u = std::make_unique<std::string>(100, 'x');
    std::vector<std::string> strings(5, std::string(40, 'y'));
    for (auto &p : sink) p = reinterpret_cast<void *>(reinterpret_cast<unsigned long>(p) ^ 1);
    return 0;
}
