/* After fork, parent and child never see each other's writes, to shared-before-fork
 * blocks or to virtual copies, and frees in one do not disturb the other. */
#include <sys/wait.h>
#include "t.h"

#define N (32 * PS)

int main(void) {
    unsigned char *a = malloc(N), *b = malloc(N), *lone = malloc(N);
    fill(a, N, 1);
    memcpy(b, a, N); /* virtual copy: private mappings */
    fill(lone, N, 2); /* single owner: a writable shared mapping until fork */
    for (int round = 0; round < 3; round++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            lone[5] ^= 0xff;
            a[PS * 3] ^= 0xff;
            b[PS * 4] ^= 0xff;
            free(lone); /* the parent still maps these pages */
            unsigned char *c = malloc(N), *d = malloc(N);
            fill(c, N, 3);
            memcpy(d, a, N);
            CHECK(d[PS * 3] == (unsigned char)(a[PS * 3]));
            free(c);
            free(d);
            _exit(0);
        }
        int st;
        CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
        CHECK(same(a, N, 1) && same(b, N, 1) && same(lone, N, 2));
        /* the parent keeps working: new blocks, copies and frees after the fork */
        unsigned char *c = malloc(N);
        memcpy(c, lone, N);
        CHECK(same(c, N, 2));
        free(c);
    }
    /* the child sees the parent's state at fork, not its later writes, also for a block
     * allocated (shared, single owner) just before the fork */
    unsigned char *fresh = malloc(N);
    fill(fresh, N, 4);
    int pipefd[2];
    CHECK(pipe(pipefd) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        char go;
        CHECK(read(pipefd[0], &go, 1) == 1);
        _exit(same(lone, N, 2) && same(a, N, 1) && same(fresh, N, 4) ? 0 : 1);
    }
    fresh[PS * 2] ^= 1;
    lone[7] ^= 1;
    a[PS * 9] ^= 1;
    CHECK(write(pipefd[1], "x", 1) == 1);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    free(a);
    free(b);
    free(lone);
    free(fresh);
    printf("fork: ok\n");
    return 0;
}
