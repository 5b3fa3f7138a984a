/* Every failing call leaves its error in errno as well as in its return value, so C
 * code that checks errno (the usual habit) sees the reason. */
#include <advm.h>
#include <advm_gc.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

static int failures;

static void expect(const char *what, int r, int want) {
    int e = errno;
    if (r != -want || e != want) {
        fprintf(stderr, "%s: returned %d, errno %d (%s); want -%d and errno %d\n", what, r, e, strerror(e), want, want);
        failures++;
    } else {
        printf("%s: -%s, errno set\n", what, strerror(want));
    }
}

int main(void) {
    advm_gc *gc = advm_gc_new(1 << 20);
    if (!gc) return perror("advm_gc_new"), 1;
    errno = 0;
    expect("advm_gc_set_engine(\"bogus\")", advm_gc_set_engine(gc, "bogus"), EINVAL);
    errno = 0;
    expect("advm_gc_stats(NULL out)", advm_gc_stats(gc, NULL), EINVAL);
    advm_gc_destroy(gc);
    errno = 0;
    expect("advm_gc_collect(NULL)", advm_gc_collect(NULL, 1), EINVAL);
    errno = 0;
    expect("advm_batch_run(NULL)", advm_batch_run(NULL, NULL), EINVAL);
    errno = 0;
    expect("advm_vcopy_get_stats(NULL)", advm_vcopy_get_stats(NULL), EINVAL);
    errno = 0;
    expect("advm_pager_stats(NULL)", advm_pager_stats(NULL, NULL), EINVAL);
    advm_pager *p = advm_pager_new(1 << 20, NULL);
    if (!p) return perror("advm_pager_new"), 1;
    char *m = advm_pager_map(p, 1 << 20);
    if (!m) return perror("advm_pager_map"), 1;
    errno = 0;
    expect("advm_pager_discardable(unaligned)", advm_pager_discardable(p, m + 1, 4096), EINVAL);
    advm_pager_destroy(p);
    return failures != 0;
}
