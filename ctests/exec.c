/* exec replaces the image: the old image's trace ends with "exec", the new
   image is traced into a file of its own. Uses execl, the variadic form. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *keep;

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "second") == 0) {
        keep = malloc(502); // @leak:after_exec
        return 7;
    }
    keep = malloc(501); // @leak:before_exec
    execl("/proc/self/exe", argv[0], "second", (char *)NULL);
    return 1;
}
