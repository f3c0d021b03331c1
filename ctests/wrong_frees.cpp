/* Wrong frees, one case per run: `wrong_frees CASE`. Each allocation and
   each free is on a line of its own, marked "@leak:NAME" (the tests read
   the line numbers from here). Built at -O0: the compiler must neither
   drop nor merge the calls. Nothing is allocated after the wrong free, so
   that glibc's heap, damaged or not, is not used again.

   mismatched          the eight mismatched pairs of memcheck's kinds; exit 0
   double              a small block freed twice: glibc aborts (tcache)
   double-undetected   a double free glibc's fast bins miss; exit 0
   interior            free of a pointer 16 bytes into a block: glibc aborts
   stack               free of a stack address: glibc aborts
   realloc-freed       realloc of a freed block (glibc returns it); exit 0
   realloc-stack       realloc of a stack address: glibc aborts
   mixed               new_free twice, then double-undetected; exit 0
   stopped             with MTRACE_START=off: frees whose allocations were
                       not recorded (not wrong), then a double free glibc
                       aborts on */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../include/mtrace.h"

/* The wrong frees are on purpose (the first line: a compiler that does
   not know one of the others says nothing). */
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wfree-nonheap-object"
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#pragma GCC diagnostic ignored "-Wuse-after-free"

/* Keeps a pointer from being optimised away or warned about. */
static void *volatile sink;

__attribute__((noinline)) static void malloc_delete() {
    char *p = (char *)malloc(11); // @leak:a_malloc_delete
    delete p; // @leak:f_malloc_delete
}
__attribute__((noinline)) static void malloc_delete_array() {
    char *p = (char *)malloc(12); // @leak:a_malloc_delete_array
    delete[] p; // @leak:f_malloc_delete_array
}
__attribute__((noinline)) static void aligned_delete() {
    void *p;
    if (posix_memalign(&p, 64, 13)) return; // @leak:a_aligned_delete
    delete (char *)p; // @leak:f_aligned_delete
}
__attribute__((noinline)) static void aligned_delete_array() {
    char *p = (char *)aligned_alloc(32, 14); // @leak:a_aligned_delete_array
    delete[] p; // @leak:f_aligned_delete_array
}
__attribute__((noinline)) static void new_free() {
    char *p = new char; // @leak:a_new_free
    sink = p;
    free(p); // @leak:f_new_free
}
__attribute__((noinline)) static void new_delete_array() {
    int *p = new int; // @leak:a_new_delete_array
    sink = p;
    delete[] p; // @leak:f_new_delete_array
}
__attribute__((noinline)) static void new_array_free() {
    char *p = new char[17]; // @leak:a_new_array_free
    sink = p;
    free(p); // @leak:f_new_array_free
}
__attribute__((noinline)) static void new_array_delete() {
    char *p = new char[18]; // @leak:a_new_array_delete
    sink = p;
    delete p; // @leak:f_new_array_delete
}

__attribute__((noinline)) static void double_free() {
    char *p = (char *)malloc(24); // @leak:a_double
    sink = p;
    free(p); // @leak:f1_double
    free(p); // @leak:f2_double
}

/* glibc checks a fast bin's top chunk only: with the tcache bin full, a
   freed again while b is on top goes unnoticed. */
__attribute__((noinline)) static void double_undetected() {
    void *fill[7];
    for (int i = 0; i < 7; i++) fill[i] = malloc(40);
    char *a = (char *)malloc(40); // @leak:a_undetected
    char *b = (char *)malloc(40);
    for (int i = 0; i < 7; i++) free(fill[i]);
    free(a); // @leak:f1_undetected
    free(b);
    free(a); // @leak:f2_undetected
}

__attribute__((noinline)) static void interior() {
    char *p = (char *)calloc(1, 32); // @leak:a_interior
    sink = p;
    free(p + 16); // @leak:f_interior
}

__attribute__((noinline)) static void stack() {
    char buf[64];
    memset(buf, 0, sizeof buf);
    sink = buf;
    free(buf + 16); // @leak:f_stack
}

__attribute__((noinline)) static void realloc_freed() {
    char *p = (char *)malloc(24); // @leak:a_realloc_freed
    sink = p;
    free(p); // @leak:f1_realloc_freed
    sink = realloc(p, 16); // @leak:f2_realloc_freed
}

__attribute__((noinline)) static void realloc_stack() {
    char buf[64];
    memset(buf, 0, sizeof buf);
    sink = buf;
    sink = realloc(buf + 16, 100); // @leak:f_realloc_stack
}

/* Run with MTRACE_START=off. */
__attribute__((noinline)) static void stopped() {
    char *p = (char *)malloc(24);
    sink = p;
    free(p);
    char *q = (char *)malloc(24); /* the same address, allocated unrecorded */
    sink = q;
    free(q); /* not a double free */
    char *r = (char *)malloc(48);
    MTRACE(mtrace_start);
    free(r); /* allocated before collection started */
    MTRACE(mtrace_stop);
    char *t = (char *)malloc(48); /* r's address again, unrecorded */
    sink = t;
    free(t); /* not a double free */
    MTRACE(mtrace_start);
    char *u = (char *)malloc(64); // @leak:a_stopped
    sink = u;
    free(u); // @leak:f1_stopped
    free(u); // @leak:f2_stopped
}

int main(int argc, char **argv) {
    const char *c = argc > 1 ? argv[1] : "";
    if (!strcmp(c, "mismatched")) {
        malloc_delete();
        malloc_delete_array();
        aligned_delete();
        aligned_delete_array();
        new_free();
        new_delete_array();
        new_array_free();
        new_array_delete();
    } else if (!strcmp(c, "double")) {
        double_free();
    } else if (!strcmp(c, "double-undetected")) {
        double_undetected();
    } else if (!strcmp(c, "interior")) {
        interior();
    } else if (!strcmp(c, "stack")) {
        stack();
    } else if (!strcmp(c, "realloc-freed")) {
        realloc_freed();
    } else if (!strcmp(c, "realloc-stack")) {
        realloc_stack();
    } else if (!strcmp(c, "stopped")) {
        stopped();
    } else if (!strcmp(c, "mixed")) {
        for (int i = 0; i < 2; i++) new_free();
        double_undetected();
    } else {
        static const char usage[] = "usage: wrong_frees CASE\n";
        (void)!write(2, usage, sizeof usage - 1);
        return 2;
    }
    static const char done[] = "done\n";
    (void)!write(1, done, sizeof done - 1);
    return 0;
}
