/* A fault in a pager's region leaves the faulting thread's errno alone, in both fault
 * modes: code that touches paged memory between a failed call and its look at errno
 * still reads that call's errno. (In SIGBUS mode the handler serves the fault on the
 * faulting thread, and its system calls left EAGAIN there.) */
#include <advm.h>
#include <errno.h>
#include <string.h>

#include "check.h"

#define MARK 4242
#define PAGES 64

static int touched_with_errno_kept(advm_pager *p, size_t ps) {
    unsigned char *m = advm_pager_map(p, PAGES * ps);
    CHECK(m != NULL);
    int changed = 0;
    for (size_t i = 0; i < PAGES; i += 8) { /* zero fills, by whole runs of pages */
        errno = MARK;
        memset(m + i * ps, (int)(i + 1), 8 * ps);
        changed += errno != MARK;
    }
    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < PAGES; i++) { /* read-backs of pages written out */
            errno = MARK;
            ((volatile unsigned char *)m)[i * ps] = (unsigned char)(i + 1);
            changed += errno != MARK;
        }
        for (size_t i = 0; i < PAGES; i++) { /* written out by the budget, read back */
            errno = MARK;
            unsigned char v = ((volatile unsigned char *)m)[i * ps];
            changed += errno != MARK;
            CHECK(v == (unsigned char)(i + 1));
        }
        CHECK(advm_pager_flush(p, m, PAGES * ps) >= 0);
    }
    return changed;
}

int main(void) {
    skip_without_pager();
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    const int modes[] = {ADVM_PAGER_FAULTS_THREAD, ADVM_PAGER_FAULTS_SIGBUS};
    for (int k = 0; k < 2; k++) {
        for (int io = 0; io < 2; io++) {
            struct advm_pager_options o;
            memset(&o, 0, sizeof o);
            o.size = sizeof o;
            o.budget_bytes = 8 * ps;
            o.fault_mode = modes[k];
            o.swap_io = io ? ADVM_PAGER_SWAP_PAGE_CACHE : ADVM_PAGER_SWAP_DIRECT;
            advm_pager *p = advm_pager_new_with(&o);
            if (p == NULL && errno == ENOSYS && modes[k] == ADVM_PAGER_FAULTS_SIGBUS) {
                printf("SIGBUS mode not offered here\n");
                break;
            }
            CHECK(p != NULL);
            int changed = 0;
            for (int r = 0; r < 8; r++) changed += touched_with_errno_kept(p, ps);
            printf("%s mode, %s swap: errno changed by %d of %d touches\n", k ? "SIGBUS" : "thread",
                   io ? "page-cache" : "direct", changed, 8 * (PAGES / 8 + 4 * PAGES));
            CHECK(changed == 0);
            advm_pager_destroy(p);
        }
    }
    printf("pager_fault_errno: ok\n");
    return 0;
}
