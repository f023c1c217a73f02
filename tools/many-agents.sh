#!/usr/bin/env bash
# Many agents at once against one relay: every upload must succeed and the relay's peak RSS stay
# within its memory budget plus a fixed overhead (issue 6 finding 24). Prints the figures.
#
#   tools/many-agents.sh [AGENTS] [-- relay options]     # default 100 agents, debug binaries
#
# Each agent sends 5 small files and one of 10 MiB. BIN_DIR picks the binaries (default .build/debug).
set -euo pipefail
cd "$(dirname "$0")/.."
agents=${1:-100}
shift || true
[ "${1:-}" = "--" ] && shift
bin=${BIN_DIR:-.build/debug}
work=$(mktemp -d "${TMPDIR:-/tmp}/upload-many.XXXXXX")
relay_pid=
cleanup() {
    [ -n "$relay_pid" ] && { kill -9 "$relay_pid" 2>/dev/null; wait "$relay_pid" 2>/dev/null; } || true
    pkill -KILL -f -- "$work" 2>/dev/null || true
    rm -rf -- "$work"
}
trap cleanup EXIT
mkdir -p "$work/src"
python3 - "$work/src" "$agents" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
big = os.urandom(10 << 20)
for a in range(n):
    d = os.path.join(root, f"agent{a}")
    os.makedirs(d)
    for i in range(5):
        open(os.path.join(d, f"photo{i}.jpg"), "wb").write(os.urandom(20_000 + 1000 * i))
    # Each agent's big file differs (no dedup between them) but costs no extra random bytes.
    open(os.path.join(d, "video.mov"), "wb").write(a.to_bytes(8, "big") + big[8:])
PY
"$bin/upload-relay" serve --dev --data "$work/relay" --listen 127.0.0.1:0 --ready-file "$work/ready" \
    --log-level warning "$@" > "$work/relay.log" 2>&1 &
relay_pid=$!
for _ in $(seq 1 300); do [ -s "$work/ready" ] && break; sleep 0.1; done
relay=$(cat "$work/ready")
token=$(cat "$work/relay/dev/token")
start=$(date +%s.%N)
pids=()
for a in $(seq 0 $((agents - 1))); do
    # A state directory each, as each device has (one shared: every send hands its files to the first one's runner).
    "$bin/upload-agent" send --relay "$relay" --ca "$work/relay/dev/ca.pem" --token "$token" --json --quiet \
        --state "$work/state/agent$a" --prefix "agent$a" "$work/src/agent$a" > "$work/agent$a.json" 2> "$work/agent$a.err" &
    pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
end=$(date +%s.%N)
peak=$(awk '/VmHWM/ {print $2}' "/proc/$relay_pid/status")
stored=$(cat "$work"/agent*.json | grep -c '"status":"stored"' || true)
echo "agents: $agents; items stored: $stored of $((agents * 6)); agents failed: $failed"
echo "relay peak RSS: $((peak / 1024)) MiB; wall time: $(echo "$end - $start" | bc) s"
[ "$failed" -eq 0 ] && [ "$stored" -eq $((agents * 6)) ]
