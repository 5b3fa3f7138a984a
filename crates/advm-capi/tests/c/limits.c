/* Resource limits give clean errors that go away with the limit:
 * - advm_vcopy_get_stats before any arena use reports zeros without making the arena
 *   (it reserved 256 GiB of address space just to say nothing was copied, and under
 *   an address-space limit returned -ENOMEM);
 * - under an address-space limit (RLIMIT_AS) far below the arena's 256 GiB reservation,
 *   advm_alloc still works (the arena reserves less) instead of failing with ENOSYS
 *   for the life of the process;
 * - out of fds (RLIMIT_NOFILE reached), advm_move and advm_pager_new fail with EMFILE
 *   (not ENOENT, not ENOSYS), and once fds are freed both work again (the maps file's
 *   failed open was kept for the process's life: every later advm_move said ENOENT),
 *   and moves use UFFDIO_MOVE again (the remap engine's userfaultfd, not opened while
 *   out of fds, was done without for the process's life). */
#define _GNU_SOURCE
#include <advm.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"

static int held[4096], nheld;

/* Opens fds until the limit: the next open fails with EMFILE. */
static void exhaust_fds(void) {
    int fd;
    while (nheld < 4096 && (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) held[nheld++] = fd;
    CHECK(nheld < 4096 && errno == EMFILE);
}

static void free_fds(void) {
    while (nheld > 0) close(held[--nheld]);
}

int main(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);

    /* No arena yet, and no room for one (16 MiB of address space left, the arena
     * settles for no less than 64 MiB): its figures are zeros all the same. */
    struct rlimit as_was, as = {(rlim_t)(vm_size() + (16 << 20)), RLIM_INFINITY};
    CHECK(getrlimit(RLIMIT_AS, &as_was) == 0);
    as.rlim_max = as_was.rlim_max;
    CHECK(setrlimit(RLIMIT_AS, &as) == 0);
    struct advm_vcopy_stats vs;
    memset(&vs, 0xff, sizeof vs);
    int gs = advm_vcopy_get_stats(&vs);
    if (gs) fprintf(stderr, "advm_vcopy_get_stats with no arena, 16 MiB of address space left: %s\n", strerror(-gs));
    CHECK(gs == 0 && vs.blocks == 0 && vs.memfd_resident_bytes == 0 && vs.bytes_copied == 0 && vs.vmas == 0);
    CHECK(setrlimit(RLIMIT_AS, &as_was) == 0);

    /* An address-space limit of 2 GiB: the arena's first call must still work. */
    as.rlim_cur = (rlim_t)2 << 30;
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

    /* Out of fds. */
    unsigned char *m = mmap(NULL, 32 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    memset(m, 1, 16 * ps);
    memset(m + 16 * ps, 2, 16 * ps);
    struct rlimit nofile_was, nofile;
    CHECK(getrlimit(RLIMIT_NOFILE, &nofile_was) == 0);
    nofile = nofile_was;
    nofile.rlim_cur = 64;
    CHECK(setrlimit(RLIMIT_NOFILE, &nofile) == 0);
    exhaust_fds();
    errno = 0;
    int r = advm_move(m, m + 16 * ps, 16 * ps);
    int e = errno;
    errno = 0;
    advm_pager *p = advm_pager_new(1 << 20, NULL);
    int pe = errno;
    size_t be_out_of_fds = advm_remap_break_even_pages(); /* no userfaultfd to be had now */
    free_fds();
    printf("out of fds: advm_move %d (%s), advm_pager_new %s (%s)\n", r, strerror(e), p ? "made" : "NULL", strerror(pe));
    CHECK(r == -EMFILE && e == EMFILE);
    CHECK(p == NULL && pe == EMFILE);
    CHECK(all(m, 16 * ps, 1) && all(m + 16 * ps, 16 * ps, 2)); /* nothing changed */

    /* fds back: both work. */
    r = advm_move(m, m + 16 * ps, 16 * ps);
    if (r) fprintf(stderr, "advm_move after the fds came back: %s\n", strerror(-r));
    CHECK(r == 0 && all(m, 16 * ps, 2));
    p = advm_pager_new(1 << 20, NULL);
    CHECK(p != NULL); /* so this kernel has UFFDIO_MOVE */
    /* A move of 128 pages into empty memory: by UFFDIO_MOVE again, not memmove (the
     * userfaultfd the remap engine could not open while out of fds was given up on for
     * the process's life, and the break-even stayed at the 512 pages of a kernel
     * without it). */
    unsigned char *big = mmap(NULL, 256 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(big != MAP_FAILED && madvise(big, 256 * ps, MADV_NOHUGEPAGE) == 0);
    memset(big + 128 * ps, 4, 128 * ps);
    struct advm_remap_stats st;
    memset(&st, 0, sizeof st);
    CHECK(advm_move_stats(big, big + 128 * ps, 128 * ps, &st) == 0 && all(big, 128 * ps, 4));
    printf("break-even out of fds %zu, after %zu; 128-page move: %zu bytes by UFFDIO_MOVE, %zu by memmove\n",
           be_out_of_fds, advm_remap_break_even_pages(), st.uffd_move_bytes, st.memmove_bytes);
    CHECK(st.uffd_move_bytes == 128 * ps);
    munmap(big, 256 * ps);
    unsigned char *pm = advm_pager_map(p, 4 * ps);
    CHECK(pm != NULL);
    pm[0] = 9;
    CHECK(pm[0] == 9);
    advm_pager_destroy(p);
    CHECK(setrlimit(RLIMIT_NOFILE, &nofile_was) == 0);
    printf("limits: RLIMIT_AS 2 GiB: advm_alloc works; out of fds: EMFILE, then advm_move and advm_pager_new work again\n");
    return 0;
}
