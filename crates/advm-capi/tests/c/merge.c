/* advm_merge: two equal buffers end up sharing the store's pages, content unchanged;
 * a write after the merge stays private; an unmapped range is refused with -EINVAL. */
#include <advm.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"

int main(void) {
    setenv("ADVM_SOCKET", "/nonexistent/advmd.sock", 1);
    size_t ps = (size_t)sysconf(_SC_PAGESIZE), n = 32 * ps;
    unsigned char *a = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *b = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(a != MAP_FAILED && b != MAP_FAILED);
    for (size_t i = 0; i < n; i++) a[i] = b[i] = (unsigned char)(i * 7 + i / ps);
    struct advm_merge_stats sa, sb;
    CHECK(advm_merge(a, n, &sa) == 0);
    CHECK(advm_merge(b, n, &sb) == 0);
    printf("a: merged %llu added %llu; b: merged %llu added %llu; via %s\n", (unsigned long long)sa.merged,
           (unsigned long long)sa.added, (unsigned long long)sb.merged, (unsigned long long)sb.added, advm_merge_via());
    CHECK(sa.added == 32 && sb.merged == 32 && sb.via_daemon == 0);
    CHECK(strstr(advm_merge_via(), "not reachable") != NULL);
    CHECK(memcmp(a, b, n) == 0);
    b[5 * ps] ^= 1;
    CHECK(a[5 * ps] == (unsigned char)(5 * ps * 7 + 5));
    /* A partial range: only its full pages are merged. */
    struct advm_merge_stats sp;
    CHECK(advm_merge(a + 1, 3 * ps, &sp) == 0 && sp.skipped == 2);
    CHECK(munmap(b, n) == 0);
    CHECK(advm_merge(b, n, NULL) == -EINVAL);
    puts("merge: ok");
    return 0;
}
