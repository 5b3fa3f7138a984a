/* fork is async-signal-safe: a handler that forks while the interrupted thread is inside
 * a large copy (holding the shim's lock) must not deadlock (run by tests/c_programs.rs,
 * which kills it after a timeout). A 1 ms interval timer sends SIGALRM while the main
 * thread copies and moves 1 MiB blocks in a loop (no malloc or free while the timer
 * runs: glibc's own fork may not interrupt those); the handler forks, the child checks
 * the source's bytes, copies it into static memory (a copy in the child of such a fork
 * is a plain one) and checks that too, and exits; the parent waits for it. Exits 0 when
 * every child and every copy held the right bytes. Under the shim the fork handlers
 * used to take the lock the interrupted copy held: the program hung at once. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define SZ (1u << 20)

static unsigned char *src;
static unsigned char into[SZ];
static volatile sig_atomic_t forks, bad;

static int holds(const unsigned char *p) {
    for (size_t i = 0; i < SZ; i += 509)
        if (p[i] != (unsigned char)(i * 7 + i / 4096)) return 0;
    return 1;
}

static void on_alarm(int sig) {
    (void)sig;
    int saved = errno;
    pid_t pid = fork();
    if (pid == 0) {
        int ok = holds(src);
        memcpy(into, src, SZ);
        _exit(ok && holds(into) ? 0 : 1);
    }
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) bad = 1;
    forks++;
    errno = saved;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    src = malloc(SZ);
    unsigned char *a = malloc(SZ), *b = malloc(2 * SZ);
    if (!src || !a || !b) return 2;
    for (size_t i = 0; i < SZ; i++) src[i] = (unsigned char)(i * 7 + i / 4096);
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &it, NULL);
    for (int r = 0; r < rounds; r++) {
        memcpy(a, src, SZ);
        a[(size_t)r * 4096 % SZ] ^= 1; /* the next copy has a written page to move again */
        a[(size_t)r * 4096 % SZ] ^= 1;
        memcpy(b + 4096, a, SZ);
        memmove(b, b + 4096, SZ);
        if (!holds(a) || !holds(b)) {
            fprintf(stderr, "round %d: wrong copy\n", r);
            return 1;
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    if (bad) {
        fprintf(stderr, "a child of a fork in the signal handler saw wrong bytes\n");
        return 1;
    }
    printf("signal_fork: ok, %d forks in the handler\n", (int)forks);
    return 0;
}
