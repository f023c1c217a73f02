#!/usr/bin/env bash
# Many agents at once through one relay, against nginx receiving the same files from as many curl processes (issue
# 29's "many agents"; a program, not a test: CI does not run it).
#
#   tools/bench-many.sh [AGENTS] [RUNS]      # default 100 agents, 1 run; needs nginx (installed when missing, as root)
#
# Each agent has 10 photos of 3 MiB and 50 thumbnails of 16 KiB (every file different: an 8-byte prefix over shared
# random bytes). Per run, in turn on loopback:
#   ours  one upload-relay (release, --dev: SQLite catalog, local store) and AGENTS `upload-agent send` processes at once
#   peer  nginx (TLS, WebDAV PUT, worker_processes auto) and AGENTS `curl -K` processes at once, each PUTting its
#         agent's 60 files over one kept-alive connection
# and prints wall seconds, aggregate MB/s and files/s, server CPU-s, client CPU-s (all processes), the server's peak
# RSS (the relay; nginx's largest worker), the agents' largest peak RSS, failures, and the ratio ours / peer. Every run
# checks that each server holds every file with its size, and one photo and one thumbnail per agent byte for byte.
# BIN_DIR picks the binaries (default: a release build made here); BENCH_RELAY_ARGS adds options to upload-relay serve
# (A/B runs, e.g. "--memory-budget 64M"). Removes everything it made at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
agents=${1:-100}
runs=${2:-1}
[[ $agents =~ ^[1-9][0-9]*$ && $runs =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [AGENTS] [RUNS]" >&2; exit 2; }
if [ -z "${BIN_DIR:-}" ]; then
    swift build -c release --product upload-relay >/dev/null
    swift build -c release --product upload-agent >/dev/null
    BIN_DIR=$(swift build -c release --show-bin-path)
fi
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx libnginx-mod-http-dav-ext >/dev/null
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
# shellcheck source=tools/nginx-dav.sh
. "$(dirname "$0")/nginx-dav.sh"

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-many.XXXXXX")
server_pid=
cleanup() {
    [ -n "$server_pid" ] && { kill -9 "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; } || true
    pkill -KILL -f -- "$work" 2>/dev/null || true
    rm -rf -- "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== machine: $(nproc) cores, $(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo); $agents agents x (10 x 3 MiB + 50 x 16 KiB), $runs run(s)"
python3 - "$work/src" "$agents" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
photo, thumb = os.urandom(3 << 20), os.urandom(16 << 10)
for a in range(n):
    d = os.path.join(root, f"agent{a}")
    os.makedirs(d)
    for i in range(10):
        with open(os.path.join(d, f"IMG_{i:04d}.jpg"), "wb") as f:
            f.write((a * 1000 + i).to_bytes(8, "big") + photo[8:])
    for i in range(50):
        with open(os.path.join(d, f"thumb_{i:04d}.jpg"), "wb") as f:
            f.write((a * 1000 + 100 + i).to_bytes(8, "big") + thumb[8:])
PY
files=$((agents * 60))
bytes=$(du -sb "$work/src" | cut -f1)
ticks=$(getconf CLK_TCK)
now() { date +%s.%N; }
cpu_of() { awk -v t="$ticks" '{ printf "%.2f", ($14 + $15) / t }' "/proc/$1/stat"; }
# the CPU of a process and its children that were waited for (nginx's workers, after it stopped)
hwm_of() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

# check DEST: as many files as were sent; photo 0 and thumbnail 0 of each agent byte for byte
check() {
    local dest=$1 a n
    n=$(find "$dest" -type f | wc -l)
    [ "$n" -eq "$files" ] || { echo "   $dest holds $n files, not $files" >&2; return 1; }
    for ((a = 0; a < agents; a++)); do
        cmp -s "$work/src/agent$a/IMG_0000.jpg" "$dest/agent$a/IMG_0000.jpg" || { echo "   agent$a/IMG_0000.jpg differs" >&2; return 1; }
        cmp -s "$work/src/agent$a/thumb_0000.jpg" "$dest/agent$a/thumb_0000.jpg" || { echo "   agent$a/thumb_0000.jpg differs" >&2; return 1; }
    done
}

# clients NAME COMMAND-FOR-AGENT...: runs one client per agent at once; sets wall, client_cpu, client_hwm, failed
clients() {
    local fn=$1 a pids=() t0 t1
    t0=$(now)
    for ((a = 0; a < agents; a++)); do
        /usr/bin/time -f '%M %U %S' -o "$work/time.$a" bash -c "$fn \"\$1\"" _ "$a" >"$work/out.$a" 2>"$work/err.$a" &
        pids+=($!)
    done
    failed=0
    for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
    t1=$(now)
    wall=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    read -r client_cpu client_hwm < <(cat "$work"/time.* | awk '{ c += $2 + $3; if ($1 > m) m = $1 } END { printf "%.2f %d\n", c, m }')
    [ "$failed" -eq 0 ] || { echo "   $failed clients failed; the first error:" >&2; cat "$(ls "$work"/err.* | head -1)" >&2; }
}

# Each agent has a state directory of its own, as each device has: with one shared, every send after the first handed
# its files to the first one's runner (the same relay and token), and one process uploaded them all.
ours_agent() {
    exec "$BIN_DIR/upload-agent" send --relay "$relay" --ca "$work/relay/dev/ca.pem" --token "$token" --json --quiet \
        --state "$work/state/agent$1" "$work/src/agent$1"
}

peer_client() {
    local a=$1 f
    for f in "$work/src/agent$a"/*; do
        printf 'upload-file = "%s"\nurl = "https://127.0.0.1:%s/upload/agent%s/%s"\noutput = "/dev/null"\n' "$f" "$port" "$a" "$(basename "$f")"
    done >"$work/curl.$a.cfg"
    exec curl -sS -k --fail -K "$work/curl.$a.cfg"
}
export -f ours_agent peer_client

results=()
for ((run = 1; run <= runs; run++)); do
    # ours
    rm -rf "$work/relay" "$work/ready"
    # Every agent connects from 127.0.0.1 at once: more than the 64 strangers one address may hold by default.
    # shellcheck disable=SC2086 # BENCH_RELAY_ARGS is a list of words
    "$BIN_DIR/upload-relay" serve --dev --data "$work/relay" --listen 127.0.0.1:0 --ready-file "$work/ready" --log-level warning \
        --max-strangers-per-source 256 \
        ${BENCH_RELAY_ARGS:-} >"$work/relay.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 300); do [ -s "$work/ready" ] && break; sleep 0.1; done
    relay=$(cat "$work/ready")
    token=$(cat "$work/relay/dev/token")
    export BIN_DIR relay token work
    cpu0=$(cpu_of "$server_pid")
    clients ours_agent
    cpu1=$(cpu_of "$server_pid")
    hwm=$(hwm_of "$server_pid")
    kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=
    stored=$(cat "$work"/out.* | grep -c '"status":"stored"' || true)
    [ "$stored" -eq "$files" ] || echo "   ours: $stored of $files stored" >&2
    check "$work/relay/store/dev"
    results+=("ours|$wall|$cpu0|$cpu1|$client_cpu|$hwm|$client_hwm|$failed|$stored")
    rm -rf "$work/relay" "$work/state" "$work"/out.* "$work"/err.* "$work"/time.*

    # peer: nginx, one worker per core
    d=$work/nginx
    rm -rf "$d"
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    nginx_dav_setup "$d" 127.0.0.1 "$port" auto 1024 off
    "$nginx_bin" -p "$d/" -e "$d/error.log" -c "$d/nginx.conf" &
    server_pid=$!
    for _ in $(seq 100); do python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1).close()" 2>/dev/null && break; sleep 0.1; done
    workers=$(pgrep -P "$server_pid" | tr '\n' ' ')
    export port
    cpu0=0; for w in $server_pid $workers; do cpu0=$(awk -v a="$cpu0" -v b="$(cpu_of "$w")" 'BEGIN { print a + b }'); done
    clients peer_client
    cpu1=0; hwm=0
    for w in $server_pid $workers; do
        cpu1=$(awk -v a="$cpu1" -v b="$(cpu_of "$w")" 'BEGIN { print a + b }')
        h=$(hwm_of "$w"); [ "$h" -gt "$hwm" ] && hwm=$h
    done
    kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=
    check "$d/www/upload"
    results+=("peer|$wall|$cpu0|$cpu1|$client_cpu|$hwm|$client_hwm|$failed|$files")
    rm -rf "$d" "$work"/out.* "$work"/err.* "$work"/time.* "$work"/curl.*.cfg
    echo "-- run $run of $runs done"
done

python3 - "$bytes" "$files" "${results[@]}" <<'PY'
import statistics, sys
nbytes, files = int(sys.argv[1]), int(sys.argv[2])
rows = [r.split("|") for r in sys.argv[3:]]
names = {"ours": "upload-agent x N -> upload-relay", "peer": "curl -K x N -> nginx PUT (TLS)"}
med = {}
print(f"{'':34} {'s':>7} {'MB/s':>7} {'files/s':>8} {'server CPU-s':>12} {'clients CPU-s':>13} {'server RSS MiB':>14} {'client RSS MiB':>14} {'failed':>6}")
for tag in ("ours", "peer"):
    rs = [r for r in rows if r[0] == tag]
    s = statistics.median(float(r[1]) for r in rs)
    med[tag] = s
    cpu = statistics.median(float(r[3]) - float(r[2]) for r in rs)
    ccpu = statistics.median(float(r[4]) for r in rs)
    rss = max(int(r[5]) for r in rs) / 1024
    crss = max(int(r[6]) for r in rs) / 1024
    failed = sum(int(r[7]) for r in rs)
    spread = f"{min(nbytes / float(r[1]) / 1e6 for r in rs):.1f}..{max(nbytes / float(r[1]) / 1e6 for r in rs):.1f}"
    print(f"{names[tag]:34} {s:7.2f} {nbytes / s / 1e6:7.1f} {files / s:8.0f} {cpu:12.2f} {ccpu:13.2f} {rss:14.1f} {crss:14.1f} {failed:6d}   MB/s {spread}")
print(f"ours / peer: {med['peer'] / med['ours']:.2f}x (MB/s and files/s alike: the same files)")
PY
