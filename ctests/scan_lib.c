/* Loaded with dlopen by scan_roots.c: its .bss and its dynamic TLS each
   hold a pointer the leak scan must find. */
void *scan_lib_holder;
static __thread void *scan_lib_tls;

void scan_lib_keep(void *p) {
    scan_lib_holder = p;
}

void scan_lib_keep_tls(void *p) {
    scan_lib_tls = p;
}
