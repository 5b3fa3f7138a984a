/* The test programs' reading of their own resident memory (/proc/self/statm), in KiB;
 * -1 when it cannot be read. */
#ifndef ADVM_TEST_RSS_H
#define ADVM_TEST_RSS_H
#include <stdio.h>
#include <unistd.h>

static long rss_kib(void) {
    long size = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &size, &res) != 2) return -1;
    fclose(f);
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}
#endif
