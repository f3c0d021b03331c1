/* Memory taken past any library: 20 mappings of 10 MiB, made with the mmap
   system call itself (as Go's runtime and some JITs do) and touched, 20 ms
   apart so that the tracer's RSS samples see the growth. No allocation
   call reaches a tracer; the report must say that it saw the RSS grow by
   some 200 MiB that it cannot account for. */
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
    for (int i = 0; i < 20; i++) {
        char *p = (char *)syscall(SYS_mmap, 0, 10 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return 1;
        memset(p, 1, 10 << 20);
        usleep(20000);
    }
    return 0;
}
