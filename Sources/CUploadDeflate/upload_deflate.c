#include "upload_deflate.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

// libdeflate's functions, declared as its libdeflate.h (1.x, a stable ABI under the soname libdeflate.so.0) declares
// them, so that a build needs only zlib's headers.
struct libdeflate;
static struct {
    uint32_t (*crc32)(uint32_t, const void *, size_t);
    struct libdeflate *(*alloc_compressor)(int);
    size_t (*zlib_compress)(struct libdeflate *, const void *, size_t, void *, size_t);
    size_t (*zlib_compress_bound)(struct libdeflate *, size_t);
    void (*free_compressor)(struct libdeflate *);
    struct libdeflate *(*alloc_decompressor)(void);
    int (*zlib_decompress_ex)(struct libdeflate *, const void *, size_t, void *, size_t, size_t *, size_t *);
    void (*free_decompressor)(struct libdeflate *);
} fast;
static int have_fast = 0;
static pthread_once_t chosen = PTHREAD_ONCE_INIT;

static void choose(void) {
    const char *wanted = getenv("UPLOAD_DEFLATE_LIBRARY");
    if (wanted != NULL && strcmp(wanted, "zlib") == 0) return;
    void *library = dlopen("libdeflate.so.0", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) return;
    *(void **)&fast.crc32 = dlsym(library, "libdeflate_crc32");
    *(void **)&fast.alloc_compressor = dlsym(library, "libdeflate_alloc_compressor");
    *(void **)&fast.zlib_compress = dlsym(library, "libdeflate_zlib_compress");
    *(void **)&fast.zlib_compress_bound = dlsym(library, "libdeflate_zlib_compress_bound");
    *(void **)&fast.free_compressor = dlsym(library, "libdeflate_free_compressor");
    *(void **)&fast.alloc_decompressor = dlsym(library, "libdeflate_alloc_decompressor");
    *(void **)&fast.zlib_decompress_ex = dlsym(library, "libdeflate_zlib_decompress_ex");
    *(void **)&fast.free_decompressor = dlsym(library, "libdeflate_free_decompressor");
    have_fast = fast.crc32 && fast.alloc_compressor && fast.zlib_compress && fast.zlib_compress_bound
        && fast.free_compressor && fast.alloc_decompressor && fast.zlib_decompress_ex && fast.free_decompressor;
    if (!have_fast) dlclose(library);
}

static int use_fast(void) {
    pthread_once(&chosen, choose);
    return have_fast;
}

const char *upload_deflate_library(void) { return use_fast() ? "libdeflate" : "zlib"; }

uint32_t upload_crc32(uint32_t crc, const void *bytes, size_t length) {
    if (use_fast()) return fast.crc32(crc, bytes, length);
    return (uint32_t)crc32_z(crc, bytes, length);
}

size_t upload_zlib_compress_bound(size_t length) {
    if (use_fast()) return fast.zlib_compress_bound(NULL, length);
    return (size_t)compressBound((uLong)length);
}

size_t upload_zlib_compress(int level, const void *input, size_t length, void *output, size_t capacity) {
    if (use_fast()) {
        struct libdeflate *compressor = fast.alloc_compressor(level);
        if (compressor == NULL) return 0;
        size_t written = fast.zlib_compress(compressor, input, length, output, capacity);
        fast.free_compressor(compressor);
        return written;
    }
    uLongf written = (uLongf)capacity;
    if (compress2(output, &written, input, (uLong)length, level) != Z_OK) return 0;
    return (size_t)written;
}

upload_inflate_status upload_zlib_inflate(
    const void *input, size_t length, void *output, size_t capacity, size_t *consumed, size_t *produced) {
    *consumed = 0;
    *produced = 0;
    if (use_fast()) {
        struct libdeflate *decompressor = fast.alloc_decompressor();
        if (decompressor == NULL) return UPLOAD_INFLATE_NO_MEMORY;
        int status = fast.zlib_decompress_ex(decompressor, input, length, output, capacity, consumed, produced);
        fast.free_decompressor(decompressor);
        switch (status) {
        case 0: return UPLOAD_INFLATE_SUCCESS;
        case 3: return UPLOAD_INFLATE_INSUFFICIENT_SPACE;
        default: return UPLOAD_INFLATE_BAD_DATA;
        }
    }
    // A chunk's payload is at most the frame limit (far below 4 GiB): zlib's uInt counts hold it whole.
    if (length > UINT_MAX || capacity > UINT_MAX) return UPLOAD_INFLATE_BAD_DATA;
    z_stream stream;
    memset(&stream, 0, sizeof stream);
    if (inflateInit(&stream) != Z_OK) return UPLOAD_INFLATE_NO_MEMORY;
    stream.next_in = (Bytef *)input;
    stream.avail_in = (uInt)length;
    stream.next_out = output;
    stream.avail_out = (uInt)capacity;
    int status = inflate(&stream, Z_FINISH);
    upload_inflate_status result;
    if (status == Z_STREAM_END) {
        result = UPLOAD_INFLATE_SUCCESS;
    } else if (status == Z_MEM_ERROR) {
        result = UPLOAD_INFLATE_NO_MEMORY;
    } else if (stream.avail_out == 0 && status != Z_DATA_ERROR && status != Z_NEED_DICT) {
        // The output is full before the stream ended: more output is waiting (too small), or the input stopped (cut).
        unsigned char more;
        stream.next_out = &more;
        stream.avail_out = 1;
        int next = inflate(&stream, Z_FINISH);
        if (stream.avail_out == 0) {
            result = UPLOAD_INFLATE_INSUFFICIENT_SPACE;
        } else {
            result = next == Z_STREAM_END ? UPLOAD_INFLATE_SUCCESS : UPLOAD_INFLATE_BAD_DATA;
        }
    } else {
        result = UPLOAD_INFLATE_BAD_DATA;
    }
    *consumed = length - stream.avail_in;
    *produced = stream.total_out > capacity ? capacity : (size_t)stream.total_out;
    inflateEnd(&stream);
    return result;
}
