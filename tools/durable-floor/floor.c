// The kernel's floor for storing N files of SIZE bytes (tools/durable-floor/run.sh): create, write, close, rename into
// place; mode 0 syncs nothing (as rsync and nginx), mode 1 fdatasyncs each file and fsyncs the directory per 256
// (durable before each answer, as the relay), mode 2 calls syncfs once per 256 files instead.
// Usage: floor N MODE DIR [SIZE]   (SIZE default 16384, at most 1 MiB)
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    static char buf[1 << 20];
    size_t size = argc > 4 ? (size_t)atoi(argv[4]) : 16384;
    if (argc < 4 || size > sizeof buf) { fprintf(stderr, "usage: floor N MODE DIR [SIZE <= 1048576]\n"); return 2; }
    int n = atoi(argv[1]), mode = atoi(argv[2]); const char *dir = argv[3];
    char staging[512], store[512], a[600], b[600];
    memset(buf, 7, size);
    snprintf(staging, sizeof staging, "%s/staging", dir); snprintf(store, sizeof store, "%s/store", dir);
    mkdir(staging, 0755); mkdir(store, 0755);
    struct timespec t0, t1; clock_gettime(CLOCK_MONOTONIC, &t0);
    int dfd = open(store, O_RDONLY | O_DIRECTORY);
    for (int i = 0; i < n; i++) {
        snprintf(a, sizeof a, "%s/%d.tmp", staging, i); snprintf(b, sizeof b, "%s/IMG_%06d.jpg", store, i);
        int fd = open(a, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (write(fd, buf, size) != (ssize_t)size) return 1;
        if (mode == 1) fdatasync(fd);
        close(fd); rename(a, b);
        if (mode == 1 && (i % 256 == 255 || i == n - 1)) fsync(dfd);
        if (mode == 2 && (i % 256 == 255 || i == n - 1)) syncfs(dfd);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("mode %d: %d files of %zu B in %.3f s = %.0f files/s, %.0f MB/s\n", mode, n, size, s, n / s, n * (double)size / s / 1e6);
    return 0;
}
