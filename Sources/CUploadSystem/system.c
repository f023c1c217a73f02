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

int upload_set_mmap_threshold(int bytes) {
#if defined(__GLIBC__)
    return mallopt(M_MMAP_THRESHOLD, bytes);
#else
    (void)bytes;
    return 0;
#endif
}
