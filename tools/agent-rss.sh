#!/usr/bin/env bash
# The agent's peak memory with a large queue and large uploads in flight (issue 8's benchmark), not a test:
#   tools/agent-rss.sh [PHOTOS] [VIDEOS] [VIDEO_MIB]     default 10000 photos, 5 videos of 1024 MiB
# Makes VIDEOS random files of VIDEO_MIB MiB and PHOTOS small files, starts a dev relay, and runs one
# `upload-agent send --concurrency VIDEOS videos/ photos/` through the persistent queue: the videos upload together
# while every photo waits queued behind them. Prints the agent's peak RSS (getrusage of the finished process) and
# the relay's, and checks that every object arrived.
# Binaries: BIN_DIR (default .build/release if built there, else .build/debug). Everything lives in a temporary
# directory removed at exit, with every process started.
set -euo pipefail
photos=${1:-10000}
videos=${2:-5}
mib=${3:-1024}
cd "$(dirname "$0")/.."
bin=${BIN_DIR:-$( [ -x .build/release/upload-agent ] && echo .build/release || echo .build/debug )}
bin=$(cd "$bin" && pwd)
dir=$(mktemp -d "${TMPDIR:-/tmp}/agent-rss.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; rm -rf -- "$dir"; }
trap cleanup EXIT
mkdir -p "$dir/up/videos" "$dir/up/photos"
for i in $(seq "$videos"); do head -c "$((mib << 20))" /dev/urandom >"$dir/up/videos/VID_$i.mp4"; done
python3 - "$dir/up/photos" "$photos" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    with open(os.path.join(root, f"IMG_{i:06d}.jpg"), "wb") as f: f.write(i.to_bytes(8, "little") * 512)
PY
"$bin/upload-relay" serve --dev --data "$dir/relay" --listen 127.0.0.1:0 --ready-file "$dir/ready" --log-level warning >"$dir/relay.log" 2>&1 &
relay=$!
pids+=($relay)
for _ in $(seq 300); do [ -s "$dir/ready" ] && break; sleep 0.1; done
export UPLOAD_RELAY=$(cat "$dir/ready") UPLOAD_CA="$dir/relay/dev/ca.pem" UPLOAD_TOKEN=$(cat "$dir/relay/dev/token") XDG_STATE_HOME="$dir/state"
start=$(date +%s.%N)
cd "$dir/up"
# ru_maxrss of the waited-for child: the agent's own peak, read after it exited.
agent_kib=$(python3 - "$bin" "$videos" <<'PY'
import resource, subprocess, sys
bin, videos = sys.argv[1], sys.argv[2]
run = subprocess.run([f"{bin}/upload-agent", "send", "--quiet", "--concurrency", videos, "videos", "photos"])
if run.returncode != 0: sys.exit(f"upload-agent send exited {run.returncode}")
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
PY
)
cd - >/dev/null
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
relay_kib=$(awk '/VmHWM/ {print $2}' "/proc/$relay/status")
stored=$(find "$dir/relay/store" -type f | wc -l)
[ "$stored" -eq "$((photos + videos))" ] || { echo "only $stored of $((photos + videos)) objects stored" >&2; exit 1; }
cmp "$dir/up/videos/VID_1.mp4" "$dir/relay/store/dev/videos/VID_1.mp4"
echo "send of $videos x $mib MiB + $photos photos ($bin): ${elapsed%.*} s; agent peak RSS $((agent_kib / 1024)) MiB; relay peak RSS $((relay_kib / 1024)) MiB"
