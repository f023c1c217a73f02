#!/usr/bin/env bash
# The S3 path against what a user would otherwise pick (issue 29; a program, not a test: CI does not run it):
# agent -> relay -> SeaweedFS against `rclone copy` straight to the same SeaweedFS, on loopback.
#
#   tools/bench-s3.sh [RUNS]        # default 1 run of each workload; installs rclone when missing (as root)
#
# Workloads: one file of 1 GiB (BENCH_S3_BIG_MIB), and 1,000 files of 1 MiB. Per run and workload, in turn:
#   ours    upload-relay --store s3://bench/ours (release, SQLite catalog) and one `upload-agent send`, defaults
#   rclone  `rclone copy` of the same path to s3://bench/rclone, defaults (4 transfers, 5 MiB multipart chunks)
# and prints wall seconds, MB/s, client CPU-s/GB (the agent and the relay together for ours: the relay is the extra
# hop), SeaweedFS's CPU-s/GB, and ours / rclone. Every run checks the object count and bytes under each prefix, and
# one object of each byte for byte. BIN_DIR picks the binaries (default: a release build made here). Starts its own
# SeaweedFS (tools/s3/seaweedfs.sh) and removes everything it made at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1}
big_mib=${BENCH_S3_BIG_MIB:-1024}
[[ $runs =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [RUNS]" >&2; exit 2; }
if [ -z "${BIN_DIR:-}" ]; then
    swift build -c release --product upload-relay >/dev/null
    swift build -c release --product upload-agent >/dev/null
    BIN_DIR=$(swift build -c release --show-bin-path)
fi
command -v rclone >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rclone >/dev/null

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-s3.XXXXXX")
relay_pid=
cleanup() {
    [ -n "$relay_pid" ] && { kill -9 "$relay_pid" 2>/dev/null; wait "$relay_pid" 2>/dev/null; } || true
    tools/s3/seaweedfs.sh stop "$work/s3" >/dev/null 2>&1 || true
    rm -rf -- "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# AWS_CA_BUNDLE (set on some hosts) makes rclone 1.60 refuse its own HTTP transport; plain http here needs none.
unset AWS_CA_BUNDLE
eval "$(tools/s3/seaweedfs.sh start "$work/s3")"
export RCLONE_CONFIG_SW_TYPE=s3 RCLONE_CONFIG_SW_PROVIDER=Other RCLONE_CONFIG_SW_ENDPOINT=$UPLOAD_S3_ENDPOINT \
    RCLONE_CONFIG_SW_REGION=$UPLOAD_S3_REGION RCLONE_CONFIG_SW_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID \
    RCLONE_CONFIG_SW_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY RCLONE_CONFIG=/dev/null
rclone mkdir sw:bench
ticks=$(getconf CLK_TCK)
now() { date +%s.%N; }
# CPU seconds of SeaweedFS's processes
tree_cpu() {
    local pids
    pids=$(pgrep -f -- "$work/s3" || true)
    [ -n "$pids" ] || { echo 0; return; }
    for p in $pids; do cat "/proc/$p/stat" 2>/dev/null || true; done | awk -v t="$ticks" '{ c += $14 + $15 } END { printf "%.2f\n", c / t }'
}
cpu_of() { awk -v t="$ticks" '{ printf "%.2f", ($14 + $15) / t }' "/proc/$1/stat"; }

echo "== machine: $(nproc) cores, $(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo); rclone $(rclone version | head -1 | awk '{print $2}'); SeaweedFS 4.48"
mkdir -p "$work/big" "$work/medium"
head -c "$((big_mib << 20))" /dev/urandom >"$work/big/video.mov"
python3 - "$work/medium" <<'PY'
import os, sys
body = os.urandom(1 << 20)
for i in range(1000):
    with open(os.path.join(sys.argv[1], f"clip{i:04d}.bin"), "wb") as f:
        f.write(i.to_bytes(8, "big") + body[8:])
PY

# verify PREFIX SRC: the objects under s3://bench/PREFIX are SRC's files by count and bytes, and the first one by bytes
verify() {
    local prefix=$1 src=$2 got want first
    got=$(rclone size --json "sw:bench/$prefix")
    want=$(python3 -c 'import json, os, sys; fs = [os.path.join(sys.argv[1], f) for f in os.listdir(sys.argv[1])]; print(len(fs), sum(os.path.getsize(f) for f in fs))' "$src")
    python3 -c 'import json, sys; g = json.loads(sys.argv[1]); n, b = map(int, sys.argv[2].split()); sys.exit(0 if (g["count"], g["bytes"]) == (n, b) else f"{sys.argv[3]}: {g} stored, {n} files of {b} bytes sent")' "$got" "$want" "$prefix"
    local all=("$src"/*)
    first=$(basename "${all[0]}")
    rclone cat "sw:bench/$prefix/$first" | cmp -s - "$src/$first" || { echo "$prefix/$first differs" >&2; return 1; }
}

results=()
for ((run = 1; run <= runs; run++)); do
    for workload in big medium; do
        src=$work/$workload
        bytes=$(du -sb "$src" | cut -f1)
        # ours
        rm -rf "$work/relay" "$work/ready"
        "$BIN_DIR/upload-relay" serve --dev --data "$work/relay" --listen 127.0.0.1:0 --ready-file "$work/ready" --log-level warning \
            --store "s3://bench/ours-$run" --s3-endpoint "$UPLOAD_S3_ENDPOINT" --s3-region "$UPLOAD_S3_REGION" >"$work/relay.log" 2>&1 &
        relay_pid=$!
        for _ in $(seq 300); do [ -s "$work/ready" ] && break; sleep 0.1; done
        [ -s "$work/ready" ] || { cat "$work/relay.log" >&2; exit 1; }
        w0=$(tree_cpu); r0=$(cpu_of "$relay_pid"); t0=$(now)
        /usr/bin/time -f '%U %S' -o "$work/agent.time" "$BIN_DIR/upload-agent" send --relay "$(cat "$work/ready")" \
            --state "$work/agent-state-$run-$workload" --ca "$work/relay/dev/ca.pem" --token "$(cat "$work/relay/dev/token")" --quiet "$src"
        t1=$(now); r1=$(cpu_of "$relay_pid"); w1=$(tree_cpu)
        kill "$relay_pid"; wait "$relay_pid" 2>/dev/null || true; relay_pid=
        verify "ours-$run/dev/$workload" "$src"
        results+=("$workload|ours|$bytes|$t0|$t1|$(awk '{ print $1 + $2 }' "$work/agent.time")|$(awk -v a="$r0" -v b="$r1" 'BEGIN { print b - a }')|$(awk -v a="$w0" -v b="$w1" 'BEGIN { print b - a }')")
        # rclone
        w0=$(tree_cpu); t0=$(now)
        /usr/bin/time -f '%U %S' -o "$work/rclone.time" rclone copy "$src" "sw:bench/rclone-$run/$workload"
        t1=$(now); w1=$(tree_cpu)
        verify "rclone-$run/$workload" "$src"
        results+=("$workload|rclone|$bytes|$t0|$t1|$(awk '{ print $1 + $2 }' "$work/rclone.time")|0|$(awk -v a="$w0" -v b="$w1" 'BEGIN { print b - a }')")
        rclone purge "sw:bench/ours-$run" >/dev/null 2>&1 || true
        rclone purge "sw:bench/rclone-$run" >/dev/null 2>&1 || true
        echo "-- run $run, $workload done"
    done
done

python3 - "${results[@]}" <<'PY'
import statistics, sys
rows = [r.split("|") for r in sys.argv[1:]]
titles = {"big": "one large file", "medium": "1,000 x 1 MiB"}
for workload in ("big", "medium"):
    mine = [r for r in rows if r[0] == workload]
    if not mine:
        continue
    nbytes = int(mine[0][2])
    print(f"== {titles[workload]} ({nbytes / 1e6:.0f} MB) to SeaweedFS")
    print(f"{'':40} {'s':>7} {'MB/s':>7} {'MB/s min..max':>14} {'client CPU-s/GB':>16} {'SeaweedFS CPU-s/GB':>19}")
    med = {}
    for tool, name in (("ours", "upload-agent -> upload-relay -> S3"), ("rclone", "rclone copy -> S3")):
        rs = [r for r in mine if r[1] == tool]
        secs = [float(r[4]) - float(r[3]) for r in rs]
        s = statistics.median(secs)
        med[tool] = s
        cpu = statistics.median(float(r[5]) + float(r[6]) for r in rs) / (nbytes / 1e9)
        weed = statistics.median(float(r[7]) for r in rs) / (nbytes / 1e9)
        print(f"{name:40} {s:7.2f} {nbytes / s / 1e6:7.1f} {min(nbytes / x / 1e6 for x in secs):6.1f}..{max(nbytes / x / 1e6 for x in secs):<6.1f} {cpu:16.2f} {weed:19.2f}")
    print(f"ours / rclone: {med['rclone'] / med['ours']:.2f}x   (client CPU for ours: agent + relay)")
    print()
PY
