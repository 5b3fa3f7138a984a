/* The header compiles as C, links against libadvm, and the version is a string. */
#include <advm.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    const char *v = advm_version();
    if (v == NULL || strlen(v) == 0) {
        fprintf(stderr, "advm_version returned nothing\n");
        return 1;
    }
    printf("advm %s\n", v);
    return 0;
}
