/* Ends in the way argv[1] names, right after a leak; the trace must be
   complete in each case and the exit status unchanged. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *keep;
static volatile int *null_ptr;

static void *exit_from_thread(void *arg) {
    (void)arg;
    exit(5);
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "return";
    /* Many small events so that buffers hold unwritten records at the end. */
    for (int i = 0; i < 10000; i++) free(malloc(32));
    keep = malloc(701); // @leak:before_end
    if (!strcmp(how, "_exit")) _exit(3);
    if (!strcmp(how, "abort")) abort();
    if (!strcmp(how, "segv")) return *null_ptr;
    if (!strcmp(how, "thread")) {
        pthread_t t;
        pthread_create(&t, NULL, exit_from_thread, NULL);
        pause();
    }
    if (!strcmp(how, "kill")) raise(SIGKILL);
    return 0;
}
