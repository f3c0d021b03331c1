/* memcheck's leak-check heuristics, one case each, every block held only
   by an interior pointer: a copy-on-write std::string's character data
   (@leak:stdstring, pre-C++11 ABI; the string object itself is a block a
   global points to), an array of objects
   with a destructor made by new[] (@leak:newarray), a block whose first 8
   bytes hold the size of the rest (@leak:length64), and objects with two
   polymorphic bases held through the second (@leak:mi), each from a global. With every
   heuristic they are still reachable; with none, possibly lost. */
#define _GLIBCXX_USE_CXX11_ABI 0
#include <cstdlib>
#include <cstring>
#include <string>

struct Elem {
    int v = 1;
    ~Elem() { v = 0; }
};

struct A {
    long a = 1;
    virtual ~A() {}
    virtual void f() {}
};
struct B {
    long b = 2;
    virtual ~B() {}
    virtual void g() {}
};
struct C : A, B {
    long c = 3;
};

std::string *str_holder;
Elem *array;
char *length_prefixed;
B *second_base;

__attribute__((noinline)) static void make() {
    str_holder = new std::string(40, 'x'); // @leak:stdstring
    array = new Elem[5]; // @leak:newarray
    unsigned long *p = (unsigned long *)malloc(8 + 100); // @leak:length64
    p[0] = 100;
    length_prefixed = (char *)(p + 1);
    second_base = new C; // @leak:mi
}

int main() {
    make();
    return 0;
}
