#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
static long count_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    long n = 0; int c;
    while ((c = getc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}
int main(int argc, char **argv) {
    long left = argc > 1 ? atol(argv[1]) : 300;
    long blocks = argc > 2 ? atol(argv[2]) : 1280;
    size_t sz = argc > 3 ? (size_t)atol(argv[3]) << 10 : 256 << 10;
    int copy = argc > 4 ? atoi(argv[4]) : 1;
    FILE *f = fopen("/proc/sys/vm/max_map_count", "r");
    long max; if (fscanf(f, "%ld", &max) != 1) return 2; fclose(f);
    long have = count_maps();
    long want = max - left - have;
    long pages = 2 * want + 2;
    char *r = mmap(NULL, pages * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    for (long i = 0; i < want / 2; i++) if (mprotect(r + (2 * i + 1) * 4096, 4096, PROT_READ)) { perror("mprotect"); break; }
    long before = count_maps();
    char *src = malloc(sz);
    memset(src, 7, sz);
    char **b = calloc(blocks, sizeof *b);
    long nul = 0;
    for (long i = 0; i < blocks; i++) {
        b[i] = malloc(sz);
        if (!b[i]) { nul++; continue; }
        if (copy) memcpy(b[i], src, sz); else memset(b[i], 1, sz);
    }
    long after = count_maps();
    printf("max %ld maps before %ld after %ld; %ld of %ld mallocs NULL\n", max, before, after, nul, blocks);
    return nul != 0;
}
