/* What the C API's test programs share: CHECK (names the file, the line and the
 * condition, and ends the program with status 1) and small byte checks. */
#ifndef ADVM_TEST_CHECK_H
#define ADVM_TEST_CHECK_H

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "advm.h"

#define CHECK(c)                                                                   \
    do {                                                                           \
        if (!(c)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

/* Ends the program with status 0, saying why, when this kernel offers the pager no
 * userfaultfd with UFFDIO_MOVE (advm_pager_new fails with ENOSYS). */
static inline void skip_without_pager(void) {
    advm_pager *probe = advm_pager_new((size_t)sysconf(_SC_PAGESIZE), NULL);
    if (probe == NULL && errno == ENOSYS) {
        printf("skipped: the pager needs userfaultfd with UFFDIO_MOVE\n");
        exit(0);
    }
    CHECK(probe != NULL);
    advm_pager_destroy(probe);
}

/* True when all n bytes at p are v. */
static inline int all(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

#endif
