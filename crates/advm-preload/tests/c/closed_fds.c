/* A program that closes every descriptor above stderr (as a daemon does, or closefrom)
 * after the shim opened its memfd and pagemap, and gets the same numbers back for its
 * own files: the shim never writes, punches, maps or closes them (it used to punch
 * holes into the program's file at the next free), its copies stay right, and after a
 * fork parent and child still do not see each other's writes (in memfd mode a block is a
 * shared mapping of the memfd the program closed). */
#include "t.h"
#include <sys/wait.h>

#define N (64 * PS)
#define FILES 8
#define FILE_BYTES (16 * PS)

int main(void) {
    unsigned char *a = malloc(N), *b = malloc(N), *lone = malloc(N);
    fill(a, N, 1);
    memcpy(b, a, N); /* opens the memfd (vcopy) and the pagemap file */
    fill(lone, N, 2);
    for (int fd = 3; fd < 1024; fd++) close(fd);
    int files[FILES];
    static unsigned char mine[FILE_BYTES], back[FILE_BYTES];
    memset(mine, 'U', sizeof mine);
    for (int i = 0; i < FILES; i++) {
        files[i] = open("/tmp", O_TMPFILE | O_RDWR, 0600);
        CHECK(files[i] >= 0);
        CHECK(write(files[i], mine, sizeof mine) == (ssize_t)sizeof mine);
    }
    /* copies, frees and new blocks after the close: the shim must use none of the files */
    unsigned char *c = malloc(N), *d = malloc(N), *e = malloc(N);
    fill(c, N, 3);
    memcpy(d, c, N);
    memcpy(e, a, N);
    CHECK(same(d, N, 3) && same(e, N, 1) && same(b, N, 1));
    free(b);
    free(c);
    unsigned char *f = malloc(N);
    fill(f, N, 4);
    memcpy(d, f, N);
    CHECK(same(d, N, 4));
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        lone[5] ^= 0xff;
        d[PS * 3] ^= 0xff;
        unsigned char *g = malloc(N);
        memcpy(g, e, N);
        _exit(same(g, N, 1) ? 0 : 1);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(same(lone, N, 2) && same(d, N, 4) && same(e, N, 1));
    free(a);
    free(d);
    free(e);
    free(f);
    free(lone);
    malloc_trim(0);
    for (int i = 0; i < FILES; i++) {
        struct stat s;
        CHECK(fstat(files[i], &s) == 0);
        CHECK(s.st_size == FILE_BYTES);
        CHECK(s.st_blocks * 512 >= FILE_BYTES); /* no hole punched */
        CHECK(pread(files[i], back, sizeof back, 0) == (ssize_t)sizeof back);
        CHECK(memcmp(back, mine, sizeof back) == 0);
        CHECK(close(files[i]) == 0); /* still open: the shim did not close it */
    }
    printf("closed_fds: ok\n");
    return 0;
}
