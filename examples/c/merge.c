/* docs/merge.md's example: two buffers with the same bytes, merged so they share pages
 * (through advmd when it runs, else a store inside this process: advm_merge_via says).
 * cc -Iinclude examples/c/merge.c -Ltarget/debug -Wl,-rpath,$PWD/target/debug -ladvm */
#include <advm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    size_t len = 16 << 20;
    unsigned char *w = aligned_alloc(4096, len), *again = aligned_alloc(4096, len);
    if (!w || !again) return 1;
    for (size_t i = 0; i < len; i++) w[i] = (unsigned char)((i * 2654435761u) >> 24);
    memcpy(again, w, len);
    struct advm_merge_stats s1, s2;
    int r = advm_merge(w, len, &s1);            /* 0 or -errno; new pages are added */
    if (r == 0) r = advm_merge(again, len, &s2); /* equal pages now map the stored ones */
    if (r) return fprintf(stderr, "advm_merge: %s\n", strerror(-r)), 1;
    printf("added %llu, then merged %llu in %.1f ms via %s\n", (unsigned long long)s1.added,
           (unsigned long long)s2.merged, s2.nanoseconds / 1e6, advm_merge_via());
    return memcmp(w, again, len) == 0 && s2.merged == len / 4096 ? 0 : 1;
}
