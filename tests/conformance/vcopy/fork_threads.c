/* fork while other threads copy: two workers allocate, copy, dup, write and free
 * without pause while the main thread forks 20 times. Each child (single-threaded
 * now) must be able to use virtual copy at once: it dups and copies a block the main
 * thread made before forking and checks it. A child that has not finished after 5 s is
 * stuck (e.g. on a lock a worker held at the fork) and dies of SIGALRM. */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include "vc.h"

#define FORKS 20
static int done;
static unsigned long worker_rounds;

static void *worker(void *arg) {
    uint64_t rs = 99 + (uint64_t)(uintptr_t)arg;
    while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
        /* every third block is large (2 MiB and more: copies of those defer work) */
        size_t pages = vc_rand(&rs) % 3 ? 2 + vc_rand(&rs) % 64 : 512 + vc_rand(&rs) % 256;
        size_t len = pages * VC_PS + vc_rand(&rs) % VC_PS;
        unsigned char *a = vc_alloc(len), *sh = vc_shadow(len);
        VC_CHECK(a != NULL);
        vc_write(a, sh, len, vc_rand(&rs));
        unsigned char *c = vc_dup(a, len);
        VC_CHECK(c != NULL);
        vc_write(a, sh, len / 2, vc_rand(&rs)); /* the source changes; the copy must not */
        VC_CHECK(vc_copy(a + len / 2, c + len / 2, len - len / 2) == 0);
        vc_check(a, sh, len, "a worker's block");
        vc_free(c);
        vc_free(a);
        vc_unshadow(sh, len);
        __atomic_fetch_add(&worker_rounds, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

int main(void) {
    size_t len = 600 * VC_PS + 5;
    unsigned char *m = vc_alloc(len), *msh = vc_shadow(len);
    VC_CHECK(m != NULL);
    vc_write(m, msh, len, 3);
    pthread_t t[2];
    for (int i = 0; i < 2; i++) VC_CHECK(pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i) == 0);
    int stuck = 0;
    for (int f = 0; f < FORKS; f++) {
        unsigned char *d = vc_dup(m, len), *dsh = vc_shadow(len); /* a copy right before the fork */
        VC_CHECK(d != NULL);
        vc_sh_copy(dsh, msh, len);
        usleep(2000 + 500 * (unsigned)f); /* let the workers get into their calls */
        pid_t pid = fork();
        VC_CHECK(pid >= 0);
        if (pid == 0) {
            alarm(5);
            vc_check(m, msh, len, "child: the parent's block");
            vc_check(d, msh, len, "child: the copy made before the fork");
            unsigned char *e = vc_dup(m, len), *esh = vc_shadow(len);
            VC_CHECK(e != NULL);
            vc_sh_copy(esh, msh, len);
            vc_write(e + VC_PS, esh + VC_PS, 3 * VC_PS, 7);
            VC_CHECK(vc_copy(d, e, len) == 0);
            vc_check(d, esh, len, "child: a copy into the pre-fork copy");
            vc_check(m, msh, len, "child: the parent's block after the child's copies");
            vc_free(e);
            _exit(0);
        }
        vc_write(m + 10, msh + 10, 2 * VC_PS, (uint64_t)f + 11); /* the parent writes meanwhile */
        int st = 0;
        VC_CHECK(waitpid(pid, &st, 0) == pid);
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) {
            fprintf(stderr, "[%s] fork_threads: child of fork %d stuck for 5 s (killed by SIGALRM)\n", VC_BACKEND, f);
            stuck++;
            continue;
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "[%s] fork_threads: child of fork %d failed (status %#x)\n", VC_BACKEND, f, st);
            exit(1);
        }
        vc_check(d, dsh, len, "parent: its pre-fork copy after the child copied into it");
        vc_free(d);
        vc_unshadow(dsh, len);
        vc_check(m, msh, len, "parent: its block after the child ran");
    }
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 2; i++) VC_CHECK(pthread_join(t[i], NULL) == 0);
    if (stuck) {
        fprintf(stderr, "[%s] fork_threads: %d of %d children stuck\n", VC_BACKEND, stuck, FORKS);
        return 1;
    }
    vc_free(m);
    char detail[120];
    snprintf(detail, sizeof detail, "%d forks during %lu worker rounds of alloc/dup/write/copy/free", FORKS,
             worker_rounds);
    return vc_done("fork_threads", detail);
}
