/* Threads allocating, copying, reallocating and freeing large blocks while another
 * thread forks (glibc fork); each child checks its copies of the blocks and writes
 * them, and no thread ever sees another's writes or a child's. */
#include "sweep.h"
#include <pthread.h>
#include <sys/wait.h>

#define THREADS 4
#define ROUNDS 30
#define N (256u << 10)

static void *worker(void *arg) {
    unsigned id = (unsigned)(uintptr_t)arg;
    char *mine = malloc(N);
    CHECK(mine);
    fill(mine, N, id);
    for (unsigned r = 0; r < ROUNDS; r++) {
        char *copy = malloc(N);
        CHECK(copy);
        memcpy(copy, mine, N);
        copy[r * 97 % N] ^= 1;
        CHECK(holds(mine, N, id, 0));
        copy[r * 97 % N] ^= 1;
        CHECK(holds(copy, N, id, 0));
        copy = realloc(copy, N * 2 + r * 4096);
        CHECK(copy && holds(copy, N, id, 0));
        memmove(copy + 4096, copy, N);
        CHECK(holds(copy + 4096, N, id, 0));
        free(copy);
        char *z = calloc(1, N + r);
        CHECK(z && z[N / 2] == 0 && z[N + r - 1] == 0);
        free(z);
    }
    free(mine);
    return NULL;
}

int main(void) {
    char *shared = malloc(N);
    CHECK(shared);
    fill(shared, N, 99);
    pthread_t t[THREADS];
    for (unsigned i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i) == 0);
    int children = 0;
    for (unsigned f = 0; f < 8; f++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            /* only this thread lives on: allocate, copy and write freely */
            CHECK(holds(shared, N, 99, 0));
            char *c = malloc(N);
            CHECK(c);
            memcpy(c, shared, N);
            memset(shared, 'k', N);
            CHECK(holds(c, N, 99, 0));
            free(c);
            _exit(0);
        }
        int st;
        CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
        CHECK(holds(shared, N, 99, 0));
        children++;
    }
    for (unsigned i = 0; i < THREADS; i++) CHECK(pthread_join(t[i], NULL) == 0);
    printf("threads %d, children %d, shared %016llx\n", THREADS, children, (unsigned long long)sum(shared, N));
    free(shared);
    return 0;
}
