/* Allocates and copies large blocks, then execs itself (the shim's memfd and pagemap
 * descriptors must not leak into the new image: it counts its open descriptors before
 * its first copy, as the first image did), once
 * after a fork and once directly. */
#include "sweep.h"
#include <dirent.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define N (1u << 20)

/* Without malloc (opendir allocates 32 KiB, a block the shim may serve from its memfd). */
static int open_fds(void) {
    int fd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY);
    CHECK(fd >= 0);
    char buf[4096];
    int n = 0;
    for (long got; (got = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0;)
        for (long off = 0; off < got;) {
            struct dirent64 *e = (struct dirent64 *)(buf + off);
            n += e->d_name[0] != '.';
            off += e->d_reclen;
        }
    close(fd);
    return n - 1; /* the directory's own */
}

static void work(unsigned seed) {
    char *a = malloc(N), *b = malloc(N);
    CHECK(a && b);
    fill(a, N, seed);
    memcpy(b, a, N);
    a[0] ^= 1;
    CHECK(holds(b, N, seed, 0));
    free(a);
    CHECK(holds(b, N, seed, 0));
    free(b);
}

int main(int argc, char **argv) {
    /* before any copy: in vcopy mode the shim then holds its memfd and pagemap open */
    int fds = open_fds();
    work((unsigned)argc);
    if (argc == 3) {
        /* as many as the first image had at its start: nothing leaked through exec */
        int first = atoi(argv[2]);
        if (fds == first) printf("exec'd image: descriptors as at the first start\n");
        else printf("exec'd image: %d descriptors open, %d at the first start\n", fds, first);
        return 0;
    }
    char count[16];
    snprintf(count, sizeof count, "%d", fds);
    char *args[] = {argv[0], "x", count, NULL};
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        work(7);
        execv(argv[0], args);
        _exit(127);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    work(8);
    fflush(stdout);
    execv(argv[0], args);
    return 127;
}
