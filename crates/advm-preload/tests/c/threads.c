/* Many threads allocating, copying (virtually), writing and freeing at once. */
#include <pthread.h>
#include "t.h"

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int round = 0; round < 200; round++) {
        size_t n = (size_t)(2 + (round * 7 + seed) % 40) * PS;
        unsigned char *a = malloc(n), *b = malloc(n);
        if (!a || !b) return (void *)1;
        fill(a, n, seed + (unsigned)round);
        memcpy(b, a, n);
        b[n / 2] ^= 0xff;
        if (!same(a, n, seed + (unsigned)round)) return (void *)2;
        b[n / 2] ^= 0xff;
        if (!same(b, n, seed + (unsigned)round)) return (void *)3;
        b = realloc(b, n + 5 * PS);
        if (!b || !same(b, n, seed + (unsigned)round)) return (void *)4;
        free(a);
        free(b);
    }
    return NULL;
}

int main(void) {
    pthread_t t[8];
    for (int i = 0; i < 8; i++) CHECK(pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i * 13)) == 0);
    for (int i = 0; i < 8; i++) {
        void *r;
        CHECK(pthread_join(t[i], &r) == 0);
        CHECK(r == NULL);
    }
    printf("threads: ok\n");
    return 0;
}
