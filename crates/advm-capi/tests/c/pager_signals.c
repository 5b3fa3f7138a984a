/* Signals sent to the process are handled by the program's threads, never by the
 * pager's: its handler thread blocks them. A program's SIGALRM handler that read paged
 * memory ran on the pager's thread now and then, faulted there, and waited for that
 * very thread to serve the fault: the program hung for good (within seconds at a
 * 2 ms timer). In SIGBUS mode the handler now defers sent signals until the fault is
 * served: a program's handler that ran in the middle and read paged memory faulted
 * with SIGBUS blocked, and the kernel killed the process. Checked by the thread's
 * signal mask, and by a child that reads paged memory from its handler for a while,
 * in both fault modes. */
#define _GNU_SOURCE
#include <advm.h>
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define PAGES 256

static volatile unsigned char *region;
static size_t ps;
static volatile sig_atomic_t reads;

static void on_alarm(int sig) {
    (void)sig;
    size_t i = (size_t)(reads * 37 % PAGES);
    if (region[i * ps] != (unsigned char)i) _exit(3);
    reads++;
}

static int pager_thread(const char *comm) { return strcmp(comm, "advm-pager\n") == 0; }

/* Whether every thread named advm-pager blocks SIGALRM, SIGINT, SIGTERM and SIGCHLD;
 * the number of such threads in *n. */
static int pager_threads_block(int *n) {
    const int sent[] = {SIGALRM, SIGINT, SIGTERM, SIGCHLD};
    return unblocked_in_threads(pager_thread, sent, 4, n) == 0;
}

/* In a child: reads paged memory from a SIGALRM handler every 2 ms for half a second;
 * exit status 0 when every read saw its page. */
static void reads_from_handler(int mode) {
    struct advm_pager_options o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.budget_bytes = 16 * ps;
    o.fault_mode = mode;
    advm_pager *p = advm_pager_new_with(&o);
    if (p == NULL) _exit(errno == ENOSYS ? 0 : 4);
    region = advm_pager_map(p, PAGES * ps);
    if (region == NULL) _exit(5);
    for (size_t i = 0; i < PAGES; i++) region[i * ps] = (unsigned char)i;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 2000}, {0, 2000}};
    setitimer(ITIMER_REAL, &every, NULL);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        for (size_t i = 0; i < PAGES; i++)
            if (region[i * ps] != (unsigned char)i) _exit(6);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 500000000L);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("  mode %d: %d handler reads\n", advm_pager_fault_mode(p), (int)reads);
    fflush(stdout);
    _exit(0);
}

int main(void) {
    skip_without_pager();
    ps = (size_t)sysconf(_SC_PAGESIZE);
    const int modes[] = {ADVM_PAGER_FAULTS_THREAD, ADVM_PAGER_FAULTS_SIGBUS};
    for (int k = 0; k < 2; k++) {
        struct advm_pager_options o;
        memset(&o, 0, sizeof o);
        o.size = sizeof o;
        o.budget_bytes = 16 * ps;
        o.fault_mode = modes[k];
        advm_pager *p = advm_pager_new_with(&o);
        if (p == NULL && errno == ENOSYS) continue;
        CHECK(p != NULL);
        int n, ok;
        for (int tries = 0; (ok = pager_threads_block(&n), n == 0) && tries < 100; tries++)
            usleep(10000); /* the thread names itself once it runs */
        printf("fault mode %d: %d pager thread(s), signals %s\n", k, n, ok ? "blocked" : "NOT blocked");
        CHECK(n >= 1 && ok);
        advm_pager_destroy(p);

        fflush(stdout);
        pid_t c = fork();
        CHECK(c >= 0);
        if (c == 0) reads_from_handler(modes[k]);
        int st = 0, waited = 0;
        while (waitpid(c, &st, WNOHANG) == 0) {
            if (++waited > 200) { /* 20 s: hung */
                kill(c, SIGKILL);
                waitpid(c, &st, 0);
                fprintf(stderr, "fault mode %d: a handler reading paged memory hung the program\n", k);
                exit(1);
            }
            usleep(100000);
        }
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    printf("pager_signals: ok\n");
    return 0;
}
