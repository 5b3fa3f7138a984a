/* The pager as a browser's image cache uses purgeable memory: decoded images are
 * unlocked while off screen, memory pressure (a flush) drops them, lock says whether
 * an image survived (0: its pages read as zeros, decode again; 1: intact). Also:
 * ranges that are not one region's pages, many pagers at once destroyed with pages
 * evicted, threads sharing a pager under a budget smaller than their data, and a
 * swap file on a full filesystem (root only: a 64 KiB tmpfs in a private mount
 * namespace): flush says ENOSPC and every page reads back; a swap file name that is
 * not UTF-8. */
#define _GNU_SOURCE
#include <advm.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static size_t ps;

static void image_cache(void) {
    enum { IMAGES = 24, PAGES = 8 };
    advm_pager *p = advm_pager_new(256 * ps, NULL); /* room for every image */
    CHECK(p != NULL);
    unsigned char *img[IMAGES];
    for (int i = 0; i < IMAGES; i++) {
        img[i] = advm_pager_map(p, PAGES * ps);
        CHECK(img[i] != NULL);
        memset(img[i], i + 1, PAGES * ps); /* decode */
        CHECK(advm_pager_unlock(p, img[i], PAGES * ps) == 0); /* off screen */
    }
    /* nothing dropped yet: every image locks intact */
    for (int i = 0; i < IMAGES; i++) {
        CHECK(advm_pager_lock(p, img[i], PAGES * ps) == 1 && all(img[i], PAGES * ps, (unsigned char)(i + 1)));
        CHECK(advm_pager_unlock(p, img[i], PAGES * ps) == 0);
    }
    /* pressure on the even images (one page of them is enough to lose the image) */
    for (int i = 0; i < IMAGES; i += 2) CHECK(advm_pager_flush(p, img[i] + 3 * ps, ps) == 1);
    struct advm_pager_stats st;
    CHECK(advm_pager_stats(p, &st) == 0);
    uint64_t written = st.written_pages;
    for (int i = 0; i < IMAGES; i++) {
        int l = advm_pager_lock(p, img[i], PAGES * ps);
        if (i % 2 == 0) {
            CHECK(l == 0 && all(img[i] + 3 * ps, ps, 0)); /* dropped, never written */
            memset(img[i], i + 1, PAGES * ps);              /* decoded again */
        } else {
            CHECK(l == 1 && all(img[i], PAGES * ps, (unsigned char)(i + 1)));
        }
    }
    /* locked images are needed: a flush writes them out and they read back */
    CHECK(advm_pager_flush(p, img[0], PAGES * ps) >= 0);
    CHECK(all(img[0], PAGES * ps, 1));
    CHECK(advm_pager_stats(p, &st) == 0);
    CHECK(st.discarded_pages >= IMAGES / 2 && st.written_pages > written);

    /* ranges that are not one region's whole pages */
    CHECK(advm_pager_lock(p, img[0], 0) == -EINVAL);
    CHECK(advm_pager_unlock(p, img[0] + 1, ps) == -EINVAL);
    CHECK(advm_pager_flush(p, img[0], PAGES * ps + 1) == -EINVAL);
    CHECK(advm_pager_discardable(p, (void *)(uintptr_t)-ps, 2 * ps) == -EINVAL); /* wraps */
    CHECK(advm_pager_needed(p, img[0], SIZE_MAX) == -EINVAL);
    CHECK(advm_pager_lock(NULL, img[0], ps) == -EINVAL);
    errno = 0;
    CHECK(advm_pager_map(p, 0) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(advm_pager_map(p, SIZE_MAX) == NULL && errno == ENOMEM);
    advm_pager_destroy(p);
}

/* More decoded images than the budget holds: the unlocked ones make the room,
 * dropped (never written); the oldest lock as lost, the newest intact. */
static void image_cache_under_budget(void) {
    enum { IMAGES = 24, PAGES = 8 };
    advm_pager *p = advm_pager_new(64 * ps, NULL);
    CHECK(p != NULL);
    unsigned char *img[IMAGES];
    for (int i = 0; i < IMAGES; i++) {
        img[i] = advm_pager_map(p, PAGES * ps);
        CHECK(img[i] != NULL);
        memset(img[i], i + 1, PAGES * ps);
        CHECK(advm_pager_unlock(p, img[i], PAGES * ps) == 0);
    }
    struct advm_pager_stats st;
    CHECK(advm_pager_stats(p, &st) == 0);
    CHECK(st.written_pages == 0 && st.discarded_pages >= (IMAGES * PAGES) - 64 && st.resident_pages <= 64);
    CHECK(advm_pager_lock(p, img[0], PAGES * ps) == 0 && all(img[0], PAGES * ps, 0));
    CHECK(advm_pager_lock(p, img[IMAGES - 1], PAGES * ps) == 1);
    CHECK(all(img[IMAGES - 1], PAGES * ps, IMAGES));
    advm_pager_destroy(p);
}

static void many_pagers(void) {
    enum { N = 32 };
    advm_pager *p[N];
    unsigned char *m[N];
    for (int i = 0; i < N; i++) {
        p[i] = advm_pager_new(4 * ps, NULL);
        CHECK(p[i] != NULL);
        m[i] = advm_pager_map(p[i], 16 * ps);
        CHECK(m[i] != NULL);
        memset(m[i], i + 1, 16 * ps); /* 12 pages of each evicted */
    }
    for (int i = 0; i < N; i++) CHECK(all(m[i], 16 * ps, (unsigned char)(i + 1)));
    for (int i = 0; i < N; i++) advm_pager_destroy(p[i]);
}

static advm_pager *shared;

static void *worker(void *arg) {
    unsigned char v = (unsigned char)(uintptr_t)arg;
    unsigned char *m = advm_pager_map(shared, 32 * ps);
    CHECK(m != NULL);
    for (int round = 0; round < 20; round++) {
        memset(m, v + round, 32 * ps);
        CHECK(advm_pager_unlock(shared, m + 16 * ps, 16 * ps) == 0);
        CHECK(advm_pager_flush(shared, m + 16 * ps, 4 * ps) >= 0);
        CHECK(all(m, 16 * ps, (unsigned char)(v + round))); /* needed: intact */
        int l = advm_pager_lock(shared, m + 16 * ps, 16 * ps);
        CHECK(l == 0 && all(m + 16 * ps, 4 * ps, 0));
    }
    return NULL;
}

static void threads(void) {
    shared = advm_pager_new(48 * ps, NULL); /* four threads of 32 pages each */
    CHECK(shared != NULL);
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++) CHECK(pthread_create(&t[i], NULL, worker, (void *)(i * 40)) == 0);
    for (int i = 0; i < 4; i++) CHECK(pthread_join(t[i], NULL) == 0);
    struct advm_pager_stats st;
    CHECK(advm_pager_stats(shared, &st) == 0 && st.resident_pages <= 48);
    advm_pager_destroy(shared);
}

/* A swap file name that is not UTF-8 names that file, byte for byte (it was read
 * lossily: the file got U+FFFD in its name). */
static void swap_path_bytes(void) {
    char dir[] = "/tmp/advm-pager-name-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[64];
    snprintf(path, sizeof path, "%s/swap-\xff\xfe", dir);
    advm_pager *p = advm_pager_new(4 * ps, path);
    CHECK(p != NULL);
    unsigned char *m = advm_pager_map(p, 16 * ps);
    CHECK(m != NULL);
    memset(m, 9, 16 * ps);
    CHECK(all(m, 16 * ps, 9));
    struct stat st;
    CHECK(stat(path, &st) == 0); /* named byte for byte */
    advm_pager_destroy(p);
    CHECK(stat(path, &st) != 0 && errno == ENOENT); /* and removed with its pager */
    CHECK(rmdir(dir) == 0);
}

static void full_filesystem(void) {
    if (geteuid() != 0 || unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
        printf("full filesystem: skipped (needs root for a private tmpfs)\n");
        return;
    }
    char dir[] = "/tmp/advm-pager-full-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK(mount("tmpfs", dir, "tmpfs", 0, "size=64k") == 0);
    advm_pager *p = advm_pager_new(4 * ps, dir); /* a directory: a temporary file there */
    CHECK(p != NULL);
    unsigned char *m = advm_pager_map(p, 64 * ps);
    CHECK(m != NULL);
    for (int i = 0; i < 64; i++) memset(m + i * ps, i + 1, ps); /* 16 pages fit the file */
    int r = advm_pager_flush(p, m, 64 * ps);
    printf("full filesystem: flush %d (%s)\n", r, r < 0 ? strerror(-r) : "");
    CHECK(r == -ENOSPC);
    for (int i = 0; i < 64; i++) CHECK(all(m + i * ps, ps, (unsigned char)(i + 1)));
    advm_pager_destroy(p);
    CHECK(umount(dir) == 0 && rmdir(dir) == 0);
}

int main(void) {
    ps = (size_t)sysconf(_SC_PAGESIZE);
    skip_without_pager();
    image_cache();
    image_cache_under_budget();
    many_pagers();
    threads();
    swap_path_bytes();
    full_filesystem();
    printf("pager_cache: ok\n");
    return 0;
}
