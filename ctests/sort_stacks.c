/* The backtraces of --sort stacks: one allocates 3,000 times and frees
   every block, one keeps 30 blocks in a global (still reachable), one
   loses 1 block (definitely lost). Build without optimisation: the lost
   block's pointer must be gone. */
#include <stdlib.h>

void *kept[30];

static void churn(void) {
    for (int i = 0; i < 3000; i++) {
        volatile char *p = malloc(16); // @leak:churn
        p[0] = 1;
        free((void *)p);
    }
}

static void keep(void) {
    for (int i = 0; i < 30; i++)
        kept[i] = malloc(8); // @leak:kept
}

static void lose(void) {
    char *p = malloc(100); // @leak:lost
    p[0] = 1;
    p = 0;
}

int main(void) {
    churn();
    keep();
    lose();
    return 0;
}
