/* Under an address-space limit too tight for this process's own store (RLIMIT_AS),
 * advm_merge fails with ENOMEM, and works once the limit is raised.
 * Out of fds (RLIMIT_NOFILE reached), the calls that need one say EMFILE, as the
 * header promises, and work again once fds are freed:
 * - advm_merge of a range once the store exists (it said ENOSYS, "no write protection
 *   on this kernel": the failed userfaultfd open was taken for a missing feature);
 * - advm_merge_trim (ENOSYS too: /proc unreadable was taken for maps that cannot be
 *   read);
 * - the first advm_alloc, which makes the arena (and the next call tries again).
 * The refused merge leaves the range's bytes as they were. */
#define _GNU_SOURCE
#include <advm.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"

static int held[4096];
static int nheld;

/* Opens fds until the limit: the next open fails with EMFILE. */
static void exhaust_fds(void) {
    while (nheld < 4096 && (held[nheld] = open("/dev/null", O_RDONLY)) >= 0) nheld++;
    CHECK(nheld < 4096 && errno == EMFILE);
}

static void release_fds(void) {
    while (nheld > 0) close(held[--nheld]);
}

int main(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    setenv("ADVM_SOCKET", "/nonexistent/advmd.sock", 1); /* this process's own store */
    unsigned char *m = mmap(NULL, 16 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    memset(m, 5, 8 * ps);
    memset(m + 8 * ps, 6, 8 * ps);

    /* 256 MiB of address space left: less than the store's smallest view (1 GiB). */
    struct rlimit as_was, as;
    CHECK(getrlimit(RLIMIT_AS, &as_was) == 0);
    as = as_was;
    as.rlim_cur = vm_size() + (256u << 20);
    CHECK(setrlimit(RLIMIT_AS, &as) == 0);
    errno = 0;
    int r = advm_merge(m, 8 * ps, NULL);
    int e = errno;
    CHECK(setrlimit(RLIMIT_AS, &as_was) == 0);
    if (r == -ENOSYS) {
        printf("skipped: no userfaultfd write protection here (%s)\n", advm_merge_via());
        return 0;
    }
    printf("under RLIMIT_AS: advm_merge %d (%s)\n", r, strerror(-r));
    CHECK(r == -ENOMEM && e == ENOMEM);
    CHECK(all(m, 8 * ps, 5));

    struct rlimit was, low;
    CHECK(getrlimit(RLIMIT_NOFILE, &was) == 0);
    low = was;
    low.rlim_cur = 256;
    CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);

    exhaust_fds();
    errno = 0;
    CHECK(advm_alloc(ps) == NULL && errno == EMFILE);
    release_fds();
    void *blk = advm_alloc(ps);
    CHECK(blk != NULL);
    advm_free(blk);

    r = advm_merge(m, 8 * ps, NULL);
    CHECK(r == 0);

    exhaust_fds();
    errno = 0;
    r = advm_merge(m + 8 * ps, 8 * ps, NULL);
    e = errno;
    errno = 0;
    int t = advm_merge_trim(NULL);
    int te = errno;
    release_fds();
    printf("out of fds: advm_merge %d (%s), advm_merge_trim %d (%s)\n", r, strerror(-r), t, strerror(-t));
    CHECK(r == -EMFILE && e == EMFILE);
    CHECK(t == -EMFILE && te == EMFILE);
    CHECK(all(m, 8 * ps, 5) && all(m + 8 * ps, 8 * ps, 6));

    struct advm_merge_stats st;
    CHECK(advm_merge(m + 8 * ps, 8 * ps, &st) == 0 && st.merged + st.added == 8);
    CHECK(advm_merge_trim(NULL) == 0);
    CHECK(all(m, 8 * ps, 5) && all(m + 8 * ps, 8 * ps, 6));
    CHECK(setrlimit(RLIMIT_NOFILE, &was) == 0);
    printf("merge_limits: ENOMEM under RLIMIT_AS, EMFILE out of fds (merge, trim, first alloc), then all work again\n");
    return 0;
}
