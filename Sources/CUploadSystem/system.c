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
