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

#include <stddef.h>

/// How a command run by upload_run_isolated ended.
typedef struct {
    /// Its wait status (waitpid), valid when `started`.
    int status;
    /// Whether it started at all; when not, `error` is the errno.
    int started;
    int error;
    /// Whether it outlived its time and was signalled (TERM, then KILL after the grace).
    int timed_out;
    /// Bytes of its output kept in the caller's buffer, and all it wrote.
    size_t output_length;
    size_t output_total;
} upload_run_result;

/// Runs `/bin/sh -c command` to its end, isolated from the caller: in a session and process group of its own, no
/// signal blocked and every disposition at its default, only descriptors 0 to 2 open (standard input a pipe that gets
/// `input` and is then closed, standard output and error one pipe whose first `output_capacity` bytes are kept in
/// `output`), environment `envp`. After `timeout_ms` (0: none) its process group gets SIGTERM, and SIGKILL `grace_ms`
/// later. It is over when its first process exits, not when its output ends (a background job holding the pipe does
/// not hold the caller); whatever it leaves in its process group is killed then. Blocks the calling thread; SIGPIPE
/// is not raised in the caller.
upload_run_result upload_run_isolated(
    const char *command, char *const envp[], const void *input, size_t input_length, int timeout_ms, int grace_ms, char *output,
    size_t output_capacity);

#endif
