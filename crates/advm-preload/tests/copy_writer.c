/* Writes made while the block is copied are kept (run by tests/c_programs.rs).
 * A writer thread stores random words into block X (and the same values into a shadow
 * in plain memory it never copies) while the main thread memcpy's X into block Y again
 * and again: virtual copies, each of which re-homes the pages of X written since the
 * last one (their bytes written into fresh memfd pages, which X then maps). A write
 * landing between the two used to be lost with the old page. The writer also stores
 * into Y's pages and bytes outside the copied range, which no copy may touch.
 *
 *   copy_writer MIB MS MODE [noufd]
 * MODE: src     X is a fresh malloc'd block (anonymous until its first copy);
 *       view    X is itself the destination of a virtual copy (private memfd views);
 *       dst     X is copied into Y and Y back into X in turn; the writer writes Y's
 *               margins only (X is the other copy's destination, written by it);
 *       signal  as src, but the writes are made by a SIGALRM handler (every 50 us)
 *               on the copying thread, beside an idle second thread (the copies use
 *               the fence: the handler must not wait at it for ever);
 *       signal1 as signal without the second thread.
 * noufd: a seccomp filter refuses userfaultfd (the syscall, and /dev/userfaultfd's
 * ioctl), as a container's may.
 * Prints the counts; exits 0 when no write was lost and the copies are right. */
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define PS 4096u
/* the copied range: [OFF, n - OFF) bytes, a partial first and last page around whole ones */
#define OFF (PS + 40)

static size_t n, words, margin; /* bytes, 8-byte words, words in each margin of Y */
static volatile uint64_t *x, *y;
static uint64_t *sx, *sy; /* shadows */
static atomic_int stop;
static int write_x = 1;
static unsigned long writes;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Writes value k (the k-th write) at a random word of x and now and then of y's margins. */
static void write_one(uint64_t k, uint64_t r) {
    if (write_x) {
        size_t i = (size_t)(r % words);
        x[i] = k;
        sx[i] = k;
    }
    /* one margin word of Y in 16: the margins are small */
    if ((k & 15) == 0) {
        size_t j = (size_t)((r >> 32) % (2 * margin));
        size_t i = j < margin ? j : words - 2 * margin + j;
        y[i] = k;
        sy[i] = k;
    }
}

static void *writer(void *arg) {
    (void)arg;
    uint64_t r = 0x9e3779b97f4a7c15ull, k = 0;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        write_one(++k, r);
    }
    writes = (unsigned long)k;
    return NULL;
}

static void *idle(void *arg) {
    (void)arg;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) usleep(1000);
    return NULL;
}

static volatile uint64_t sig_r = 0x9e3779b97f4a7c15ull, sig_k;
static void on_alarm(int sig) {
    (void)sig;
    for (int n = 0; n < 16; n++) {
        uint64_t r = sig_r;
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        sig_r = r;
        write_one(++sig_k, r);
    }
}

/* userfaultfd(2) and ioctl(USERFAULTFD_IOC_NEW) fail with EPERM from now on. */
static int refuse_userfaultfd(void) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_userfaultfd, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ioctl, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xAA00 /* USERFAULTFD_IOC_NEW */, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 1 /* EPERM */),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

int main(int argc, char **argv) {
    if (argc < 4 || (argc == 5 && strcmp(argv[4], "noufd")) || argc > 5) {
        fprintf(stderr, "usage: copy_writer MIB MS src|view|dst|signal|signal1 [noufd]\n");
        return 2;
    }
    if (argc == 5 && refuse_userfaultfd()) {
        perror("seccomp");
        return 2;
    }
    n = (size_t)atol(argv[1]) << 20;
    double ms = atof(argv[2]);
    const char *mode = argv[3];
    words = n / 8;
    margin = OFF / 8;
    x = malloc(n);
    y = malloc(n);
    sx = calloc(words, 8);
    sy = calloc(words, 8);
    uint64_t *z = malloc(n);
    if (!x || !y || !sx || !sy || !z) return 2;
    memset(z, 0, n);
    memset((void *)y, 0, n);
    if (!strcmp(mode, "view")) memcpy((void *)x, z, n); /* a private view of z's pages */
    else memset((void *)x, 0, n);
    int dst = !strcmp(mode, "dst"), sig = !strncmp(mode, "signal", 6), threads = strcmp(mode, "signal1") != 0;
    write_x = !dst;
    pthread_t t;
    if (threads && pthread_create(&t, NULL, sig ? idle : writer, NULL) != 0) return 2;
    if (sig) {
        struct sigaction sa = {0};
        sa.sa_handler = on_alarm;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGALRM, &sa, NULL);
        struct itimerval it = {{0, 50}, {0, 50}};
        setitimer(ITIMER_REAL, &it, NULL);
    }
    unsigned long copies = 0;
    double t0 = now();
    while (now() - t0 < ms / 1e3) {
        if (dst && copies % 2) memcpy((char *)x + OFF, (char *)y + OFF, n - 2 * OFF);
        else memcpy((char *)y + OFF, (char *)x + OFF, n - 2 * OFF);
        copies++;
    }
    if (sig) {
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, NULL);
        writes = (unsigned long)sig_k;
    }
    atomic_store(&stop, 1);
    if (threads) pthread_join(t, NULL);
    unsigned long lost_x = 0, lost_y = 0;
    for (size_t i = 0; i < words && write_x; i++) lost_x += x[i] != sx[i];
    for (size_t i = 0; i < words; i++)
        if (i < margin || i >= words - margin) lost_y += y[i] != sy[i];
    /* the copies themselves: one more, checked whole */
    memcpy((char *)y + OFF, (char *)x + OFF, n - 2 * OFF);
    unsigned long wrong = 0;
    for (size_t i = margin; i < words - margin; i++) wrong += y[i] != x[i];
    int failed = lost_x || lost_y || wrong;
    fprintf(failed ? stderr : stdout, "%s%s %zu MiB: %lu writes, %lu copies in %.0f ms: %lu words of x lost their writes, %lu of y's margins, "
           "%lu wrong in the last copy\n",
           mode, argc == 5 ? " noufd" : "", n >> 20, writes, copies, ms, lost_x, lost_y, wrong);
    if (copies < 5 || writes < 1000) {
        fprintf(stderr, "the writer and the copies did not overlap enough\n");
        return 1;
    }
    return failed;
}
