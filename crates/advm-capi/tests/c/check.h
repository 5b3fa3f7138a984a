/* What the C API's test programs share: CHECK (names the file, the line and the
 * condition, and ends the program with status 1) and small byte checks. */
#ifndef ADVM_TEST_CHECK_H
#define ADVM_TEST_CHECK_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(c)                                                                   \
    do {                                                                           \
        if (!(c)) {                                                                \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

/* True when all n bytes at p are v. */
static inline int all(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

#endif
