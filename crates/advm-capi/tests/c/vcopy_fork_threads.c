/* Fork while another thread keeps calling into the arena: the child must never find
 * the arena's lock held by a thread that does not exist in it. Two threads loop on
 * advm_vcopy_get_stats while the main thread forks up to 500 times; each child calls
 * advm_dup and exits. A child still running after 5 s is a deadlock: killed, and the test
 * fails. */
#include <advm.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static atomic_int stop;

static void *stats_loop(void *arg) {
    (void)arg;
    struct advm_vcopy_stats st;
    while (!atomic_load(&stop)) CHECK(advm_vcopy_get_stats(&st) == 0);
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = 4 * ps;
    unsigned char *src = advm_alloc(len); /* the arena exists before the thread starts */
    CHECK(src != NULL);
    memset(src, 0x3c, len);
    pthread_t t[2];
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&t[i], NULL, stats_loop, NULL) == 0);
    int forks = 0, hung = 0, failed = 0;
    while (forks < 500 && !hung) {
        forks++;
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            unsigned char *c = advm_dup(src, len);
            _exit(c != NULL && c[len - 1] == 0x3c ? 0 : 1);
        }
        int status = 0;
        double deadline = now() + 5.0;
        pid_t r;
        while ((r = waitpid(pid, &status, WNOHANG)) == 0 && now() < deadline) usleep(1000);
        if (r == 0) {
            kill(pid, SIGKILL);
            CHECK(waitpid(pid, &status, 0) == pid);
            hung++;
        } else {
            CHECK(r == pid);
            failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++) CHECK(pthread_join(t[i], NULL) == 0);
    printf("vcopy_fork_threads: %d forks, %d children hung, %d failed\n", forks, hung, failed);
    CHECK(hung == 0 && failed == 0);
    advm_free(src);
    return 0;
}
