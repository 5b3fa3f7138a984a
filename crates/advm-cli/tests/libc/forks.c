/* Every way a C program makes a process: fork(), vfork, posix_spawn, system(), the raw
 * clone/fork/clone3 system calls and glibc's clone() (no atfork handler runs in those),
 * each after large copies, with writes in parent and child afterwards: neither may see
 * the other's writes. */
#include "sweep.h"
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define N (2u << 20)

static char *a, *b, *c;

/* Blocks in the states the shim has: a copy's source and destination (private views
 * of the same memfd pages), and a copy whose source was freed (its last view, which the
 * shim maps shared in a single-threaded process). */
static void setup(unsigned seed) {
    a = malloc(N), b = malloc(N);
    char *t = malloc(N);
    CHECK(a && b && t);
    fill(a, N, seed);
    memcpy(b, a, N);
    fill(t, N, seed);
    c = malloc(N);
    CHECK(c);
    memcpy(c, t, N);
    free(t);
}

static void teardown(void) { free(a), free(b), free(c); }

/* The child's part: writes every page of all three, checks, exits. */
static int child_work(unsigned seed) {
    if (!holds(a, N, seed, 0) || !holds(b, N, seed, 0) || !holds(c, N, seed, 0)) return 3;
    memset(a, 'A', N);
    memset(b, 'B', N);
    memset(c, 'C', N);
    char *d = malloc(N);
    if (!d) return 4;
    memcpy(d, b, N);
    free(b);
    return d[N - 1] == 'B' ? 0 : 5;
}

/* After the child ended: the parent still sees its own bytes, and its writes stick. */
static void parent_check(const char *how, int st, unsigned seed) {
    printf("%s: child %s %d; parent sees %s\n", how, WIFEXITED(st) ? "exit" : "signal",
           WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
           holds(a, N, seed, 0) && holds(b, N, seed, 0) && holds(c, N, seed, 0) ? "its own bytes" : "CHANGED bytes");
    CHECK(holds(a, N, seed, 0) && holds(b, N, seed, 0) && holds(c, N, seed, 0));
    memset(a, 'a', N);
    CHECK(b[0] != 'a' && c[0] != 'a');
}

static int clone_child(void *go);
static unsigned clone_seed;

/* The parent writes while the child waits for it, then lets the child check (nr -1:
 * glibc's clone() function instead of a system call). */
static void raw(const char *how, long nr, unsigned seed) {
    setup(seed);
    clone_seed = seed;
    int go[2], done[2];
    CHECK(pipe(go) == 0 && pipe(done) == 0);
    fflush(stdout);
    long pid;
    if (nr == -1) { /* glibc's clone() on a stack of its own */
        static char stack[1 << 16] __attribute__((aligned(16)));
        pid = clone(clone_child, stack + sizeof stack, SIGCHLD, go);
    } else if (nr == SYS_clone3) {
        struct clone_args ca;
        memset(&ca, 0, sizeof ca);
        ca.exit_signal = SIGCHLD;
        pid = syscall(SYS_clone3, &ca, sizeof ca);
    } else if (nr == SYS_clone) {
        pid = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
    } else {
        pid = syscall(nr);
    }
    CHECK(pid >= 0);
    if (pid == 0) {
        char x;
        if (read(go[0], &x, 1) != 1) _exit(6);
        /* the parent wrote 'P' into a's first half: the child must not see it */
        int saw = a[0] == 'P' || b[0] == 'P' || c[0] == 'P';
        if (saw) fill(a, N / 2, seed), fill(c, N / 2, seed); /* so that its own writes still happen */
        int r = child_work(seed);
        _exit(saw ? 7 : r);
    }
    memset(a, 'P', N / 2);
    memset(c, 'P', N / 2);
    CHECK(write(go[1], "x", 1) == 1);
    int st;
    CHECK(waitpid((pid_t)pid, &st, 0) == pid);
    fill(a, N / 2, seed); /* back to the pattern before the checks */
    fill(c, N / 2, seed);
    parent_check(how, st, seed);
    close(go[0]), close(go[1]), close(done[0]), close(done[1]);
    teardown();
}

/* The child of glibc's clone(): what raw()'s child does after fork returned 0. */
static int clone_child(void *go) {
    char x;
    if (read(((int *)go)[0], &x, 1) != 1) return 6;
    int saw = a[0] == 'P' || b[0] == 'P' || c[0] == 'P';
    if (saw) fill(a, N / 2, clone_seed), fill(c, N / 2, clone_seed);
    int r = child_work(clone_seed);
    return saw ? 7 : r;
}

int main(int argc, char **argv) {
    if (argc > 1) { /* run by posix_spawn and system(): allocate and copy, then report */
        setup(9);
        printf("spawned: %d\n", holds(c, N, 9, 0));
        teardown();
        return 0;
    }
    setup(1);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) _exit(child_work(1));
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    parent_check("fork", st, 1);
    teardown();

    setup(2);
    fflush(stdout);
    pid = vfork();
    if (pid == 0) _exit(a[0] == b[0] ? 0 : 1); /* a vfork child may only read and exit */
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    parent_check("vfork", st, 2);
    teardown();

    setup(3);
    char *args[] = {argv[0], "spawned", NULL};
    fflush(stdout);
    CHECK(posix_spawn(&pid, argv[0], NULL, NULL, args, NULL) == 0);
    CHECK(waitpid(pid, &st, 0) == pid);
    parent_check("posix_spawn", st, 3);
    fill(a, N, 3);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' spawned", argv[0]);
    fflush(stdout);
    st = system(cmd);
    parent_check("system", st, 3);
    teardown();

    raw("raw clone", SYS_clone, 4);
    raw("raw fork", SYS_fork, 5);
    raw("raw clone3", SYS_clone3, 6);
    raw("glibc clone()", -1, 7);
    printf("done\n");
    return 0;
}
