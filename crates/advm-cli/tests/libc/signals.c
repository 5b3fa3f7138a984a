/* Signal handlers that copy (memcpy and memmove are async-signal-safe) between large
 * blocks while the main thread allocates, copies and frees; the handler's copies and
 * the main thread's are both checked. */
#include "sweep.h"
#include <signal.h>
#include <sys/time.h>

#define N (256u << 10)

static char *src, *dst;
static volatile sig_atomic_t handled;

static void on_alarm(int sig) {
    (void)sig;
    int saved = errno;
    memcpy(dst, src, N);
    memmove(dst + 4096, dst, N - 4096);
    handled++;
    errno = saved;
}

int main(void) {
    src = malloc(N), dst = malloc(N);
    CHECK(src && dst);
    fill(src, N, 5);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    CHECK(sigaction(SIGALRM, &sa, NULL) == 0);
    struct itimerval it = {{0, 500}, {0, 500}};
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
    for (unsigned r = 0; r < 150 || handled < 20; r++) {
        char *a = malloc(N), *b = malloc(N);
        CHECK(a && b);
        fill(a, N, r);
        memcpy(b, a, N);
        a[r % N] ^= 1;
        CHECK(holds(b, N, r, 0));
        free(a), free(b);
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    CHECK(setitimer(ITIMER_REAL, &off, NULL) == 0);
    /* the last handler run left dst = src shifted by a page after its first page */
    CHECK(holds(dst, 4096, 5, 0) && holds(dst + 4096, N - 4096, 5, 0));
    printf("handler copies checked\n");
    free(src), free(dst);
    return 0;
}
