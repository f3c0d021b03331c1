/* mtrace's run-time API. Every function is declared weak: in a program run
 * without libmtrace.so its address is NULL, so call it through MTRACE(),
 * which does nothing then:
 *
 *     #include <mtrace.h>
 *     MTRACE(mtrace_marker, "after warm-up");
 *     MTRACE(mtrace_report, NULL);
 *
 * No library to link: the definitions come from the preloaded libmtrace.so.
 */
#ifndef MTRACE_H
#define MTRACE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Starts / stops recording allocations (frees are always recorded). With
   MTRACE_START=off in the environment, nothing is recorded until
   mtrace_start() or glibc's mtrace(). */
void mtrace_start(void) __attribute__((weak));
void mtrace_stop(void) __attribute__((weak));

/* Marks this moment in the trace as NAME (for `mtrace report
   --since-marker NAME --until-marker NAME2`). */
void mtrace_marker(const char *name) __attribute__((weak));

/* Writes an incremental report now, to PATH or, when PATH is NULL, to
   <program>-<pid>-<n>.memlog; the first lists everything live, each later one
   the change since the one before. Returns 0 when the report was written.
   When the trace goes to a socket, the reader makes the report: mtrace run
   --max-trace-size and mtrace keep write it (to PATH, relative to the
   working directory at the call) and this returns 0 once they have; a
   reader that makes none (mtrace server's client) leaves only a marker in
   the stream, and this returns -1 (the first time after up to a second,
   waiting for the reader to say whether it makes reports). */
int mtrace_report(const char *path) __attribute__((weak));

/* Scans memory for leaks now (the other threads are stopped meanwhile) and
   writes a report of everything live, classified as definitely, indirectly
   or possibly lost or still reachable, to PATH or, when PATH is NULL, to
   <program>-<pid>-<n>.memlog. Returns 0 when the report was written (on a
   socket, as mtrace_report). */
int mtrace_scan(const char *path) __attribute__((weak));

/* Records a block of a pool the program manages itself (an arena, a
   cache, a free list, or a non-memory resource such as a connection): it is
   reported under POOL's name like an allocation, with the caller's
   backtrace. PTR only identifies the block within POOL. */
void mtrace_alloc(const char *pool, const void *ptr, size_t size) __attribute__((weak));
void mtrace_free(const char *pool, const void *ptr) __attribute__((weak));

#ifdef __cplusplus
}
#endif

/* Calls FN(...) when the program runs under mtrace; nothing otherwise. */
#define MTRACE(fn, ...) ((fn) ? (void)(fn)(__VA_ARGS__) : (void)0)

#endif
