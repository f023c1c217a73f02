#ifndef C_UPLOAD_ZLIB_SHIM_H
#define C_UPLOAD_ZLIB_SHIM_H
#include <zlib.h>
#endif
