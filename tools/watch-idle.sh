#!/usr/bin/env bash
# The cost of an idle `upload-agent watch` on a large tree (issue 8's benchmark), not a test:
#   tools/watch-idle.sh [FILES] [SECONDS]     default 100000 files, 30 s of idle measured
# Makes FILES small files in 100 directories, starts a dev relay, pauses the agent's queue (so nothing uploads and
# every file stays queued in memory and in the state database), starts `watch` on the tree, waits until its scan
# queued every file, then measures its CPU time over SECONDS of idling and its peak RSS.
# Binaries: BIN_DIR (default .build/release if built there, else .build/debug). Everything lives in a temporary
# directory removed at exit, with every process started.
set -euo pipefail
files=${1:-100000}
seconds=${2:-30}
cd "$(dirname "$0")/.."
bin=${BIN_DIR:-$( [ -x .build/release/upload-agent ] && echo .build/release || echo .build/debug )}
dir=$(mktemp -d "${TMPDIR:-/tmp}/watch-idle.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; rm -rf -- "$dir"; }
trap cleanup EXIT
python3 - "$dir/tree" "$files" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, f"d{i % 100:03d}")
    if i < 100: os.makedirs(d)
    with open(os.path.join(d, f"IMG_{i:06d}.jpg"), "wb") as f: f.write(i.to_bytes(8, "little") * 16)
PY
"$bin/upload-relay" serve --dev --data "$dir/relay" --listen 127.0.0.1:0 --ready-file "$dir/ready" --log-level warning >"$dir/relay.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do [ -s "$dir/ready" ] && break; sleep 0.1; done
export UPLOAD_RELAY=$(cat "$dir/ready") UPLOAD_CA="$dir/relay/dev/ca.pem" UPLOAD_TOKEN=$(cat "$dir/relay/dev/token") XDG_STATE_HOME="$dir/state"
"$bin/upload-agent" pause >/dev/null
start=$(date +%s.%N)
"$bin/upload-agent" watch --quiet "$dir/tree" >"$dir/watch.log" 2>&1 &
watch=$!
pids+=($watch)
until [ "$("$bin/upload-agent" status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["totals"]["queued"])')" = "$files" ]; do sleep 1; done
scanned=$(echo "$(date +%s.%N) - $start" | bc)
ticks() { awk '{print $14 + $15}' "/proc/$watch/stat"; }
hz=$(getconf CLK_TCK)
before=$(ticks); sleep "$seconds"; after=$(ticks)
rss=$(awk '/VmHWM/ {print $2}' "/proc/$watch/status")
echo "watch on $files files ($bin): scan and queue ${scanned%.*} s; idle CPU $(echo "scale=3; ($after - $before) * 100 / $hz / $seconds" | bc) % of a core over $seconds s; peak RSS $((rss / 1024)) MiB"
