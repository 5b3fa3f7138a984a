/* memcpy is async-signal-safe: a handler that copies between two large malloc'd blocks
 * while the interrupted thread is inside a large copy of its own must not deadlock (run
 * by tests/c_programs.rs, which kills it after a timeout). A 1 ms interval timer sends
 * SIGALRM while the main thread copies freshly written 1 MiB blocks in a loop. Exits 0
 * when every copy, in the handler and outside, holds the right bytes. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define SZ (1u << 20)

static unsigned char *hs, *hd;
static volatile sig_atomic_t handled, handler_bad;

static void on_alarm(int sig) {
    (void)sig;
    memcpy(hd, hs, SZ);
    for (size_t i = 0; i < SZ; i += 4096)
        if (hd[i] != (unsigned char)(i / 4096)) handler_bad = 1;
    hd[0] ^= 1; /* the next copy has a written page to move again */
    handled++;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 400;
    hs = malloc(SZ);
    hd = malloc(SZ);
    unsigned char *a = malloc(SZ), *b = malloc(SZ);
    if (!hs || !hd || !a || !b) return 2;
    for (size_t i = 0; i < SZ; i++) hs[i] = (unsigned char)(i / 4096);
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &it, NULL);
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < SZ; i += 64) a[i] = (unsigned char)(i + (size_t)r);
        memcpy(b, a, SZ);
        for (size_t i = 0; i < SZ; i += 64)
            if (b[i] != (unsigned char)(i + (size_t)r)) {
                fprintf(stderr, "round %d: wrong copy at %zu\n", r, i);
                return 1;
            }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    if (handler_bad) {
        fprintf(stderr, "a copy in the signal handler was wrong\n");
        return 1;
    }
    printf("signal_copy: ok, %d copies in the handler\n", (int)handled);
    return 0;
}
