#ifndef C_UPLOAD_SYSTEM_H
#define C_UPLOAD_SYSTEM_H

/// The open(2) flag for direct I/O (O_DIRECT), or 0 where the system has none.
/// Its value differs between architectures and Swift's Glibc module does not export it.
int upload_o_direct_flag(void);

/// Allocations of at least `mmap_bytes` get mappings of their own, unmapped when freed (mallopt M_MMAP_THRESHOLD), and,
/// with `trim_bytes` above 0, the top of a malloc arena is given back to the system once that much of it is free
/// (M_TRIM_THRESHOLD): fixed, instead of glibc's thresholds that move with the blocks freed. With `arenas` above 0, the
/// threads share at most that many arenas (M_ARENA_MAX) instead of up to eight per core, each keeping its own free
/// memory. Returns 0 where they cannot be set.
int upload_set_malloc_thresholds(int mmap_bytes, int trim_bytes, int arenas);

/// The commit the binary was built from (tools/package sets it), or "unknown" for a build from a work tree.
const char *upload_build_commit(void);

#endif
