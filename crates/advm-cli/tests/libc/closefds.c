/* Closes every descriptor above stderr (close_range, then closefrom's way), opens files
 * of its own that get the freed numbers, and allocates, copies, frees and forks: the
 * files keep their bytes and the copies theirs. */
#include "sweep.h"
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define N (1u << 20)

static void round_trip(unsigned seed) {
    char path[] = "/tmp/advm-sweep-fd-XXXXXX";
    int fds[6];
    for (int i = 0; i < 6; i++) {
        fds[i] = mkstemp(path);
        CHECK(fds[i] >= 0);
        unlink(path);
        memcpy(path + sizeof path - 7, "XXXXXX", 6);
        char buf[8192];
        fill(buf, sizeof buf, seed + (unsigned)i);
        CHECK(write(fds[i], buf, sizeof buf) == (ssize_t)sizeof buf);
    }
    char *a = malloc(N), *b = malloc(N), *c = malloc(N);
    CHECK(a && b && c);
    fill(a, N, seed);
    memcpy(b, a, N);
    memcpy(c, b, N);
    free(a);
    b[100] ^= 1;
    free(b);
    CHECK(holds(c, N, seed, 0));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        memset(c, 0, N);
        _exit(0);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st));
    CHECK(holds(c, N, seed, 0));
    free(c);
    for (int i = 0; i < 6; i++) {
        char buf[8192];
        struct stat s;
        CHECK(fstat(fds[i], &s) == 0 && s.st_size == (off_t)sizeof buf);
        CHECK(pread(fds[i], buf, sizeof buf, 0) == (ssize_t)sizeof buf && holds(buf, sizeof buf, seed + (unsigned)i, 0));
    }
    for (int i = 0; i < 6; i++) close(fds[i]);
}

int main(void) {
    round_trip(1); /* the shim has its descriptors now */
    CHECK(syscall(SYS_close_range, 3, ~0u, 0) == 0);
    round_trip(2);
    closefrom(3);
    round_trip(3);
    printf("files and copies intact\n");
    return 0;
}
