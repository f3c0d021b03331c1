/* One thread-local with the initial-exec TLS model. Its access makes the
   linker mark libmtrace.so DF_STATIC_TLS: glibc's dlopen (`mtrace attach`)
   then places the library's whole TLS block in the static TLS area, at one
   offset from the thread pointer in every thread, and fills it in the
   threads that already run. Without it the block is dynamic: a thread's
   first access goes through __tls_get_addr, which calls malloc, and a hook
   entered from inside the program's allocator (its mmap) would wait for
   the allocator's own lock. When the area has no room left, dlopen fails
   ("cannot allocate memory in static TLS block") and the attach says so. */
__attribute__((tls_model("initial-exec"))) __thread unsigned char mtrace_static_tls_anchor;

unsigned char *mtrace_static_tls_anchor_address(void) { return &mtrace_static_tls_anchor; }
