/* advm_alloc sizes: 0 gives a unique, freeable minimal block (as malloc(0) does in
 * glibc); sizes that cannot fit fail with ENOMEM (as malloc does), not EINVAL. */
#include <advm.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static void enomem(size_t len) {
    errno = 0;
    void *p = advm_alloc(len);
    if (p != NULL || errno != ENOMEM) {
        fprintf(stderr, "advm_alloc(%zu): %p, errno %d (%s); want NULL, ENOMEM\n", len, p, errno, strerror(errno));
        exit(1);
    }
}

int main(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    enomem(SIZE_MAX);
    enomem(SIZE_MAX - 4095);
    enomem(SIZE_MAX - ps + 1);
    enomem((size_t)1 << 40); /* above the arena's 256 GiB reservation */
    enomem(((size_t)256 << 30) + 1);

    unsigned char *z1 = advm_alloc(0), *z2 = advm_alloc(0);
    CHECK(z1 != NULL && z2 != NULL && z1 != z2);
    CHECK(((size_t)z1 % ps) == 0);
    z1[0] = 1; /* a minimal block is one page, zeroed */
    CHECK(z1[0] == 1 && z2[ps - 1] == 0);
    errno = 0;
    advm_free(z1);
    advm_free(z2);
    CHECK(errno == 0);
    struct advm_vcopy_stats st;
    CHECK(advm_vcopy_get_stats(&st) == 0 && st.blocks == 0);
    printf("vcopy_alloc: SIZE_MAX, SIZE_MAX-4095, 1 TiB, 256 GiB+1: ENOMEM; advm_alloc(0): unique page\n");
    return 0;
}
