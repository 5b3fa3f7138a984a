/* fork() while other threads flush and mark an advm_pager: in the child every call on
 * the inherited pager fails at once with -ENOTRECOVERABLE (it waited for ever on the
 * eviction lock a parent thread held at the fork, or reported success on regions the
 * child does not have; advm_pager_fault_mode answered the parent's mode),
 * advm_pager_destroy there returns quietly, and the parent's
 * pager keeps every page. */
#include <advm.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

#define LEN (4u << 20)
static advm_pager *pg;
static unsigned char *r;
static volatile int stop;

static void *flusher(void *arg) {
    (void)arg;
    while (!stop) {
        CHECK(advm_pager_flush(pg, r, LEN) >= 0);
        CHECK(advm_pager_discardable(pg, r + LEN / 2, LEN / 2) == 0);
        CHECK(advm_pager_needed(pg, r + LEN / 2, LEN / 2) == 0);
    }
    return NULL;
}

int main(void) {
    pg = advm_pager_new(1 << 20, NULL);
    if (pg == NULL && errno == ENOSYS) {
        printf("skipped: no userfaultfd pager here\n");
        return 0;
    }
    CHECK(pg != NULL);
    r = advm_pager_map(pg, LEN);
    CHECK(r != NULL);
    memset(r, 7, LEN / 2);
    pthread_t t[2];
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&t[i], NULL, flusher, NULL) == 0);
    for (int round = 0; round < 20; round++) {
        usleep(2000);
        pid_t c = fork();
        CHECK(c >= 0);
        if (c == 0) {
            alarm(20); /* a hang ends the child with SIGALRM */
            struct advm_pager_stats s;
            if (advm_pager_flush(pg, r, LEN) != -ENOTRECOVERABLE) _exit(2);
            if (advm_pager_discardable(pg, r, 4096) != -ENOTRECOVERABLE) _exit(3);
            if (advm_pager_lock(pg, r, 4096) != -ENOTRECOVERABLE) _exit(4);
            if (advm_pager_stats(pg, &s) != -ENOTRECOVERABLE) _exit(5);
            errno = 0;
            if (advm_pager_map(pg, 4096) != NULL || errno != ENOTRECOVERABLE) _exit(6);
            /* fault_mode answered the parent's mode here, as if the child had a pager */
            errno = 0;
            if (advm_pager_fault_mode(pg) != -ENOTRECOVERABLE || errno != ENOTRECOVERABLE) _exit(7);
            if (advm_pager_needed(pg, r, 4096) != -ENOTRECOVERABLE) _exit(8);
            if (advm_pager_unlock(pg, r, 4096) != -ENOTRECOVERABLE) _exit(9);
            if (advm_pager_unmap(pg, r, LEN) != -ENOTRECOVERABLE) _exit(10);
            advm_pager_destroy(pg);
            _exit(0);
        }
        int st;
        CHECK(waitpid(c, &st, 0) == c);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fprintf(stderr, "round %d: child status %d (signal %d)\n", round, WEXITSTATUS(st),
                    WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    stop = 1;
    for (int i = 0; i < 2; i++) CHECK(pthread_join(t[i], NULL) == 0);
    CHECK(all(r, LEN / 2, 7));
    advm_pager_destroy(pg);
    printf("ok\n");
    return 0;
}
