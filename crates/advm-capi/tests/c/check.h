/* What the C API's test programs share: CHECK (names the file, the line and the
 * condition, and ends the program with status 1) and small byte checks. */
#ifndef ADVM_TEST_CHECK_H
#define ADVM_TEST_CHECK_H

#include <dirent.h>
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

/* This process's address space, bytes (VmSize). */
static inline size_t vm_size(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kib = 0;
    CHECK(f != NULL);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %zu kB", &kib) == 1) break;
    fclose(f);
    CHECK(kib > 0);
    return kib << 10;
}

/* Of this process's threads whose name (comm, with its newline) ours() accepts: how
 * many there are (*threads) and how many of the n signals in sigs each leaves
 * unblocked, summed (SigBlk in its status: bit s-1 for signal s). */
static inline int unblocked_in_threads(int (*ours)(const char *comm), const int *sigs, int n, int *threads) {
    int open = 0;
    char path[300], line[256];
    *threads = 0;
    DIR *tasks = opendir("/proc/self/task");
    CHECK(tasks != NULL);
    struct dirent *e;
    while ((e = readdir(tasks)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        int match = fgets(line, sizeof line, f) && ours(line);
        fclose(f);
        if (!match) continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        f = fopen(path, "r");
        CHECK(f != NULL);
        unsigned long long blocked = 0;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "SigBlk: %llx", &blocked) == 1) break;
        fclose(f);
        (*threads)++;
        for (int s = 0; s < n; s++)
            if (!(blocked >> (sigs[s] - 1) & 1)) open++;
    }
    closedir(tasks);
    return open;
}

#endif
