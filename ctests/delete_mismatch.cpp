/* Sized and aligned operator delete told something else than the block
   was allocated with (valgrind 3.22's "Mismatched new/delete size value"
   and "... alignment"; ASan's new-delete-type-mismatch). Each wrong call
   once, each right one once; the allocating lines are marked:
     size_scalar  operator delete(p, 33) of operator new(32)
     size_array   operator delete[](p, 33) of operator new[](32)
     base         delete through a Base* of a Derived (no virtual
                  destructor): the sized delete is told sizeof(Base), 4,
                  of a block of sizeof(Derived), 20
     aligned_new  plain operator delete of operator new(64, align 64)
     aligned_del  operator delete(p, align 64) of a plain operator new(32)
     other_align  operator delete(p, align 128) of operator new(64, 64)
   Built with -O0 -fsized-deallocation (C++14 and later: the default). */
#include <cstdio>
#include <new>

struct Base {
    int a;
};
struct Derived : Base {
    int b, c, d, e;
};

static void *volatile sink;

static void *keep(void *p) {
    sink = p;
    return p;
}

int main() {
    // Wrong: one each.
    ::operator delete(keep(::operator new(32)), 33); // @leak:size_scalar
    ::operator delete[](keep(::operator new[](32)), 33); // @leak:size_array
    Base *b = new Derived; // @leak:base
    keep(b);
    delete b;
    std::align_val_t a64(static_cast<std::align_val_t>(64)), a128(static_cast<std::align_val_t>(128));
    ::operator delete(keep(::operator new(64, a64))); // @leak:aligned_new
    ::operator delete(keep(::operator new(32)), a64); // @leak:aligned_del
    ::operator delete(keep(::operator new(64, a64)), a128); // @leak:other_align
    // Right: none.
    ::operator delete(keep(::operator new(32)), 32);
    ::operator delete[](keep(::operator new[](48)), 48);
    ::operator delete(keep(::operator new(64, a64)), a64);
    ::operator delete(keep(::operator new(64, a64)), 64, a64);
    Derived *d = new Derived;
    keep(d);
    delete d;
    puts("delete_mismatch: done");
    return 0;
}
