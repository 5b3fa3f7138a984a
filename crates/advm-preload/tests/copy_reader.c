/* A copy never makes its source unreadable or wrong (run by tests/c_programs.rs).
 * Thread A copies a freshly written 1 MiB block into another (memcpy between two
 * malloc'd blocks: a virtual copy in vcopy mode, whose source is anonymous each round, or
 * copied-on-write pages of an earlier copy every other round) while thread B only reads
 * the source, one word per page round and round, then whole. Legal C: B never writes.
 * Exits 0 when B saw the source's bytes at every read and the copies are right. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SZ (1u << 20)
#define PS 4096u

static unsigned char *volatile src;
static atomic_uint round_no; /* odd: B may read src, whose pattern is round_no / 2 */
static atomic_int reader_idle = 1, stop;
static atomic_ulong bad;

static unsigned char pat(size_t i, unsigned r) { return (unsigned char)(i * 7 + r * 13 + i / PS); }

static void *reader(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        unsigned r = atomic_load(&round_no);
        if (!(r & 1)) {
            atomic_store(&reader_idle, 1);
            continue;
        }
        atomic_store(&reader_idle, 0);
        if (atomic_load(&round_no) != r) continue;
        const volatile unsigned char *s = src;
        for (int pass = 0; pass < 64 && atomic_load(&round_no) == r; pass++)
            for (size_t i = (size_t)pass * 8; i < SZ; i += PS)
                if (s[i] != pat(i, r / 2)) atomic_fetch_add(&bad, 1);
        for (size_t i = 0; i < SZ && atomic_load(&round_no) == r; i++)
            if (s[i] != pat(i, r / 2)) atomic_fetch_add(&bad, 1);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    pthread_t t;
    if (pthread_create(&t, NULL, reader, NULL) != 0) return 2;
    unsigned char *keep = NULL;
    for (int k = 0; k < rounds; k++) {
        unsigned r = (unsigned)k;
        unsigned char *s;
        if (k % 2 == 1 && keep) {
            s = keep; /* a destination of the last round: private memfd pages, now written */
            keep = NULL;
        } else {
            s = malloc(SZ);
        }
        unsigned char *d = malloc(SZ);
        if (!s || !d) return 2;
        for (size_t i = 0; i < SZ; i++) s[i] = pat(i, r);
        memset(d, 0xee, SZ);
        src = s;
        atomic_store(&reader_idle, 0);
        atomic_store(&round_no, 2 * r + 1);
        /* give the reader a moment to start reading before the copy */
        for (volatile int spin = 0; spin < 20000; spin++) {
        }
        memcpy(d, s, SZ);
        for (volatile int spin = 0; spin < 20000; spin++) {
        }
        atomic_store(&round_no, 2 * r + 2);
        while (!atomic_load(&reader_idle)) {
        }
        for (size_t i = 0; i < SZ; i++)
            if (d[i] != pat(i, r) || s[i] != pat(i, r)) {
                fprintf(stderr, "round %d: wrong copy at byte %zu\n", k, i);
                return 1;
            }
        free(s);
        if (keep) free(keep);
        keep = d;
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    free(keep);
    if (atomic_load(&bad)) {
        fprintf(stderr, "the reader saw %lu wrong bytes in the source\n", atomic_load(&bad));
        return 1;
    }
    printf("copy_reader: ok\n");
    return 0;
}
