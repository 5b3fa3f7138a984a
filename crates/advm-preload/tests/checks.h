/* CHECK for the shim's C test programs: a failed check prints its line and a message
 * and exits 1 (the Rust runner shows the output). */
#include <stdio.h>
#include <stdlib.h>

#define CHECK(c, ...)                                                                                                  \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            printf("FAIL line %d: ", __LINE__);                                                                      \
            printf(__VA_ARGS__);                                                                                       \
            printf("\n");                                                                                              \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)
