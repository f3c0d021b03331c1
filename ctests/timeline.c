/* Memory over time: 30 MiB live and touched for 100 ms, then freed. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    char *p = malloc(30 << 20);
    memset(p, 1, 30 << 20);
    usleep(100 * 1000);
    free(p);
    usleep(50 * 1000);
    return 0;
}
