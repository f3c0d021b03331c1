/* The variadic exec functions, which stable Rust cannot define. Each builds
   an argv array and calls the traced execv/execvp/execve of libmtrace.so, so
   that the trace is flushed before the image is replaced. A cdylib exports
   only Rust items, so hooks/process.rs exports execl, execlp and execle as
   naked jumps to these, which leaves the variadic arguments untouched. */
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

#define COLLECT(first, ap, argv)                                   \
    size_t n = 1;                                                  \
    va_list count;                                                 \
    va_copy(count, ap);                                            \
    while (va_arg(count, const char *) != NULL) n++;               \
    va_end(count);                                                 \
    const char *argv[n + 1];                                       \
    argv[0] = first;                                               \
    for (size_t i = 1; i <= n; i++) argv[i] = va_arg(ap, const char *);

int mtrace_execl(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    COLLECT(arg, ap, argv);
    va_end(ap);
    return execv(path, (char *const *)argv);
}

int mtrace_execlp(const char *file, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    COLLECT(arg, ap, argv);
    va_end(ap);
    return execvp(file, (char *const *)argv);
}

int mtrace_execle(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    COLLECT(arg, ap, argv);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, (char *const *)argv, envp);
}
