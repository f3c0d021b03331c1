/* Pointers that die with the frames that held them: every lost block here
   was last pointed to from a frame that has returned (nothing scrubs the
   dead stack below main), so only the live frames may count as roots of
   the exit scan. A block whose only pointer was a callee's local
   (@leak:callee, definitely lost), a lost ring of four nodes built by
   helper functions (@leak:ring: one definitely, three indirectly lost), a
   lost tree (@leak:tree_root definitely, @leak:tree_child indirectly), and
   a block a global holds (@leak:reachable). With the argument "exit" the
   program leaves through exit() from a nested function instead of
   returning from main. */
#include <stdlib.h>
#include <string.h>

struct node {
    struct node *next;
    long pad[3];
};

struct tree {
    struct tree *left, *right;
    long pad[6];
};

/* Every allocation escapes through here, so that no optimisation removes
   it; the slot is cleared at once, so it holds no pointer at exit. */
void *volatile sink;

static void *escape(void *p) {
    sink = p;
    sink = NULL;
    return p;
}

void *global;

__attribute__((noinline)) static void callee(void) {
    char *volatile p = escape(malloc(48)); // @leak:callee
    memset(p, 'c', 48);
}

__attribute__((noinline)) static struct node *node(void) {
    return escape(calloc(1, sizeof(struct node))); // @leak:ring
}

__attribute__((noinline)) static void make_ring(void) {
    struct node *first = node(), *n = first;
    for (int i = 0; i < 3; i++) {
        n->next = node();
        n = n->next;
    }
    n->next = first;
}

__attribute__((noinline)) static struct tree *leaf(void) {
    return escape(calloc(1, 16)); // @leak:tree_child
}

__attribute__((noinline)) static void make_tree(void) {
    struct tree *root = escape(calloc(1, sizeof *root)); // @leak:tree_root
    root->left = leaf();
    root->right = leaf();
}

__attribute__((noinline)) static void leave(int how) {
    if (how)
        exit(0);
}

int main(int argc, char **argv) {
    global = escape(malloc(24)); // @leak:reachable
    callee();
    make_ring();
    make_tree();
    leave(argc > 1 && strcmp(argv[1], "exit") == 0);
    return 0;
}
