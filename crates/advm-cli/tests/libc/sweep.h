/* sweep.h: what the libc sweep's programs share (tests/run_libc.rs runs each plainly and
 * under `advm run --mode M`; stdout and exit status must be the same). Each program also
 * checks itself: a failed CHECK prints the line and exits 1, so the plain run proves the
 * check is glibc's behaviour. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(c)                                                                   \
    do {                                                                           \
        if (!(c)) {                                                                \
            printf("FAILED %s:%d: %s (errno %d)\n", __FILE__, __LINE__, #c, errno); \
            fflush(stdout);                                                        \
            _exit(1);                                                              \
        }                                                                          \
    } while (0)

/* Fills p[0, n) with bytes derived from seed and the offset. */
static inline void fill(void *p, size_t n, unsigned seed) {
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 31 + seed * 7 + (i >> 12));
}

/* Whether p[0, n) holds what fill(p - off, ..., seed) put at offset off. */
static inline int holds(const void *p, size_t n, unsigned seed, size_t off) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)((i + off) * 31 + seed * 7 + ((i + off) >> 12))) return 0;
    return 1;
}

/* FNV-1a of p[0, n): printed so that a difference shows in the output. */
static inline uint64_t sum(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Runs f in a child and prints how it ended ("what: exit N" or "what: signal N"). */
static inline void in_child(const char *what, void (*f)(void *), void *arg) {
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        f(arg);
        _exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    if (WIFSIGNALED(st)) printf("%s: signal %d\n", what, WTERMSIG(st));
    else printf("%s: exit %d\n", what, WEXITSTATUS(st));
}
