/* Loads libdlleak.so (path in argv[1]), calls its leaking function and
   unloads it: the leak's frames must still symbolize. */
#include <dlfcn.h>
#include <stdio.h>

static void *keep;

int main(int argc, char **argv) {
    void *h = dlopen(argc > 1 ? argv[1] : "./libdlleak.so", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    void *(*f)(void) = (void *(*)(void))dlsym(h, "dl_leak");
    keep = f(); // @leak:dl_caller
    dlclose(h);
    return 0;
}
