/* Waits in poll() (or, with the argument "epoll", epoll_wait()) with a
   20 s timeout until its standard input ends, then says what the call
   returned. After a stop the kernel restarts such a poll from the
   thread's restart block: calls a tracer makes on the thread meanwhile
   must not make it fail with EINTR; an epoll_wait a stop interrupts fails
   with EINTR unless the tracer sets it to be made again
   (tests/attach.rs). */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>

static void on_usr1(int sig) { (void)sig; }

int main(int argc, char **argv) {
    /* A handler (with SA_RESTART, which neither call honours): SIGUSR1
       makes the wait fail with EINTR, also when it comes while a tracer
       holds the thread. */
    struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = SA_RESTART};
    sigaction(SIGUSR1, &sa, NULL);
    const char *call = argc > 1 && !strcmp(argv[1], "epoll") ? "epoll_wait" : "poll";
    int got;
    if (call[0] == 'e') {
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN};
        epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev);
        got = epoll_wait(ep, &ev, 1, 20000);
    } else {
        struct pollfd in = {.fd = 0, .events = POLLIN};
        got = poll(&in, 1, 20000);
    }
    if (got < 0)
        printf("%s failed: %s\n", call, strerror(errno));
    else
        printf("%s: %d\n", call, got);
    return 0;
}
