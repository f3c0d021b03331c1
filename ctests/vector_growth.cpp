/* A std::vector grown by push_back and never freed: the allocation's
   backtrace starts with libstdc++'s allocator and growth frames
   (new_allocator, allocator_traits, _Vector_base, _M_realloc_insert),
   which the text folds into one line before the program's own frames
   (issue 65, item 3). Built with -O0: every frame is a call. */
#include <cstdio>
#include <vector>

static std::vector<long> *kept;

__attribute__((noinline)) static void fill(std::vector<long> &v) {
    for (long i = 0; i < 100; i++)
        v.push_back(i); // @leak:push
}

int main() {
    kept = new std::vector<long>(); // @leak:vector
    fill(*kept);                    // @leak:fill
    std::printf("%zu\n", kept->size());
    kept = nullptr;
    return 0;
}
