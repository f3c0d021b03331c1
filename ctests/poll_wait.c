/* Waits in poll() with a timeout until its standard input ends, then says
   what poll returned. After a stop the kernel restarts such a poll from
   the thread's restart block: calls a tracer makes on the thread meanwhile
   must not make it fail with EINTR (tests/attach.rs). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    struct pollfd in = {.fd = 0, .events = POLLIN};
    int got = poll(&in, 1, 20000);
    if (got < 0)
        printf("poll failed: %s\n", strerror(errno));
    else
        printf("poll: %d\n", got);
    return 0;
}
