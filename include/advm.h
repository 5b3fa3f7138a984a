/* advm: application-directed virtual memory — C API.
 *
 * Link with -ladvm (libadvm.so or libadvm.a from `cargo build -p advm-capi`).
 * Functions returning int return 0 on success or a negative errno.
 */
#ifndef ADVM_H
#define ADVM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library version, a static string. */
const char *advm_version(void);

#ifdef __cplusplus
}
#endif

#endif /* ADVM_H */
