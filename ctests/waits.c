/* Threads waiting in blocking calls while leak scans stop them.

   waits MODE MS KIND...

   Each KIND gets a thread that waits MS milliseconds in that call and
   prints "KIND rc=R errno=E ms=T" (T: how long the call took). A call that
   fails with EINTR also prints "EINTR KIND" to stderr; in MODE "exit" it
   then ends the process with status 3 (so that a stop the scan at exit
   made visible shows in the exit status), in MODE "wait" it only reports.

   Restartable kinds (a stop by ptrace must not interrupt them): nanosleep
   usleep clock_nanosleep poll select sem_timedwait cond_timedwait read
   futex. signal(7)'s stop list (a SIGSTOP/SIGCONT interrupts them
   natively): epoll_wait semtimedop sigtimedwait recv_timeout. And
   "holder": a thread that blocks every signal and holds a 777-byte block
   only in a register (r12, x86-64) while it sleeps, for ever.

   MODE "solo": no thread is started; main makes each KIND's wait in
   turn, in the order given (a process with one thread, idle in each
   call; "read" and "holder" are not for this mode), and returns 0.

   MODE "wait": main sleeps MS too, writes the byte the reader waits for,
   joins the waiting threads and returns 0. Only main leaves SIGUSR2
   unblocked: the scan signal's own handler runs there (where it
   interrupts nothing: main retries its sleep, and pthread_join restarts),
   never in a waiting thread. MODE
   "exit": main returns as soon as every thread waits (the scan at exit
   stops them mid-wait). "seccomp" as the first KIND installs a seccomp
   filter that allows every call first (mtrace then cannot stop threads
   with ptrace). Build without optimisation: the block must stay where the
   source puts it. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/select.h>
#include <sys/sem.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int ms;
static int exit_mode;
static int waiting;
static int pipe_fd[2];
static int epoll_pipe[2];
static int sock[2];
static int epfd;
static int semid;
static sem_t sem;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int futex_word;
void *volatile holder_block;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static struct timespec relative(void) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    return t;
}

static struct timespec absolute(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

/* One wait of KIND; its result (-1 with errno for an error). */
static int wait_in(const char *kind) {
    if (!strcmp(kind, "nanosleep")) {
        struct timespec t = relative();
        return nanosleep(&t, NULL);
    }
    if (!strcmp(kind, "usleep"))
        return usleep(ms * 1000);
    if (!strcmp(kind, "clock_nanosleep")) {
        struct timespec t = relative();
        int rc = clock_nanosleep(CLOCK_MONOTONIC, 0, &t, NULL);
        errno = rc;
        return rc ? -1 : 0;
    }
    if (!strcmp(kind, "poll"))
        return poll(NULL, 0, ms);
    if (!strcmp(kind, "select")) {
        struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
        return select(0, NULL, NULL, NULL, &tv);
    }
    if (!strcmp(kind, "sem_timedwait")) {
        struct timespec t = absolute(CLOCK_REALTIME);
        return sem_timedwait(&sem, &t);
    }
    if (!strcmp(kind, "cond_timedwait")) {
        struct timespec t = absolute(CLOCK_REALTIME);
        pthread_mutex_lock(&mu);
        int rc = pthread_cond_timedwait(&cv, &mu, &t);
        pthread_mutex_unlock(&mu);
        errno = rc;
        return rc ? -1 : 0;
    }
    if (!strcmp(kind, "read")) {
        char c;
        return (int)read(pipe_fd[0], &c, 1);
    }
    if (!strcmp(kind, "futex")) {
        struct timespec t = relative();
        return (int)syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, &t, NULL, 0);
    }
    if (!strcmp(kind, "epoll_wait")) {
        struct epoll_event ev;
        return epoll_wait(epfd, &ev, 1, ms);
    }
    if (!strcmp(kind, "semtimedop")) {
        struct sembuf op = {0, -1, 0};
        struct timespec t = relative();
        return semtimedop(semid, &op, 1, &t);
    }
    if (!strcmp(kind, "sigtimedwait")) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGUSR1);
        struct timespec t = relative();
        return sigtimedwait(&set, NULL, &t);
    }
    if (!strcmp(kind, "recv_timeout")) {
        char c;
        return (int)recv(sock[0], &c, 1, 0);
    }
    fprintf(stderr, "unknown kind %s\n", kind);
    exit(2);
}

/* Overwrites the dead stack below the caller, where malloc's frames left
   copies of the block's address. */
__attribute__((noinline)) static void scrub(void) {
    volatile char junk[16384];
    memset((char *)junk, 0, sizeof junk);
}

static void *holder(void *arg) {
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    holder_block = malloc(777); // @leak:holder
    scrub();
    __atomic_add_fetch(&waiting, 1, __ATOMIC_SEQ_CST);
#if defined(__x86_64__)
    static const struct timespec second = {1, 0};
    /* The block's only copy moves into r12 (callee-saved, kept by every
       system call), the global is cleared, and the thread sleeps for ever. */
    __asm__ volatile("mov holder_block(%%rip), %%r12\n\t"
                     "movq $0, holder_block(%%rip)\n"
                     "1:\n\t"
                     "mov %[nr], %%eax\n\t"
                     "mov %[ts], %%rdi\n\t"
                     "xor %%esi, %%esi\n\t"
                     "syscall\n\t"
                     "jmp 1b\n"
                     :
                     : [nr] "i"(SYS_nanosleep), [ts] "r"(&second)
                     : "rax", "rcx", "rdi", "rsi", "r11", "r12", "memory");
#endif
    for (;;)
        pause();
    return NULL;
}

/* Makes one wait of KIND and prints how it went. */
static void wait_and_say(const char *kind) {
    double t0 = now_ms();
    int rc = wait_in(kind);
    int e = rc == -1 ? errno : 0;
    double took = now_ms() - t0;
    if (e == EINTR) {
        fprintf(stderr, "EINTR %s\n", kind);
        if (exit_mode)
            _exit(3);
    }
    printf("%s rc=%d errno=%d ms=%.0f\n", kind, rc, e, took);
}

static void *waiter(void *arg) {
    sigset_t usr2;
    sigemptyset(&usr2);
    sigaddset(&usr2, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &usr2, NULL);
    __atomic_add_fetch(&waiting, 1, __ATOMIC_SEQ_CST);
    wait_and_say(arg);
    return NULL;
}

/* A seccomp filter that allows every call. */
static void seccomp_allow_all(void) {
    struct sock_filter allow = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog prog = {1, &allow};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("seccomp");
        exit(2);
    }
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: waits wait|exit|solo MS KIND...\n");
        return 2;
    }
    exit_mode = !strcmp(argv[1], "exit");
    ms = atoi(argv[2]);
    int first = 3;
    if (!strcmp(argv[3], "seccomp")) {
        seccomp_allow_all();
        first = 4;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGUSR2);
    sigaddset(&sigs, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    if (pipe(pipe_fd) || pipe(epoll_pipe) || socketpair(AF_UNIX, SOCK_STREAM, 0, sock))
        return 2;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    setsockopt(sock[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    epfd = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    epoll_ctl(epfd, EPOLL_CTL_ADD, epoll_pipe[0], &ev);
    semid = semget(IPC_PRIVATE, 1, 0600);
    sem_init(&sem, 0, 0);
    int n = argc - first;
    if (!strcmp(argv[1], "solo")) {
        /* The scan signal may come to main: unblocked (SIGUSR1 stays
           blocked, for sigtimedwait). */
        sigdelset(&sigs, SIGUSR1);
        pthread_sigmask(SIG_UNBLOCK, &sigs, NULL);
        printf("ready\n");
        for (int i = first; i < argc; i++)
            wait_and_say(argv[i]);
        if (semid >= 0)
            semctl(semid, 0, IPC_RMID);
        return 0;
    }
    pthread_t t[64];
    int joinable[64];
    for (int i = 0; i < n && i < 64; i++) {
        joinable[i] = strcmp(argv[first + i], "holder") != 0;
        pthread_create(&t[i], NULL, joinable[i] ? waiter : holder, argv[first + i]);
    }
    /* The threads keep the mask they started with; main takes the scan
       signal. */
    sigdelset(&sigs, SIGUSR1);
    pthread_sigmask(SIG_UNBLOCK, &sigs, NULL);
    while (__atomic_load_n(&waiting, __ATOMIC_SEQ_CST) < n)
        usleep(1000);
    if (exit_mode) {
        /* Let every thread enter its call. */
        usleep(20000);
    } else {
        /* The pipe's reader gets its byte when the others time out. */
        struct timespec until = absolute(CLOCK_MONOTONIC);
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR)
            ;
        if (write(pipe_fd[1], "x", 1) != 1)
            return 2;
        for (int i = 0; i < n && i < 64; i++)
            if (joinable[i])
                pthread_join(t[i], NULL);
    }
    if (semid >= 0)
        semctl(semid, 0, IPC_RMID);
    return 0;
}
