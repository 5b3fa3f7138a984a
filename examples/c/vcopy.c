/* docs/vcopy.md's example: virtual copies through libadvm.
 * cc -Iinclude examples/c/vcopy.c -Ltarget/debug -Wl,-rpath,$PWD/target/debug -ladvm */
#include <advm.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    size_t len = 64 << 20, n = 1 << 20;
    char *a = advm_alloc(len);                  /* zeroed, page aligned; NULL + errno */
    if (!a) return perror("advm_alloc"), 1;
    memset(a, 7, len);
    char *b = advm_dup(a, len);                 /* a virtual copy: no page copied */
    if (!b) return perror("advm_dup"), 1;
    b[4096] = 1;                                /* only this page is duplicated */
    int r = advm_vcopy(b + 100, a + 100, n);    /* 0 or -errno; partial first/last pages copied */
    if (r) return fprintf(stderr, "advm_vcopy: %s\n", strerror(-r)), 1;
    struct advm_vcopy_stats st;
    advm_vcopy_get_stats(&st);
    printf("b[4096] = %d, %llu pages shared\n", b[4096], (unsigned long long)st.pages_shared);
    advm_free(a);                               /* b keeps its contents */
    advm_free(b);
    return 0;
}
