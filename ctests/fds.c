/* Programs that close or replace descriptors they did not open: the trace
   must move out of their way and never write into their files.
     fds daemon DIR  close every descriptor above 2 one by one (as daemons
                     do), then open FILES files in DIR and write each its
                     own line, allocating meanwhile
     fds range DIR   the same after close_range(3, ~0U, 0)
     fds raw DIR     find the trace's descriptor in /proc/self/fd and put a
                     file of its own there with a raw dup2 system call
   Each run leaks one block (@leak:fds, @leak:raw) and frees the rest. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FILES 1000

static void churn(int n) {
    for (int i = 0; i < n; i++) {
        void *volatile p = malloc(32 + i % 200);
        free(p);
    }
}

static int open_file(const char *dir, int i) {
    char path[4096];
    snprintf(path, sizeof path, "%s/f%04d", dir, i);
    return open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
}

static void write_line(int fd, int i) {
    char line[64];
    int n = snprintf(line, sizeof line, "file %d\n", i);
    if (write(fd, line, n) != n) exit(3);
}

/* The number of the descriptor whose link names a .mtrace file, or -1. */
static int trace_fd(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    struct dirent *e;
    int found = -1;
    while ((e = readdir(d))) {
        char link[64], target[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n > 0) {
            target[n] = 0;
            if (strstr(target, ".mtrace")) found = atoi(e->d_name);
        }
    }
    closedir(d);
    return found;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const char *mode = argv[1], *dir = argv[2];
    struct rlimit rl = {FILES + 64, FILES + 64};
    setrlimit(RLIMIT_NOFILE, &rl);
    if (strcmp(mode, "daemon") == 0) {
        for (int fd = 3; fd < (int)rl.rlim_cur; fd++) close(fd);
    } else if (strcmp(mode, "range") == 0) {
        if (close_range(3, ~0U, 0) != 0) return 4;
    } else if (strcmp(mode, "raw") == 0) {
        int t = trace_fd();
        if (t < 0) return 5;
        int fd = open_file(dir, 0);
        if (syscall(SYS_dup2, fd, t) != t) return 6;
        syscall(SYS_close, fd);
        churn(100000);
        usleep(20000); /* the writer's rounds meet the replaced descriptor */
        write_line(t, 0);
        close(t);
        for (int i = 1; i < FILES; i++) {
            int f = open_file(dir, i);
            write_line(f, i);
            close(f);
        }
        char *volatile kept = malloc(4242); // @leak:raw
        (void)kept;
        return 0;
    } else {
        return 2;
    }
    int fds[FILES];
    for (int i = 0; i < FILES; i++) {
        fds[i] = open_file(dir, i);
        if (fds[i] < 0) return 7;
        churn(100);
        if (i % 100 == 0) usleep(6000); /* let the writer write meanwhile */
    }
    for (int i = 0; i < FILES; i++) {
        write_line(fds[i], i);
        close(fds[i]);
    }
    char *volatile kept = malloc(4242); // @leak:fds
    (void)kept;
    return 0;
}
