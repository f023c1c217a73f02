#ifndef UPLOAD_DEFLATE_H
#define UPLOAD_DEFLATE_H

#include <stddef.h>
#include <stdint.h>

/// CRC-32 and zlib streams (RFC 1950) from zlib, which every build links, or from libdeflate when its shared library
/// (libdeflate.so.0) can be loaded at the first call: the same checksums and streams either way, libdeflate faster.
/// UPLOAD_DEFLATE_LIBRARY=zlib in the environment keeps zlib.

/// The outcome of upload_zlib_inflate; the values are libdeflate's.
typedef enum {
    UPLOAD_INFLATE_SUCCESS = 0,
    UPLOAD_INFLATE_BAD_DATA = 1,
    UPLOAD_INFLATE_INSUFFICIENT_SPACE = 3,
    UPLOAD_INFLATE_NO_MEMORY = 4,
} upload_inflate_status;

/// The library in use: "libdeflate" or "zlib".
const char *upload_deflate_library(void);

/// `crc` extended by `length` bytes at `bytes` (zlib's reflected CRC-32; 0 to start).
uint32_t upload_crc32(uint32_t crc, const void *bytes, size_t length);

/// The most bytes upload_zlib_compress can write for `length` input bytes.
size_t upload_zlib_compress_bound(size_t length);

/// Compresses `length` bytes into at most `capacity` bytes at `output` as one zlib stream at `level` (1-9); returns its
/// length, or 0 when it does not fit (or memory ran out).
size_t upload_zlib_compress(int level, const void *input, size_t length, void *output, size_t capacity);

/// Inflates one whole zlib stream of `length` bytes into at most `capacity` bytes, checking its Adler-32; says how many
/// input bytes the stream took and how many it produced.
upload_inflate_status upload_zlib_inflate(
    const void *input, size_t length, void *output, size_t capacity, size_t *consumed, size_t *produced);

#endif
