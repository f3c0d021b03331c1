/* Where the leak scan must (and must not) find pointers, one block per
   place; mtrace's kinds must equal valgrind memcheck's. argv[1] is the
   path of libscan_lib.so (ctests/scan_lib.c). The program exits while its
   worker threads are still running, as many real programs do. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile int ready;
static volatile int never;

/* Calls make(), keeps its result only in r12, zeroes the 64 KiB of dead
   stack below and the caller-saved registers, and spins until *stop. */
void *hold_in_register(void *(*make)(void), volatile int *stop);
__asm__(".text\n"
        ".globl hold_in_register\n"
        ".type hold_in_register, @function\n"
        "hold_in_register:\n"
        "  push %r12\n"
        "  push %rbx\n"
        "  sub $8, %rsp\n"
        "  mov %rsi, %rbx\n"
        "  call *%rdi\n"
        "  mov %rax, %r12\n"
        "  lea -65536(%rsp), %rdi\n"
        "  mov $8192, %ecx\n"
        "  xor %eax, %eax\n"
        "  rep stosq\n"
        "  xor %edi, %edi\n"
        "  xor %esi, %esi\n"
        "  xor %edx, %edx\n"
        "  xor %r8d, %r8d\n"
        "  xor %r9d, %r9d\n"
        "  xor %r10d, %r10d\n"
        "  xor %r11d, %r11d\n"
        "  lock incl ready(%rip)\n"
        "1: pause\n"
        "  cmpl $0, (%rbx)\n"
        "  je 1b\n"
        "  mov %r12, %rax\n"
        "  add $8, %rsp\n"
        "  pop %rbx\n"
        "  pop %r12\n"
        "  ret\n"
        ".size hold_in_register, .-hold_in_register\n");

__attribute__((noinline)) static void *make_register_block(void) {
    return malloc(121); // @leak:in_register
}

static void *register_thread(void *arg) {
    (void)arg;
    return hold_in_register(make_register_block, &never);
}

static __thread void *tls_holder;
static pthread_key_t low_key, high_key;

/* Leaves a pointer deep in the dead stack below the caller's frame. */
__attribute__((noinline)) static void dead_frame(void) {
    volatile void *deep[1024];
    deep[8] = malloc(123); // @leak:dead_stack
    (void)deep;
}

static void *stack_thread(void *arg) {
    (void)arg;
    void *volatile on_stack = malloc(122); // @leak:other_stack
    tls_holder = malloc(124); // @leak:tls
    pthread_setspecific(low_key, malloc(125)); // @leak:setspecific
    pthread_setspecific(high_key, malloc(126)); // @leak:setspecific_high
    dead_frame();
    __atomic_add_fetch(&ready, 1, __ATOMIC_SEQ_CST);
    while (!never)
        pause();
    return on_stack;
}

int main(int argc, char **argv) {
    void *h = dlopen(argc > 1 ? argv[1] : "./libscan_lib.so", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    void (*keep)(void *) = (void (*)(void *))dlsym(h, "scan_lib_keep");
    keep(malloc(127)); // @leak:dlopen_data
    void (*keep_tls)(void *) = (void (*)(void *))dlsym(h, "scan_lib_keep_tls");
    keep_tls(malloc(131)); // @leak:dlopen_tls

    /* Keys past the first 32 keep their values in a block glibc allocates. */
    pthread_key_create(&low_key, NULL);
    for (int i = 0; i < 40; i++)
        pthread_key_create(&high_key, NULL);

    /* An anonymous mapping holds one pointer; another mapping holds one in
       a page made PROT_NONE (unreadable: that block is lost) and one after
       it. */
    void **anon = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    anon[0] = malloc(128); // @leak:anon_mmap
    char *guarded = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    *(void **)(guarded + 4096) = malloc(129); // @leak:behind_guard
    *(void **)(guarded + 2 * 4096) = malloc(130); // @leak:after_guard
    mprotect(guarded + 4096, 4096, PROT_NONE);
    anon = NULL;
    guarded = NULL;

    pthread_t a, b;
    pthread_create(&a, NULL, register_thread, NULL);
    pthread_create(&b, NULL, stack_thread, NULL);
    while (__atomic_load_n(&ready, __ATOMIC_SEQ_CST) < 2)
        usleep(1000);
    usleep(20000);
    return 0;
}
