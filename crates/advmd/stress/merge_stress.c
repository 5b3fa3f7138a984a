/* advmd under many concurrent merging processes: not part of `make test` (it takes
 * 5-30 s and GiBs); run by hand against a daemon of your own:
 *
 *   cargo build -p advm-capi -p advm-cli
 *   target/debug/advm daemon --socket /tmp/X/s.sock &   # DPID=$!
 *   cc -O1 -Iinclude crates/advmd/stress/merge_stress.c -Ltarget/debug \
 *      -Wl,-rpath,$PWD/target/debug -ladvm -o /tmp/X/stress
 *   ADVM_SOCKET=/tmp/X/s.sock /tmp/X/stress CLIENTS DPID LARGE_MIB
 *
 * Each of CLIENTS processes fills six buffers (256 KiB to 2*LARGE_MIB MiB; four with
 * content every process shares, two with its own), merges them, checks its bytes,
 * writes a mark of its own into every 16th page (copy-on-write: it must see its own
 * writes only), merges again, checks later, then by its index mod 5: exits; is
 * SIGKILLed by the driver mid-run; closes every fd above 2 (close_range), checks,
 * writes, merges again and checks; forks a child that checks, writes and merges, and
 * checks its own bytes after; exits. The driver samples the daemon's peak threads,
 * fds and RSS. With STRESS_GO=PATH set, every process instead holds its merged pages
 * until PATH exists (stop or restart the daemon meanwhile), then checks them, tries a
 * merge (printing its result) and writes. Exits 1 when any process saw wrong bytes or
 * failed. Figures: docs/deploy.md, "Many clients". */
#define _GNU_SOURCE
#include <advm.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PG 4096
static uint64_t rng(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }
static void fill(unsigned char *b, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i += 8) { uint64_t v = rng(&s); memcpy(b + i, &v, 8); }
}
static int check(const unsigned char *b, size_t n, uint64_t seed, unsigned char mark, const char *what) {
    /* expected: fill(seed), with byte 17 of every 16th page set to mark when mark != 0 */
    unsigned char *e = malloc(n);
    fill(e, n, seed);
    if (mark) for (size_t p = 0; p < n; p += 16 * PG) e[p + 17] = mark;
    int bad = memcmp(e, b, n) != 0;
    if (bad) {
        size_t i = 0; while (i < n && e[i] == b[i]) i++;
        fprintf(stderr, "pid %d: %s: CORRUPT at %zu (want %u got %u)\n", getpid(), what, i, e[i], b[i]);
    }
    free(e);
    return bad;
}
static void mark(unsigned char *b, size_t n, unsigned char m) { for (size_t p = 0; p < n; p += 16 * PG) b[p + 17] = m; }

struct buf { size_t len; uint64_t seed; int shared; unsigned char *p; unsigned char m; };

static int merge_all(struct buf *bs, int nb, const char *when) {
    for (int i = 0; i < nb; i++) {
        struct advm_merge_stats st;
        int r = advm_merge(bs[i].p, bs[i].len, &st);
        if (r) { fprintf(stderr, "pid %d: %s merge %d: %s (%s)\n", getpid(), when, i, strerror(-r), advm_merge_via()); return 2; }
        if (!st.via_daemon) { fprintf(stderr, "pid %d: not via daemon: %s\n", getpid(), advm_merge_via()); return 3; }
    }
    return 0;
}
static int verify_all(struct buf *bs, int nb, const char *what) {
    int bad = 0;
    for (int i = 0; i < nb; i++) bad |= check(bs[i].p, bs[i].len, bs[i].seed, bs[i].m, what);
    return bad;
}

static int child(int idx, int role, size_t large) {
    uint64_t priv = 1000 + (uint64_t)getpid();
    struct buf bs[] = {
        {256 << 10, 1, 1}, {large, 2, 1}, {700 << 10, 3, 1}, {128 << 10, priv, 0}, {large / 4, priv + 1, 0}, {large * 2, 4, 1},
    };
    int nb = sizeof bs / sizeof bs[0];
    for (int i = 0; i < nb; i++) {
        bs[i].p = aligned_alloc(PG, bs[i].len);
        fill(bs[i].p, bs[i].len, bs[i].seed);
    }
    int r = merge_all(bs, nb, "first");
    if (r) return r;
    if (verify_all(bs, nb, "after merge")) return 10;
    /* copy-on-write writes: own mark in shared and private buffers */
    unsigned char m = (unsigned char)(1 + idx % 250);
    for (int i = 0; i < nb; i++) { bs[i].m = m; mark(bs[i].p, bs[i].len, m); }
    if (verify_all(bs, nb, "after write")) return 11;
    /* merge again (written pages are new content now) */
    if ((r = merge_all(bs, nb, "second"))) return r;
    usleep(100000 + (idx * 7919) % 300000);
    if (verify_all(bs, nb, "later")) return 12;
    if (role == 9) { /* hold merged pages until the go file exists (daemon stopped meanwhile) */
        while (access(getenv("STRESS_GO"), F_OK)) usleep(50000);
        if (verify_all(bs, nb, "after daemon gone")) return 30;
        struct advm_merge_stats st;
        int rr = advm_merge(bs[1].p, bs[1].len, &st);
        fprintf(stderr, "pid %d: merge after daemon gone: %d %s via_daemon=%u (%s)\n", getpid(), rr, rr ? strerror(-rr) : "ok", st.via_daemon, advm_merge_via());
        for (int i = 0; i < nb; i++) { bs[i].m = 99; mark(bs[i].p, bs[i].len, 99); }
        if (verify_all(bs, nb, "write after daemon gone")) return 31;
        return 0;
    }
    if (role == 2) {
        syscall(SYS_close_range, 3, ~0u, 0);
        usleep(300000);
        if (verify_all(bs, nb, "after closerange")) return 13;
        m = (unsigned char)(m + 1);
        for (int i = 0; i < nb; i++) { bs[i].m = m; mark(bs[i].p, bs[i].len, m); }
        usleep(500000);
        if (verify_all(bs, nb, "after closerange+write")) return 14;
        /* a new merge after closing: must work (new connection) or fail clearly */
        struct advm_merge_stats st;
        int rr = advm_merge(bs[1].p, bs[1].len, &st);
        if (rr) fprintf(stderr, "pid %d: merge after closerange: %s (%s)\n", getpid(), strerror(-rr), advm_merge_via());
        if (verify_all(bs, nb, "after closerange+merge")) return 15;
    }
    if (role == 3) {
        pid_t c = fork();
        if (c == 0) {
            if (verify_all(bs, nb, "forked child")) _exit(16);
            for (int i = 0; i < nb; i++) { bs[i].m = 251; mark(bs[i].p, bs[i].len, 251); }
            if (verify_all(bs, nb, "forked child write")) _exit(17);
            if (merge_all(bs, nb, "forked child merge")) _exit(18);
            if (verify_all(bs, nb, "forked child merged")) _exit(19);
            _exit(0);
        }
        int st; waitpid(c, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) { fprintf(stderr, "pid %d: forked child status %x\n", getpid(), st); return 20; }
        if (verify_all(bs, nb, "parent after child")) return 21;
    }
    return 0;
}

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void sample(int dpid, long *thr, long *fds, long *rss) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", dpid);
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        long v;
        if (sscanf(line, "Threads: %ld", &v) == 1 && v > *thr) *thr = v;
        if (sscanf(line, "VmRSS: %ld", &v) == 1 && v > *rss) *rss = v;
    }
    fclose(f);
    snprintf(path, sizeof path, "/proc/%d/fd", dpid);
    char cmd[128]; snprintf(cmd, sizeof cmd, "ls %s | wc -l", path);
    FILE *p = popen(cmd, "r"); long n = 0;
    if (p) { if (fscanf(p, "%ld", &n) != 1) n = 0; pclose(p); }
    if (n > *fds) *fds = n;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 50;
    int dpid = argc > 2 ? atoi(argv[2]) : 0;
    size_t large = (argc > 3 ? atoi(argv[3]) : 4) << 20;
    pid_t *pids = calloc(n, sizeof *pids);
    int *roles = calloc(n, sizeof *roles);
    double t0 = now();
    for (int i = 0; i < n; i++) {
        roles[i] = getenv("STRESS_GO") ? 9 : i % 5;
        pids[i] = fork();
        if (pids[i] == 0) _exit(child(i, roles[i], large));
    }
    long thr = 0, fds = 0, rss = 0;
    /* SIGKILL role-1 children at staggered times mid-run */
    int alive = n, fails = 0, killed = 0;
    double kill_at = now() + 0.2;
    while (alive) {
        if (dpid) sample(dpid, &thr, &fds, &rss);
        if (now() > kill_at) {
            for (int i = 0; i < n; i++) if (roles[i] == 1 && pids[i] > 0) { kill(pids[i], SIGKILL); roles[i] = -1; killed++; break; }
            kill_at = now() + 0.05;
        }
        int st; pid_t w;
        while ((w = waitpid(-1, &st, WNOHANG)) > 0) {
            alive--;
            int i; for (i = 0; i < n && pids[i] != w; i++);
            if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && roles[i] == -1) continue;
            if (!WIFEXITED(st) || WEXITSTATUS(st)) { fails++; fprintf(stderr, "child %d (role %d) status %x\n", i, roles[i], st); }
        }
        usleep(20000);
    }
    printf("clients %d, killed %d, failed %d, %.1f s; daemon peak threads %ld fds %ld rss %ld KiB\n", n, killed, fails, now() - t0, thr, fds, rss);
    return fails != 0;
}
