/* Pointers the arena did not hand out go to glibc untouched: small blocks, blocks
 * from glibc's own entry points, strdup'd strings, getline's buffer. */
#include "t.h"

extern void *__libc_malloc(size_t);

int main(void) {
    char *s = strdup("hello, glibc");
    CHECK(s && malloc_usable_size(s) >= 13);
    free(s);
    void *g = __libc_malloc(64 * PS); /* glibc's mmap'd chunk, freed through our free */
    CHECK(g && !in_arena(g, 64 * PS));
    memset(g, 1, 64 * PS);
    CHECK(malloc_usable_size(g) >= 64 * PS);
    free(g);
    FILE *f = fopen("/proc/self/maps", "r");
    CHECK(f);
    char *line = NULL;
    size_t cap = 0;
    size_t lines = 0;
    while (getline(&line, &cap, f) > 0) lines++;
    fclose(f);
    free(line);
    CHECK(lines > 3);
    /* a big glibc block copied into an arena block and back: plain copies, correct */
    unsigned char *a = malloc(16 * PS);
    unsigned char *h = __libc_malloc(16 * PS);
    fill(h, 16 * PS, 3);
    memcpy(a, h, 16 * PS);
    CHECK(same(a, 16 * PS, 3));
    memset(h, 0, 16 * PS);
    memcpy(h, a, 16 * PS);
    CHECK(same(h, 16 * PS, 3));
    free(h);
    free(a);
    printf("foreign: ok\n");
    return 0;
}
