/* A heap's GC threads block the signals a program or another process sends, as the
 * pager's thread does (pager_signals.c): such a signal is handled on one of the
 * program's threads, never on a GC thread parked between collections or working in
 * one. (They took them: a program's handler could run there, in the middle of a
 * collection its own thread was waiting for.) */
#define _GNU_SOURCE
#include <advm_gc.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

int main(void) {
    struct advm_gc_options o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.heap_bytes = 256 << 20;
    o.gc_threads = 2;
    o.large_object_bytes = 1 << 20;
    advm_gc *gc = advm_gc_new_opts(&o);
    CHECK(gc != NULL);
    void *list = NULL;
    CHECK(advm_gc_root(gc, &list) == 0);
    /* more than 64 MiB of small objects live: collections run in parallel */
    for (int i = 0; i < 36000; i++) {
        void **n = advm_gc_alloc(gc, 1, 2000);
        CHECK(n != NULL);
        n[0] = list;
        list = n;
    }
    CHECK(advm_gc_collect(gc, 1) == 0);

    int threads = 0, open = 0;
    char path[300], line[256];
    DIR *tasks = opendir("/proc/self/task");
    CHECK(tasks != NULL);
    struct dirent *e;
    while ((e = readdir(tasks)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        unsigned pool, index;
        int ours = fgets(line, sizeof line, f) && sscanf(line, "gc%uw%u", &pool, &index) == 2;
        fclose(f);
        if (!ours) continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        f = fopen(path, "r");
        CHECK(f != NULL);
        unsigned long long blocked = 0;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "SigBlk: %llx", &blocked) == 1) break;
        fclose(f);
        threads++;
        const int sent[] = {SIGALRM, SIGINT, SIGTERM, SIGCHLD, SIGUSR1};
        for (int s = 0; s < 5; s++)
            if (!(blocked >> (sent[s] - 1) & 1)) open++;
    }
    closedir(tasks);
    printf("gc_signals: %d GC threads, %d sent signals not blocked there\n", threads, open);
    CHECK(threads >= 1 && open == 0);
    advm_gc_destroy(gc);
    return 0;
}
