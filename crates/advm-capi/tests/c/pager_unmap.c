/* advm_pager_unmap: a region given back is gone (its memory unmapped, its resident
 * pages out of the statistics), the other regions keep their bytes (resident or
 * written out), and the pager goes on mapping. In both fault modes; in SIGBUS mode
 * with more regions than its old route table held (1024). Its memory is gone when
 * the call returns, so the program may map memory of its own there at once. */
#define _GNU_SOURCE
#include <advm.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

/* Whether [p, p+len) is unmapped (mincore: ENOMEM). */
static int gone(void *p, size_t len) {
    unsigned char vec[64];
    return mincore(p, len, vec) == -1 && errno == ENOMEM;
}

static uint64_t resident(advm_pager *p) {
    struct advm_pager_stats st;
    CHECK(advm_pager_stats(p, &st) == 0);
    return st.resident_pages;
}

/* A pager of a 64-page budget in fault mode `mode`. */
static advm_pager *pager_in(int mode) {
    struct advm_pager_options o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.budget_bytes = 64 * (size_t)sysconf(_SC_PAGESIZE);
    o.fault_mode = mode;
    advm_pager *p = advm_pager_new_with(&o);
    CHECK(p != NULL && advm_pager_fault_mode(p) == mode);
    return p;
}

static void run(int mode, size_t many) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    advm_pager *p = pager_in(mode);

    /* three regions of 4 pages, all resident */
    unsigned char *r[3];
    for (int i = 0; i < 3; i++) {
        r[i] = advm_pager_map(p, 4 * ps);
        CHECK(r[i] != NULL);
        memset(r[i], i + 1, 4 * ps);
    }
    CHECK(resident(p) == 12);
    CHECK(advm_pager_unmap(p, r[1], 4 * ps) == 0);
    CHECK(resident(p) == 8 && gone(r[1], 4 * ps));
    CHECK(all(r[0], 4 * ps, 1) && all(r[2], 4 * ps, 3));
    /* a region written out: unmapped with nothing resident, the other still reads back */
    CHECK(advm_pager_flush(p, r[0], 4 * ps) == 4);
    CHECK(advm_pager_flush(p, r[2], 4 * ps) == 4);
    CHECK(resident(p) == 0);
    CHECK(advm_pager_unmap(p, r[0], 4 * ps) == 0);
    CHECK(resident(p) == 0 && gone(r[0], 4 * ps));
    CHECK(all(r[2], 4 * ps, 3));
    CHECK(resident(p) == 4);

    /* many one-page regions mapped, touched, and unmapped every other one */
    unsigned char **m = calloc(many, sizeof *m);
    CHECK(m != NULL);
    for (size_t i = 0; i < many; i++) {
        m[i] = advm_pager_map(p, ps);
        CHECK(m[i] != NULL);
        memcpy(m[i], &i, sizeof i);
    }
    for (size_t i = 0; i < many; i += 2) CHECK(advm_pager_unmap(p, m[i], ps) == 0);
    for (size_t i = 1; i < many; i += 2) {
        size_t v;
        memcpy(&v, m[i], sizeof v);
        CHECK(v == i);
    }
    for (size_t i = 0; i < many; i += 2) CHECK(gone(m[i], ps));
    for (size_t i = 1; i < many; i += 2) CHECK(advm_pager_unmap(p, m[i], ps) == 0);
    CHECK(advm_pager_unmap(p, r[2], 4 * ps) == 0);
    CHECK(resident(p) == 0);
    free(m);
    advm_pager_destroy(p);
    printf("pager_unmap (%s): 3 regions and %zu one-page regions unmapped, the rest intact\n",
           mode == ADVM_PAGER_FAULTS_SIGBUS ? "SIGBUS mode" : "handler thread", many);
}

/* A region just touched is unmapped when advm_pager_unmap returns, and memory the
 * program then maps at its address with MAP_FIXED stays its own. (Before, the handler
 * thread still held the region after serving the touch, and its memory was unmapped
 * when that thread let go: in 40% of the rounds it was still mapped on return, and the
 * program's mapping made there was unmapped under it.) */
static void gone_on_return(int mode) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    advm_pager *p = pager_in(mode);
    for (int i = 0; i < 100; i++) {
        unsigned char *r = advm_pager_map(p, ps);
        CHECK(r != NULL);
        r[0] = 1;
        CHECK(advm_pager_unmap(p, r, ps) == 0);
        CHECK(gone(r, ps));
        unsigned char *own = mmap(r, ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        CHECK(own == r);
        memset(own, 0x5a, ps);
        if (i % 10 == 0) usleep(2000); /* time for a late unmap to strike */
        CHECK(!gone(own, ps) && all(own, ps, 0x5a));
        CHECK(munmap(own, ps) == 0);
    }
    advm_pager_destroy(p);
    printf("pager_unmap (%s): 100 touched regions gone on return, their addresses reused\n",
           mode == ADVM_PAGER_FAULTS_SIGBUS ? "SIGBUS mode" : "handler thread");
}

int main(void) {
    skip_without_pager();
    gone_on_return(ADVM_PAGER_FAULTS_THREAD);
    run(ADVM_PAGER_FAULTS_THREAD, 500);
    struct advm_pager_options o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.budget_bytes = (size_t)sysconf(_SC_PAGESIZE);
    o.fault_mode = ADVM_PAGER_FAULTS_SIGBUS;
    advm_pager *probe = advm_pager_new_with(&o);
    if (probe == NULL && errno == ENOSYS) {
        printf("pager_unmap: SIGBUS mode skipped: not offered here\n");
        return 0;
    }
    CHECK(probe != NULL);
    advm_pager_destroy(probe);
    gone_on_return(ADVM_PAGER_FAULTS_SIGBUS);
    run(ADVM_PAGER_FAULTS_SIGBUS, 2500);
    return 0;
}
