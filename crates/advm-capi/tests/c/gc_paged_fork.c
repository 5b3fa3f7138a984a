/* A heap placed in an advm_pager, used in a forked child: the pager's regions (the
 * heap's memory) are not inherited, so every call on the heap there fails with
 * -ENOTRECOVERABLE (advm_gc_alloc: NULL, errno ENOTRECOVERABLE) instead of a
 * segmentation fault on the missing memory, and advm_gc_destroy returns quietly; the
 * parent's heap keeps its objects. */
#include <advm.h>
#include <advm_gc.h>
#include <errno.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

int main(void) {
    advm_pager *p = advm_pager_new(8 << 20, NULL);
    if (p == NULL && errno == ENOSYS) {
        printf("skipped: no userfaultfd pager here\n");
        return 0;
    }
    CHECK(p != NULL);
    advm_gc *gc = advm_gc_new_paged(16 << 20, NULL, p, 1);
    CHECK(gc != NULL);
    void *root = NULL;
    CHECK(advm_gc_root(gc, &root) == 0);
    for (long i = 0; i < 1000; i++) {
        void **o = advm_gc_alloc(gc, 1, 8);
        CHECK(o != NULL);
        o[0] = root;
        memcpy(o + 1, &i, sizeof i);
        root = o;
    }
    pid_t c = fork();
    CHECK(c >= 0);
    if (c == 0) {
        alarm(20);
        errno = 0;
        if (advm_gc_alloc(gc, 1, 8) != NULL || errno != ENOTRECOVERABLE) _exit(2);
        if (advm_gc_collect(gc, 1) != -ENOTRECOVERABLE) _exit(3);
        struct advm_gc_stats s;
        if (advm_gc_stats(gc, &s) != -ENOTRECOVERABLE) _exit(4);
        advm_gc_destroy(gc);
        _exit(0);
    }
    int st;
    CHECK(waitpid(c, &st, 0) == c);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fprintf(stderr, "child status %d (signal %d)\n", WEXITSTATUS(st), WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(advm_gc_collect(gc, 1) == 0);
    long n = 0;
    for (void **o = root; o != NULL; o = o[0]) {
        long v;
        memcpy(&v, o + 1, sizeof v);
        CHECK(v == 999 - n);
        n++;
    }
    CHECK(n == 1000);
    advm_gc_destroy(gc);
    advm_pager_destroy(p);
    printf("ok\n");
    return 0;
}
