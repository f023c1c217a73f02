#!/usr/bin/env bash
# The whole upload benchmark of issue 9 in one command (a program, not a test; CI does not run it).
# Builds upload-agent and upload-relay in release mode once, then runs tools/bench-upload.sh for
# each workload BENCH_RUNS times (default 3), every run with our agent and every peer side by side:
#   big     one file of BENCH_BIG_MIB MiB (default 1024), loopback
#   small   10,000 files of 16 KiB, loopback
#   medium  1,000 files of 1 MiB, loopback
#   wan     one file of 256 MiB over ../shared/netem/wan.sh's emulated link (100 ms RTT, 1 Gbit/s,
#           the host's TCP buffers), servers and clients in two network namespaces; ours with default options
#           (--connections auto: more connections while the long link rewards them, the file in stripes, SPEC §6.7)
#   wanfiles  16 files of 16 MiB over the same link, our agent with default options (curl -Z 8 is the peer
#           that also uses several connections)
# and prints, per workload and tool: median seconds, MB/s and files/s, the spread of MB/s over the
# runs (min..max), median CPU-seconds per GB (client, server), the highest peak RSS, and the ratios
# of ours (dedup on, the default) to each peer with the issue's goals.
#
# Usage:  tools/bench-all.sh                      # everything, 3 runs each (about 20 minutes)
#         BENCH_RUNS=1 BENCH_WORKLOADS="small wan" tools/bench-all.sh
# Env:    BENCH_RUNS=N  BENCH_WORKLOADS="big small medium wan wanfiles"  BENCH_BIG_MIB=N
#         BENCH_BIN_DIR=DIR (skip the build)  BENCH_AGENT_ARGS / BENCH_RELAY_ARGS (passed on)
# Needs root (peers, network namespaces). Each bench-upload.sh run stops what it started and
# removes its temp dir; this script keeps only its results file, removed at exit unless BENCH_KEEP=1.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${BENCH_RUNS:-3}
WORKLOADS=${BENCH_WORKLOADS:-big small medium wan wanfiles}
BIG_MIB=${BENCH_BIG_MIB:-1024}
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || { echo "BENCH_RUNS must be a positive integer" >&2; exit 2; }
for w in $WORKLOADS; do
    case $w in big | small | medium | wan | wanfiles) ;; *) echo "unknown workload $w (big, small, medium, wan, wanfiles)" >&2; exit 2 ;; esac
done

RESULTS=$(mktemp /tmp/bench-all.XXXXXX)
# Each run's temp dir lands here and is deleted at the end, not between runs: on this ext4 without a journal,
# creating files is slow for a minute after tens of thousands were deleted (the next run's first tool would pay).
export BENCH_TRASH=$RESULTS.trash
trap '[ "${BENCH_KEEP:-0}" = 1 ] && echo "kept $RESULTS" >&2 || rm -f "$RESULTS"; rm -rf "$BENCH_TRASH"' EXIT

if [ -z "${BENCH_BIN_DIR:-}" ]; then
    echo "== build (release)"
    swift build -c release --product upload-relay
    swift build -c release --product upload-agent
    BENCH_BIN_DIR=$(swift build -c release --show-bin-path)
fi
export BENCH_BIN_DIR BENCH_RESULTS=$RESULTS

echo "== machine: $(nproc) cores, $(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo), kernel $(uname -r)"
echo "== $RUNS run(s) of: $WORKLOADS"
for w in $WORKLOADS; do
    for ((run = 1; run <= RUNS; run++)); do
        echo "-- $w, run $run of $RUNS ($(date +%T))"
        case $w in
            big) env BENCH_TAG=big BENCH_SIZE_MIB="$BIG_MIB" tools/bench-upload.sh ;;
            small) env BENCH_TAG=small BENCH_FILES=10000 BENCH_FILE_KIB=16 tools/bench-upload.sh ;;
            medium) env BENCH_TAG=medium BENCH_FILES=1000 BENCH_FILE_KIB=1024 tools/bench-upload.sh ;;
            wan) env BENCH_TAG=wan BENCH_WAN=1 BENCH_SIZE_MIB=256 tools/bench-upload.sh ;;
            wanfiles) env BENCH_TAG=wanfiles BENCH_WAN=1 BENCH_FILES=16 BENCH_FILE_KIB=16384 tools/bench-upload.sh ;;
        esac >"$RESULTS.log" 2>&1 || { echo "   bench-upload.sh failed:"; tail -30 "$RESULTS.log"; rm -f "$RESULTS.log"; exit 1; }
        grep -E '^(upload-agent|scp|rsync|curl|floor)' "$RESULTS.log" | sed 's/^/   /' || true
        rm -f "$RESULTS.log"
    done
done
echo

python3 - "$RESULTS" "$BIG_MIB" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("|") for l in open(sys.argv[1]) if l.strip()]
big_mib = int(sys.argv[2])
sizes = {"big": (big_mib << 20, 0), "small": (10000 * 16384, 10000), "medium": (1000 << 20, 1000), "wan": (256 << 20, 0),
         "wanfiles": (256 << 20, 16)}
titles = {"big": f"{big_mib} MiB file, loopback", "small": "10,000 x 16 KiB, loopback",
          "medium": "1,000 x 1 MiB, loopback", "wan": "256 MiB over 100 ms RTT, 1 Gbit/s (wan.sh), ours with default options (16 stripes)",
          "wanfiles": "16 x 16 MiB over 100 ms RTT, 1 Gbit/s (wan.sh), ours with default options"}
# the issue's goals: (workload, peer name prefix, ratio of ours (dedup) wanted)
# (issue 29's; the small files' floor goal, 0.8x of tools/durable-floor's grouped sync, is printed beside the floor)
goals = [("big", "curl -T", 1.8), ("small", "rsync", 1.0), ("medium", "curl -Z 8", 0.75),
         ("wan", "scp", 3.0), ("wan", "curl -T", 2.0), ("wanfiles", "curl -Z 8", 1.0)]
OURS = "upload-agent (dedup check)"

def fmt(x, d=1): return "-" if x is None else f"{x:.{d}f}"

summary = {}
for tag in ["big", "small", "medium", "wan", "wanfiles"]:
    mine = [r for r in rows if r[0] == tag]
    if not mine:
        continue
    nbytes, files = sizes[tag]
    gb = nbytes / 1e9
    tools = []
    for r in mine:
        if r[1] not in tools:
            tools.append(r[1])
    print(f"== {titles[tag]}")
    head = ["tool", "runs", "s (median)", "MB/s", "MB/s min..max"] + (["files/s"] if files else []) + \
           ["client CPU-s/GB", "server CPU-s/GB", "client RSS MiB", "server RSS MiB", "ours / this"]
    table = [head]
    medians = {}
    for tool in tools:
        rs = [r for r in mine if r[1] == tool]
        secs = [float(r[2]) for r in rs]
        mbs = [float(r[3]) for r in rs]
        med_s = statistics.median(secs)
        medians[tool] = nbytes / med_s / 1e6
        def cpu(i):
            vals = [float(r[i]) for r in rs if r[i]]
            return statistics.median(vals) / gb if vals else None
        def rss(i):
            vals = [int(r[i]) for r in rs if r[i].isdigit()]
            return max(vals) / 1024 if vals else None
        table.append([tool, str(len(rs)), f"{med_s:.3f}", fmt(medians[tool]), f"{min(mbs):.1f}..{max(mbs):.1f}"] +
                     ([f"{files / med_s:.0f}"] if files else []) +
                     [fmt(cpu(6), 2), fmt(cpu(7), 2), fmt(rss(4)), fmt(rss(5)), ""])
    for row in table[1:]:
        if OURS in medians and medians.get(row[0]):
            row[-1] = f"{medians[OURS] / medians[row[0]]:.2f}"
    w = [max(len(r[i]) for r in table) for i in range(len(head))]
    for i, r in enumerate(table):
        print("  ".join(c.ljust(w[j]) if j == 0 else c.rjust(w[j]) for j, c in enumerate(r)))
        if i == 0:
            print("  ".join("-" * x for x in w))
    print()
    summary[tag] = medians

print("== goals (ratio of medians, ours = upload-agent with dedup on, the default)")
for tag, peer, want in goals:
    medians = summary.get(tag)
    if not medians or OURS not in medians:
        continue
    match = [t for t in medians if t.startswith(peer)]
    if not match:
        print(f"{tag:7} vs {peer:10}: peer not measured")
        continue
    ratio = medians[OURS] / medians[match[0]]
    print(f"{tag:7} vs {match[0]:32} {ratio:5.2f}x  (goal >= {want}x: {'met' if ratio >= want else 'NOT met'})")
print()
print("== the checksum floor: curl -Z 8 with the SHA-1 and CRC-32 work of both sides beside it (tools/integrity-floor)")
for tag, medians in summary.items():
    floor = next((t for t in medians if t.startswith("floor:")), None)
    curl = next((t for t in medians if t.startswith("curl -Z 8")), None)
    if floor and curl and OURS in medians:
        print(f"{tag:7} floor / curl -Z 8 {medians[floor] / medians[curl]:5.2f}x (the most this protocol could reach), "
              f"ours / floor {medians[OURS] / medians[floor]:5.2f}x")
print()
print("MB = 10^6 bytes. CPU-s/GB: user + system seconds per 10^9 bytes (sshd's per-connection process is not")
print("measured). RSS: the highest peak over the runs. Spread: the lowest and highest MB/s of the runs.")
EOF
