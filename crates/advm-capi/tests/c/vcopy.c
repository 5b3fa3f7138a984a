/* Virtual copy from C: equality, isolation both ways, copy of a copy, free of either
 * side, pages freed, fork isolation, threads, bad arguments. */
#include <advm.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static size_t ps;

static void *worker(void *arg) {
    unsigned seed = (unsigned)(size_t)arg;
    for (int i = 0; i < 50; i++) {
        size_t len = (2 + (i % 4)) * ps;
        unsigned char *a = advm_alloc(len);
        CHECK(a != NULL);
        memset(a, (int)(seed + i), len);
        unsigned char *b = advm_dup(a, len);
        CHECK(b != NULL);
        b[0] = 0xff;
        CHECK(a[0] == (unsigned char)(seed + i) && b[1] == (unsigned char)(seed + i));
        advm_free(a);
        CHECK(b[len - 1] == (unsigned char)(seed + i) && b[0] == 0xff);
        advm_free(b);
    }
    return NULL;
}

int main(void) {
    ps = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = 64 * ps;
    struct advm_vcopy_stats st;
    CHECK(advm_vcopy_get_stats(&st) == 0);
    unsigned long long base_pages = st.memfd_pages_live;

    unsigned char *src = advm_alloc(len);
    CHECK(src != NULL && ((size_t)src % ps) == 0);
    for (size_t i = 0; i < len; i++) src[i] = (unsigned char)(i * 7);
    unsigned char *dst = advm_dup(src, len);
    CHECK(dst != NULL && memcmp(src, dst, len) == 0);
    CHECK(advm_vcopy_get_stats(&st) == 0);
    CHECK(st.pages_shared >= 64 && st.memfd_pages_live == base_pages + 64);

    /* isolation both ways */
    dst[10] = 1;
    src[ps + 3] = 2;
    CHECK(src[10] == (unsigned char)(10 * 7) && dst[ps + 3] == (unsigned char)((ps + 3) * 7));

    /* copy of a modified copy */
    unsigned char *dst2 = advm_dup(dst, len);
    CHECK(dst2 != NULL && memcmp(dst2, dst, len) == 0 && dst2[10] == 1);
    CHECK(advm_vcopy_get_stats(&st) == 0 && st.pages_rehomed >= 1);

    /* advm_vcopy into an existing block, at a page-congruent unaligned offset */
    unsigned char *third = advm_alloc(len);
    CHECK(third != NULL);
    CHECK(advm_vcopy(third + 100, src + 100, len - 200) == 0);
    CHECK(memcmp(third + 100, src + 100, len - 200) == 0 && third[99] == 0 && third[len - 100] == 0);

    /* bad arguments */
    char outside[64];
    CHECK(advm_vcopy(third, outside, 64) == -EINVAL);
    CHECK(advm_vcopy(src + ps, src, 2 * ps) == -EINVAL);          /* overlapping */
    CHECK(advm_vcopy(third, src + len - ps, 2 * ps) == -EINVAL);  /* runs past the block */
    errno = 0;
    advm_free(src + 1);
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(advm_dup(outside, 64) == NULL && errno == EINVAL);

    /* fork isolation */
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        dst[0] = 0xcc;
        src[0] = 0xcc;
        _exit(dst2[0] == 0 && third[200] == (unsigned char)(200 * 7) ? 0 : 1);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK(dst[0] == 0 && src[0] == 0);

    /* threads */
    pthread_t t[4];
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, worker, (void *)(size_t)(i * 40)) == 0);
    for (int i = 0; i < 4; i++) CHECK(pthread_join(t[i], NULL) == 0);

    /* free either side first; pages return */
    advm_free(src);
    CHECK(dst[ps + 3] == (unsigned char)((ps + 3) * 7));
    advm_free(dst2);
    advm_free(dst);
    advm_free(third);
    CHECK(advm_vcopy_get_stats(&st) == 0);
    CHECK(st.blocks == 0);
    printf("vcopy: shared %llu pages, rehomed %llu, copied %llu bytes, fallbacks unaligned=%llu small=%llu vma=%llu\n",
           st.pages_shared, st.pages_rehomed, st.bytes_copied, st.fallback_unaligned, st.fallback_small,
           st.fallback_vma_budget);
    return 0;
}
