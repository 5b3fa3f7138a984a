/* Low RLIMIT_AS and RLIMIT_DATA, set by the program at run time (each in a child):
 * allocations within the limit work, bigger ones fail with NULL and ENOMEM (never a
 * crash), a failed realloc keeps its block, and copies still work. */
#include "sweep.h"
#include <sys/resource.h>
#include <sys/wait.h>

#define MB (1ul << 20)

static void show(const char *what, void *p) { printf("  %s: %s errno=%d\n", what, p ? "ptr" : "NULL", p ? 0 : errno); }

static void under(int resource, const char *name, size_t limit, size_t too_big) {
    printf("%s %zu MiB\n", name, limit / MB);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* blocks live across the change: a copy and its source */
        char *pre = malloc(MB), *pre2 = malloc(MB);
        CHECK(pre && pre2);
        fill(pre, MB, 2);
        memcpy(pre2, pre, MB);
        struct rlimit rl = {limit, limit};
        CHECK(setrlimit(resource, &rl) == 0);
        pre2[9] ^= 1;
        CHECK(holds(pre, MB, 2, 0));
        pre = realloc(pre, 3 * MB);
        CHECK(pre && holds(pre, MB, 2, 0));
        pid_t grandchild = fork();
        CHECK(grandchild >= 0);
        if (grandchild == 0) {
            memset(pre2, 0, MB);
            free(pre2);
            _exit(0);
        }
        int gst;
        CHECK(waitpid(grandchild, &gst, 0) == grandchild && WIFEXITED(gst) && WEXITSTATUS(gst) == 0);
        pre2[9] ^= 1;
        CHECK(holds(pre2, MB, 2, 0));
        free(pre), free(pre2);
        char *a = malloc(4 * MB), *b = malloc(4 * MB);
        show("malloc 4 MiB", a);
        show("malloc 4 MiB again", b);
        CHECK(a && b);
        fill(a, 4 * MB, 1);
        memcpy(b, a, 4 * MB);
        b[7] ^= 1;
        CHECK(holds(a, 4 * MB, 1, 0));
        errno = 0;
        show("malloc too big", malloc(too_big));
        errno = 0;
        show("calloc too big", calloc(1, too_big));
        errno = 0;
        void *m = NULL;
        printf("  posix_memalign too big: %d\n", posix_memalign(&m, 64, too_big));
        errno = 0;
        char *r = realloc(a, too_big);
        show("realloc too big", r);
        CHECK(!r && holds(a, 4 * MB, 1, 0));
        /* many blocks up to the limit: every one either works or fails cleanly */
        int got = 0;
        char *keep[64];
        for (int i = 0; i < 64; i++) {
            keep[i] = malloc(2 * MB);
            if (keep[i]) memset(keep[i], i, 2 * MB), got++;
        }
        printf("  2 MiB blocks: %s\n", got == 64 ? "all 64" : got > 0 ? "some, then NULL" : "none");
        for (int i = 0; i < 64; i++) free(keep[i]);
        char *small[1000];
        for (int i = 0; i < 1000; i++) { small[i] = malloc(100); CHECK(small[i]); }
        for (int i = 0; i < 1000; i++) free(small[i]);
        free(a), free(b);
        printf("  done\n");
        fflush(stdout);
        _exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    printf("  child %s %d\n", WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
}

int main(void) {
    under(RLIMIT_AS, "RLIMIT_AS", 1024 * MB, 2048 * MB);
    under(RLIMIT_DATA, "RLIMIT_DATA", 256 * MB, 512 * MB);
    under(RLIMIT_AS, "RLIMIT_AS", 96 * MB, 128 * MB);
    return 0;
}
