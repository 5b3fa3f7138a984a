/* fork() while other threads are inside calls on a heap: the child's calls on that
 * heap must run (they waited for ever on the lock a parent thread held at the fork),
 * and its objects must be intact. */
#include <advm_gc.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static advm_gc *gc;
static volatile int stop;

static void *mutator(void *arg) {
    (void)arg;
    while (!stop) {
        void **o = advm_gc_alloc(gc, 1, 2000);
        CHECK(o != NULL);
        if (((unsigned long)o >> 4) % 64 == 0) CHECK(advm_gc_collect(gc, 1) == 0);
    }
    return NULL;
}

int main(void) {
    gc = advm_gc_new(16 << 20);
    CHECK(gc != NULL);
    void *keep = NULL;
    CHECK(advm_gc_root(gc, &keep) == 0);
    keep = advm_gc_alloc(gc, 0, 4096);
    CHECK(keep != NULL);
    memset((void **)keep, 0x5a, 4096);
    pthread_t t[3];
    for (int i = 0; i < 3; i++) CHECK(pthread_create(&t[i], NULL, mutator, NULL) == 0);
    for (int round = 0; round < 20; round++) {
        usleep(2000);
        pid_t child = fork();
        CHECK(child >= 0);
        if (child == 0) {
            alarm(10); /* a child that waits for ever ends with SIGALRM */
            int ok = advm_gc_collect(gc, 1) == 0 && advm_gc_alloc(gc, 1, 100) != NULL &&
                     all((const unsigned char *)keep, 4096, 0x5a);
            _exit(ok ? 0 : 3);
        }
        int status = 0;
        CHECK(waitpid(child, &status, 0) == child);
        if (status != 0) fprintf(stderr, "round %d: child status %#x (SIGALRM %#x: it waited for ever)\n", round, status, SIGALRM);
        CHECK(status == 0);
    }
    stop = 1;
    for (int i = 0; i < 3; i++) pthread_join(t[i], NULL);
    CHECK(all((const unsigned char *)keep, 4096, 0x5a));
    advm_gc_destroy(gc);
    printf("gc_fork_threads: 20 forks while 3 threads allocate and collect: children's calls ran\n");
    return 0;
}
