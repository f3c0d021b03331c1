/* Memory over time: 30 MiB live and touched for 100 ms, then freed.

   timeline         one thread all along: no writer thread, so RSS samples
                    come at the start, at the free (the round before it)
                    and at the end, none while it sleeps
   timeline thread  first starts and joins a thread: the writer thread then
                    samples every 10 ms, and while it sleeps too */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *nothing(void *arg) { return arg; }

int main(int argc, char **argv) {
    if (argc > 1) {
        pthread_t t;
        if (pthread_create(&t, NULL, nothing, NULL) != 0 || pthread_join(t, NULL) != 0)
            return 1;
    }
    char *p = malloc(30 << 20);
    memset(p, 1, 30 << 20);
    usleep(100 * 1000);
    free(p);
    usleep(50 * 1000);
    return 0;
}
