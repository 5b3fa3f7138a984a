/* A panic inside the arena (a bug) must not let later calls run on half-updated
 * state: the call that panicked fails with EIO, every later call with
 * ENOTRECOVERABLE. The panic is injected by a test-only hook of libadvm. */
#include <advm.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

/* Testing only, not in advm.h: panics inside the arena's lock; returns -EIO. */
int advm_vcopy_test_inject_panic(void);

int main(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *a = advm_alloc(4 * ps);
    CHECK(a != NULL);
    memset(a, 9, 4 * ps);
    CHECK(advm_vcopy_test_inject_panic() == -EIO);

    errno = 0;
    CHECK(advm_alloc(ps) == NULL && errno == ENOTRECOVERABLE);
    errno = 0;
    CHECK(advm_dup(a, 4 * ps) == NULL && errno == ENOTRECOVERABLE);
    struct advm_vcopy_stats st;
    CHECK(advm_vcopy_get_stats(&st) == -ENOTRECOVERABLE);
    CHECK(advm_vcopy(a + 2 * ps, a, 2 * ps) == -ENOTRECOVERABLE);
    errno = 0;
    advm_free(a);
    CHECK(errno == ENOTRECOVERABLE);
    CHECK(a[4 * ps - 1] == 9); /* the blocks stay mapped: their bytes can still be saved */
    printf("vcopy_panic: after a panic every call fails with ENOTRECOVERABLE\n");
    return 0;
}
