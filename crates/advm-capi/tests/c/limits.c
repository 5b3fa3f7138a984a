/* Resource limits give clean errors that go away with the limit:
 * under an address-space limit (RLIMIT_AS) far below the arena's 256 GiB reservation,
 * advm_alloc still works (the arena reserves less) instead of failing with ENOSYS
 * for the life of the process. */
#define _GNU_SOURCE
#include <advm.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"

int main(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);

    /* An address-space limit of 2 GiB: the arena's first call must still work. */
    struct rlimit as_was, as = {(rlim_t)2 << 30, RLIM_INFINITY};
    CHECK(getrlimit(RLIMIT_AS, &as_was) == 0);
    as.rlim_max = as_was.rlim_max;
    CHECK(setrlimit(RLIMIT_AS, &as) == 0);
    errno = 0;
    unsigned char *a = advm_alloc(16 * ps);
    if (!a) fprintf(stderr, "advm_alloc under RLIMIT_AS=2GiB: %s\n", strerror(errno));
    CHECK(a != NULL);
    memset(a, 5, 16 * ps);
    unsigned char *b = advm_dup(a, 16 * ps);
    CHECK(b != NULL && all(b, 16 * ps, 5));
    errno = 0;
    CHECK(advm_alloc((size_t)4 << 30) == NULL && errno == ENOMEM); /* past the limit: ENOMEM */
    advm_free(a);
    advm_free(b);
    CHECK(setrlimit(RLIMIT_AS, &as_was) == 0);
    printf("limits: RLIMIT_AS 2 GiB: advm_alloc works\n");
    return 0;
}

