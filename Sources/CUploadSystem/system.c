#define _GNU_SOURCE
#include <fcntl.h>
#include "CUploadSystem.h"

int upload_o_direct_flag(void) {
#ifdef O_DIRECT
    return O_DIRECT;
#else
    return 0;
#endif
}

#if defined(__GLIBC__)
#include <malloc.h>
#endif

int upload_set_malloc_thresholds(int mmap_bytes, int trim_bytes, int arenas) {
#if defined(__GLIBC__)
    return mallopt(M_MMAP_THRESHOLD, mmap_bytes) && (trim_bytes <= 0 || mallopt(M_TRIM_THRESHOLD, trim_bytes))
        && (arenas <= 0 || mallopt(M_ARENA_MAX, arenas));
#else
    (void)mmap_bytes;
    (void)trim_bytes;
    (void)arenas;
    return 0;
#endif
}

// The commit a release is built from: tools/package writes build_commit.h (git-ignored) for its build, so that only this
// file is compiled again, not every C target as a -D flag would.
#if __has_include("build_commit.h")
#include "build_commit.h"
#endif
#ifndef UPLOAD_BUILD_COMMIT
#define UPLOAD_BUILD_COMMIT "unknown"
#endif

const char *upload_build_commit(void) {
    return UPLOAD_BUILD_COMMIT;
}
