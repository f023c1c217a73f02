#!/usr/bin/env bash
# The disk's floor for issue 9's small-file and 1 MiB-file workloads (a program, not a test): what storing the same
# files costs in C with no network, no TLS, no checksums and no catalog, in three ways:
#   mode 0  create, write, close, rename: no sync at all (what rsync and nginx do)
#   mode 1  the same with an fdatasync per file and a directory fsync per 256 (durable before each answer: ours)
#   mode 2  the same with one syncfs per 256 files instead (group commit's best case)
# Usage: tools/durable-floor/run.sh [RUNS]   (default 2; each run: 10,000 x 16 KiB, then 1,000 x 1 MiB, all modes)
# Works in a temporary directory under TMPDIR (put it on the relay's file system), removed at exit.
set -euo pipefail
runs=${1:-2}
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d "${TMPDIR:-/tmp}/durable-floor.XXXXXX")
trap 'rm -rf -- "$dir"' EXIT
gcc -O2 -Wall -o "$dir/floor" "$here/floor.c"
for ((run = 1; run <= runs; run++)); do
    for workload in "10000 16384" "1000 1048576"; do
        read -r files size <<<"$workload"
        for mode in 0 1 2; do
            rm -rf "$dir/d" && mkdir "$dir/d"
            "$dir/floor" "$files" "$mode" "$dir/d" "$size"
        done
    done
done
