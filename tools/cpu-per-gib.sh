#!/usr/bin/env bash
# CPU seconds the agent and the relay spend per upload of a random file over loopback TLS.
#
# Wall-clock MB/s swings by ±20 % on a shared 2-core machine (scp and curl swing with it, see
# bench-upload.sh); CPU seconds per GiB move far less, so A/B runs of one change compare better here.
#
# Usage:  tools/cpu-per-gib.sh [RUNS] [-- extra upload-relay serve options]
# Env:    BENCH_BIN_DIR=DIR   upload-agent and upload-relay from DIR (default .build/release, built if missing)
#         BENCH_SIZE_MIB=N    file size in MiB (default 1024)
# Prints one line per run: wall seconds, agent CPU (user+sys, GNU time) and relay CPU (/proc/PID/stat).
set -euo pipefail
RUNS=${1:-3}
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "RUNS must be a positive integer" >&2; exit 2; }
shift || true
[[ ${1:-} == "--" ]] && shift
SIZE_MIB=${BENCH_SIZE_MIB:-1024}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BENCH_BIN_DIR:-$ROOT/.build/release}
if [[ ! -x $BIN/upload-agent || ! -x $BIN/upload-relay ]]; then
    (cd "$ROOT" && swift build -c release --product upload-agent && swift build -c release --product upload-relay)
fi
command -v /usr/bin/time >/dev/null || { echo "needs GNU time (apt-get install time)" >&2; exit 2; }
DIR=$(mktemp -d /tmp/cpu-per-gib.XXXXXX)
RELAY_PID=
cleanup() { [[ -n $RELAY_PID ]] && kill "$RELAY_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT INT TERM
head -c $((SIZE_MIB << 20)) /dev/urandom >"$DIR/data.bin"
"$BIN/upload-relay" serve --dev --data "$DIR/relay" --listen 127.0.0.1:0 --ready-file "$DIR/ready" \
    --log-level warning "$@" >"$DIR/relay.log" 2>&1 &
RELAY_PID=$!
for _ in $(seq 600); do [[ -s $DIR/ready ]] && break; kill -0 "$RELAY_PID" || { cat "$DIR/relay.log" >&2; exit 1; }; sleep 0.1; done
[[ -s $DIR/ready ]] || { echo "relay did not start" >&2; exit 1; }
TICK=$(getconf CLK_TCK)
relay_cpu() { awk '{print $14 + $15}' "/proc/$RELAY_PID/stat"; }
echo "$SIZE_MIB MiB, relay options: ${*:-(defaults)}"
for run in $(seq "$RUNS"); do
    before=$(relay_cpu)
    /usr/bin/time -f "%e %U %S" -o "$DIR/agent.time" "$BIN/upload-agent" send --relay "$(tr -d ' \n' <"$DIR/ready")" \
        --token "$(cat "$DIR/relay/dev/token")" --ca "$DIR/relay/dev/ca.pem" --no-dedup --quiet --prefix "run$run" "$DIR/data.bin"
    after=$(relay_cpu)
    read -r wall user sys <"$DIR/agent.time"
    awk -v w="$wall" -v u="$user" -v s="$sys" -v b="$before" -v a="$after" -v t="$TICK" -v m="$SIZE_MIB" 'BEGIN {
        printf "run: wall %.2f s (%.1f MB/s)   agent %.2f CPU-s   relay %.2f CPU-s\n", w, m * 1.048576 / w, u + s, (a - b) / t }'
done
