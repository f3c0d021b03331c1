/* memcheck's leak kinds, one case each: a block reached from a global
   (still reachable), one reached only through an interior pointer (possibly
   lost), one whose only pointer is stored unaligned (definitely lost), a
   lost tree (root definitely, children indirectly), a lost cycle (one block
   definitely, the other indirectly) and a block pointing to itself
   (definitely lost). */
#include <stdlib.h>
#include <string.h>

struct node {
    struct node *next, *other;
    long pad;
};

void *global_start;
void *global_interior;
char unaligned_holder[16];

__attribute__((noinline)) static void make(void) {
    global_start = malloc(111); // @leak:reachable
    global_interior = (char *)malloc(112) + 8; // @leak:possible
    void *c = malloc(113); // @leak:unaligned
    memcpy(unaligned_holder + 1, &c, sizeof c);
    struct node *root = calloc(1, sizeof *root); // @leak:tree_root
    root->next = calloc(1, sizeof *root); // @leak:tree_child
    root->other = calloc(1, sizeof *root); // @leak:tree_child2
    struct node *a = calloc(1, sizeof *a); // @leak:cycle_a
    struct node *b = calloc(1, sizeof *b); // @leak:cycle_b
    a->next = b;
    b->next = a;
    struct node *s = calloc(1, sizeof *s); // @leak:self
    s->next = s;
}

/* Overwrites the dead stack below main so no stale copy of a pointer from
   make() survives there. */
__attribute__((noinline)) static void scrub(void) {
    volatile char junk[16384];
    memset((char *)junk, 0, sizeof junk);
}

int main(void) {
    make();
    scrub();
    return 0;
}
