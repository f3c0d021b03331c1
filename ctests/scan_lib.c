/* Loaded with dlopen by scan_roots.c: its .bss holds a pointer the leak
   scan must find. */
void *scan_lib_holder;

void scan_lib_keep(void *p) {
    scan_lib_holder = p;
}
