/* How a new block starts (run by tests/c_programs.rs): allocates and writes a 1 MiB
 * block, then prints how many of the process's mappings are the shim's memfd
 * ("advm-arena"): none when new blocks start anonymous, at least one when they start
 * on memfd pages (ADVM_VCOPY_FRESH=memfd). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    unsigned char *p = malloc(1 << 20);
    if (!p) return 3;
    memset(p, 1, 1 << 20);
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 4;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "memfd:advm-arena")) n++;
    fclose(f);
    printf("%d\n", n);
    return p[12345] == 1 ? 0 : 5;
}
