#ifndef C_UPLOAD_DEFLATE_SHIM_H
#define C_UPLOAD_DEFLATE_SHIM_H
#include <libdeflate.h>
#endif
