#!/usr/bin/env bash
# The upload benchmark (a program, not a test). In one run it:
#   - builds upload-agent and upload-relay in release mode,
#   - makes a random file (BENCH_SIZE_MIB MiB, default 1024) in a temp dir under /tmp,
#     or with BENCH_FILES=N a directory of N random files of BENCH_FILE_KIB KiB each,
#   - uploads it over loopback with: our agent -> relay (TLS), with and without the
#     dedup check; scp (aes128-gcm) and rsync -a over ssh -> a private sshd; curl -T over
#     HTTPS -> a private nginx with WebDAV PUT (for a directory: one connection, and -Z 8; on loopback
#     also -Z 8 with our protocol's checksums of both sides beside it, the "floor" row: BENCH_FLOOR=0 skips it),
#   - checks every stored copy with cmp (diff -r for a directory), and prints seconds,
#     MB/s (10^6 bytes/s), files/s, the ratio of ours to each peer and peak RSS.
#
# Usage:  tools/bench-upload.sh
#         BENCH_FILES=10000 BENCH_FILE_KIB=16 tools/bench-upload.sh     # small files
#         BENCH_FILES=1000 BENCH_FILE_KIB=1024 tools/bench-upload.sh    # medium files
# Env:    BENCH_SIZE_MIB=N      file size in MiB (default 1024)
#         BENCH_FILES=N         a directory of N files instead of one file
#         BENCH_FILE_KIB=K      size of each of those files in KiB (default 16)
#         BENCH_ONLY_PEERS=1    skip the Swift build and our tool; run only scp and curl
#         BENCH_BIN_DIR=DIR     use upload-agent and upload-relay from DIR; no swift build
#         BENCH_KEEP=1          keep the temp dir (for debugging)
#         BENCH_RELAY_ARGS="..."  extra options for upload-relay serve, for A/B runs
#                               (e.g. "--direct-io-buffer 0" writes through the page cache)
#         BENCH_AGENT_ARGS="..."  extra options for upload-agent send (e.g. "--concurrency 32")
#         BENCH_WAN=1           servers in network namespace wan_srv (10.201.0.1), clients in wan_cli,
#                               over ../shared/netem/wan.sh's emulated link (BENCH_WAN_DELAY_MS each
#                               way, default 50; BENCH_WAN_MBIT, default 1000), set up and torn down here
#         BENCH_RESULTS=FILE    also append each run's raw row to FILE (tools/bench-all.sh reads it),
#                               tagged BENCH_TAG
#         BENCH_TRASH=DIR       at the end move the temp dir into DIR instead of deleting it (the caller
#                               deletes DIR later: mass deletes slow file creation for a minute here)
# Needs root for the peers (installs openssh-server, nginx, libnginx-mod-http-dav-ext and
# time with apt-get when missing; sshd needs root). A peer that cannot be set up is
# skipped with a message; the others are still measured. Everything it starts is stopped
# and the temp dir removed on exit, failure or Ctrl-C. Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE_MIB=${BENCH_SIZE_MIB:-1024}
ONLY_PEERS=${BENCH_ONLY_PEERS:-0}
FILES=${BENCH_FILES:-0}
FILE_KIB=${BENCH_FILE_KIB:-16}
[[ $SIZE_MIB =~ ^[1-9][0-9]*$ ]] || { echo "BENCH_SIZE_MIB must be a positive integer" >&2; exit 2; }
[[ $FILES =~ ^[0-9]+$ && $FILE_KIB =~ ^[1-9][0-9]*$ ]] || { echo "BENCH_FILES and BENCH_FILE_KIB must be integers" >&2; exit 2; }
if [ "$FILES" -gt 0 ]; then
    BYTES=$((FILES * FILE_KIB * 1024))
else
    BYTES=$((SIZE_MIB * 1024 * 1024))
fi

say() { printf '%s\n' "$*" >&2; }

# Where servers listen and clients connect: loopback, or the two ends of the emulated WAN.
HOST=127.0.0.1
SRV=()   # prefix that runs a server in its place
CLI=()   # prefix that runs a client in its place
if [ "${BENCH_WAN:-0}" = 1 ]; then
    HOST=10.201.0.1
    SRV=(ip netns exec wan_srv)
    CLI=(ip netns exec wan_cli)
fi
WAN_SH=$(cd "$(dirname "$0")/../../shared/netem" 2>/dev/null && pwd)/wan.sh
# shellcheck source=tools/nginx-dav.sh
. "$(dirname "$0")/nginx-dav.sh"
now() { date +%s.%N; }
# secs START END -> seconds with 3 decimals
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
# mbps SECONDS -> MB/s (10^6 bytes)
mbps() { awk -v s="$1" -v n="$BYTES" 'BEGIN { if (s > 0) printf "%.1f", n / s / 1e6; else print "inf" }'; }
vmhwm_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status" 2>/dev/null || true; }
CLK_TCK=$(getconf CLK_TCK)
# cpu_secs PID: user + system CPU seconds the live process has used
cpu_secs() { awk -v hz="$CLK_TCK" '{ sub(/.*\) /, ""); printf "%.2f", ($12 + $13) / hz }' "/proc/$1/stat" 2>/dev/null || echo 0; }
# children PID: the live children of PID (nginx's workers)
children() {
    local w
    for w in /proc/[0-9]*; do
        [ "$(awk '/^PPid:/ { print $2 }' "$w/status" 2>/dev/null)" = "$1" ] && echo "${w#/proc/}"
    done
    return 0
}
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# alive PID: the process exists and is not a zombie (builtins only: no fork)
alive() {
    local line rest
    { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
    rest=${line##*) }
    [ "${rest%% *}" != Z ]
}
# wait_file PATH PID SECONDS: wait until PATH is non-empty while PID lives
wait_file() {
    local deadline
    deadline=$(awk -v t="$(now)" -v d="$3" 'BEGIN { printf "%.3f", t + d }')
    until [ -s "$1" ]; do
        alive "$2" || { say "process $2 exited before writing $1"; return 1; }
        awk -v t="$(now)" -v d="$deadline" 'BEGIN { exit !(t > d) }' && { say "timed out waiting for $1"; return 1; }
        sleep 0.05
    done
}
# wait_port PORT PID SECONDS: wait until $HOST:PORT accepts (seen from the client's side) while PID lives
wait_port() {
    local i
    for ((i = 0; i < $3 * 20; i++)); do
        alive "$2" || { say "process $2 exited before listening on $1"; return 1; }
        if "${CLI[@]}" python3 -c 'import socket, sys; socket.create_connection((sys.argv[2], int(sys.argv[1])), 1).close()' "$1" "$HOST" 2>/dev/null; then
            return 0
        fi
        sleep 0.05
    done
    say "timed out waiting for port $1"
    return 1
}

# ---------------------------------------------------------------- temp dir, cleanup
DIR=$(mktemp -d /tmp/bench-upload.XXXXXX)
: >"$DIR/pids"     # every background process started, one PID a line
: >"$DIR/results"  # name|seconds|MB/s|client RSS KiB|server RSS KiB|client CPU s|server CPU s
# track PID: remember a process we started so that cleanup stops it
track() { echo "$1" >>"$DIR/pids"; }
# stop_pids PID...: SIGTERM, wait up to 5 s, then SIGKILL (only our own PIDs)
stop_pids() {
    local pid any i
    for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
    for ((i = 0; i < 50; i++)); do
        any=0
        for pid in "$@"; do alive "$pid" && any=1; done
        [ "$any" = 0 ] && return 0
        sleep 0.1
    done
    for pid in "$@"; do kill -KILL "$pid" 2>/dev/null || true; done
}
# descendants PID...: every live descendant of the given processes (builtins only)
descendants() {
    local -A kids=()
    local f line rest pid ppid queue=("$@") out=()
    for f in /proc/[0-9]*/stat; do
        { read -r line <"$f"; } 2>/dev/null || continue
        pid=${line%% *}
        rest=${line##*) }
        rest=${rest#* }
        ppid=${rest%% *}
        kids[$ppid]+=" $pid"
    done
    while [ "${#queue[@]}" -gt 0 ]; do
        pid=${queue[0]}
        queue=("${queue[@]:1}")
        for f in ${kids[$pid]:-}; do
            [ "$f" = "$BASHPID" ] && continue  # this command substitution itself
            out+=("$f")
            queue+=("$f")
        done
    done
    echo "${out[@]}"
}
cleanup() {
    local rc=$?
    set +e
    trap - INT TERM
    # what we tracked (servers whose starting subshell may be gone), plus everything
    # still below this script or below them (agent, scp, curl, nginx workers, sshd sessions)
    local pids
    pids="$(cat "$DIR/pids" 2>/dev/null) "
    # shellcheck disable=SC2086
    pids+="$(descendants $$ $pids)"
    # shellcheck disable=SC2086
    [ -n "${pids// /}" ] && stop_pids $pids
    wait 2>/dev/null
    [ "${BENCH_WAN:-0}" = 1 ] && "$WAN_SH" down 2>/dev/null
    if [ "${BENCH_KEEP:-0}" = 1 ]; then
        say "kept $DIR"
    elif [ -n "${BENCH_TRASH:-}" ] && mkdir -p "$BENCH_TRASH" && mv "$DIR" "$BENCH_TRASH/"; then
        :  # removed by the caller at its end: deleting now would slow the next run's file creation
    else
        rm -rf "$DIR"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ensure_pkgs PKG...: apt-get install what is missing (apt-get update once)
ensure_pkgs() {
    local missing=() p
    for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    [ "${#missing[@]}" = 0 ] && return 0
    if [ "$(id -u)" != 0 ]; then
        say "missing ${missing[*]} and not root"
        return 1
    fi
    say "installing ${missing[*]}"
    if [ ! -e "$DIR/apt-updated" ]; then
        if ! DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$DIR/apt.log" 2>&1; then
            tail -20 "$DIR/apt.log" >&2
            return 1
        fi
        touch "$DIR/apt-updated"
    fi
    # the packages must not start their system services (sshd on :22, nginx on :80):
    # without a policy-rc.d, put one in place for the install
    local policy=/usr/sbin/policy-rc.d added=0 rc=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && added=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
        >>"$DIR/apt.log" 2>&1 || { rc=$?; tail -20 "$DIR/apt.log" >&2; }
    [ "$added" = 1 ] && rm -f "$policy"
    return "$rc"
}

# ---------------------------------------------------------------- machine
echo "== machine"
cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
[ -n "$cpu" ] || cpu=$(lscpu 2>/dev/null | awk -F': *' '/^Model name/ { print $2; exit }')
echo "nproc: $(nproc)"
echo "cpu:   ${cpu:-unknown}"
echo "mem:   $(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
echo "kernel: $(uname -r)"
if [ "$FILES" -gt 0 ]; then
    echo "data:  $FILES files of $FILE_KIB KiB ($BYTES bytes), temp dir $DIR on $(df -P "$DIR" | awk 'NR == 2 { print $1 }')"
else
    echo "file:  $SIZE_MIB MiB ($BYTES bytes), temp dir $DIR on $(df -P "$DIR" | awk 'NR == 2 { print $1 }')"
fi
echo

[ -x /usr/bin/time ] || ensure_pkgs time || { say "GNU time is needed"; exit 1; }

if [ "${BENCH_WAN:-0}" = 1 ]; then
    [ "$(id -u)" = 0 ] || { say "BENCH_WAN=1 needs root (network namespaces)"; exit 1; }
    [ -x "$WAN_SH" ] || { say "missing $WAN_SH"; exit 1; }
    echo "== link: $("$WAN_SH" up "${BENCH_WAN_DELAY_MS:-50}" "${BENCH_WAN_MBIT:-1000}")"
    echo "   TCP buffers in the namespaces as the host's: tcp_wmem $(sysctl -n net.ipv4.tcp_wmem | tr '\t' ' ')"
    echo
fi

# ---------------------------------------------------------------- build
if [ "$ONLY_PEERS" != 1 ]; then
    if [ -n "${BENCH_BIN_DIR:-}" ]; then
        BIN=$(cd "$BENCH_BIN_DIR" && pwd)
        echo "== build: skipped, using $BIN (BENCH_BIN_DIR)"
    else
        echo "== build (release)"
        swift build -c release --product upload-agent --product upload-relay
        # SwiftPM's --product takes a single value (the last one given wins), so make sure
        # the agent is built too; this is a no-op when the line above already built it.
        swift build -c release --product upload-agent
        BIN=$(swift build -c release --show-bin-path)
    fi
    for b in upload-agent upload-relay; do
        [ -x "$BIN/$b" ] || { say "missing $BIN/$b after the build"; exit 1; }
    done
    echo
fi

# ---------------------------------------------------------------- data
if [ "$FILES" -gt 0 ]; then
    FILE=$DIR/data
    say "making $FILES files of $FILE_KIB KiB of random data"
    python3 - "$FILE" "$FILES" "$FILE_KIB" <<'PY'
import os, sys
root, n, kib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(root)
for i in range(n):
    with open(os.path.join(root, f"IMG_{i:06d}.jpg"), "wb") as f: f.write(os.urandom(kib * 1024))
PY
else
    FILE=$DIR/data.bin
    say "making $SIZE_MIB MiB of random data"
    head -c "$BYTES" /dev/urandom >"$FILE"
    [ "$(stat -c %s "$FILE")" = "$BYTES" ]
fi
# The source written out before the first tool runs: else that tool (ours, first) pays for its writeback.
sync
# same SOURCE COPY: the copy holds the source's bytes (a file, or a directory tree)
same() { if [ -d "$1" ]; then diff -rq "$1" "$2" >/dev/null; else cmp -s "$1" "$2"; fi; }

# record NAME SECONDS CLIENT_RSS_KIB SERVER_RSS_KIB
# record NAME SECONDS CLIENT_RSS_KIB SERVER_RSS_KIB [CLIENT_CPU_S] [SERVER_CPU_S]
record() {
    local row="$1|$2|$(mbps "$2")|$3|$4|${5:-}|${6:-}"
    echo "$row" >>"$DIR/results"
    [ -z "${BENCH_RESULTS:-}" ] || echo "${BENCH_TAG:-run}|$row" >>"$BENCH_RESULTS"
}
# timed_copy NAME COPY CMD...: runs CMD under GNU time, checks that COPY holds the source's bytes,
# removes it and records the run (the client's peak RSS; no server figure)
# (and the CPU seconds of the processes in SERVER_PIDS, when the caller names them)
timed_copy() {
    local name=$1 copy=$2 t0 t1 rss user sys before after
    shift 2
    before=$(server_cpu)
    t0=$(now)
    /usr/bin/time -f '%M %U %S' -o "$DIR/copy.rss" "${CLI[@]}" "$@" || { say "$name failed"; return 1; }
    t1=$(now)
    after=$(server_cpu)
    same "$FILE" "$copy" || { say "$name: the copy differs"; return 1; }
    say "verified $copy"
    discard "$copy"
    read -r rss user sys < <(tail -1 "$DIR/copy.rss")
    record "$name" "$(secs "$t0" "$t1")" "$rss" "" "$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f", u + s }')" \
        "${SERVER_PIDS:+$(awk -v a="$before" -v b="$after" 'BEGIN { printf "%.2f", b - a }')}"
}
# discard PATH: out of the way until the end, and its bytes written out before the next tool
# starts. Not deleted now: on this ext4 without a journal, creating files is slow for a minute
# after many were deleted (the inode allocator skips recently deleted inodes, ext4
# recently_deleted()), which would slow whichever tool runs next. Synced (outside any timing):
# otherwise the next tool pays for the page-cache writeback of the one before (scp, rsync and
# nginx leave their copy dirty; ours has already made its bytes durable, inside its time).
discard() {
    mkdir -p "$DIR/discarded"
    mv "$1" "$DIR/discarded/$(date +%s%N)"
    sync
}
# server_cpu: CPU seconds of SERVER_PIDS together (0 without)
server_cpu() {
    local pid total=0
    for pid in ${SERVER_PIDS:-}; do total=$(awk -v t="$total" -v c="$(cpu_secs "$pid")" 'BEGIN { print t + c }'); done
    echo "$total"
}

# ---------------------------------------------------------------- a) ours
bench_ours() {
    set -euo pipefail
    local relay_pid addr token t0 t1 rss hwm key
    mkdir -p "$DIR/relay"
    # shellcheck disable=SC2086 # BENCH_RELAY_ARGS is a list of words
    "${SRV[@]}" "$BIN/upload-relay" serve --dev --data "$DIR/relay" --listen "$HOST:0" \
        --ready-file "$DIR/relay.ready" ${BENCH_RELAY_ARGS:-} >"$DIR/relay.log" 2>&1 &
    relay_pid=$!
    track "$relay_pid"
    wait_file "$DIR/relay.ready" "$relay_pid" 60 || { tail -20 "$DIR/relay.log" >&2; return 1; }
    addr=$(tr -d ' \n' <"$DIR/relay.ready")
    wait_file "$DIR/relay/dev/token" "$relay_pid" 10
    wait_file "$DIR/relay/dev/ca.pem" "$relay_pid" 10
    token=$(cat "$DIR/relay/dev/token")
    say "relay pid $relay_pid on $addr"

    # 1. with the dedup check (hash pass, ask the relay, then stream), under its own prefix.
    #    Run first, on an empty relay, so that the dedup check cannot hit whatever the
    #    relay keys dedup on.
    # 2. --no-dedup (hash while streaming, one pass), no prefix.
    local run name prefix_args cpu0 cpu1 user sys
    for run in dedup nodedup; do
        if [ "$run" = dedup ]; then
            name="upload-agent (dedup check)"; prefix_args=(--prefix bench-dedup); key="bench-dedup/$(basename "$FILE")"
        else
            name="upload-agent (--no-dedup)"; prefix_args=(--no-dedup); key="$(basename "$FILE")"
        fi
        say "-- $name"
        cpu0=$(cpu_secs "$relay_pid")
        t0=$(now)
        # shellcheck disable=SC2086 # BENCH_AGENT_ARGS is a list of words
        /usr/bin/time -f '%M %U %S' -o "$DIR/agent-$run.rss" \
            "${CLI[@]}" "$BIN/upload-agent" send --relay "$addr" --ca "$DIR/relay/dev/ca.pem" --token "$token" --state "$DIR/agent-state" \
            "${prefix_args[@]}" ${BENCH_AGENT_ARGS:-} --json "$FILE" >"$DIR/agent-$run.json" 2>"$DIR/agent-$run.err" \
            || { say "upload-agent failed:"; cat "$DIR/agent-$run.err" "$DIR/agent-$run.json" >&2; return 1; }
        t1=$(now)
        cpu1=$(cpu_secs "$relay_pid")
        read -r rss user sys < <(tail -1 "$DIR/agent-$run.rss")
        say "agent output: $(head -c 2000 "$DIR/agent-$run.json")"
        # The connections the run had open when its last item finished (--json's "connections"): more than one only
        # where --connections auto found a long link that rewarded them, or with --connections N.
        echo "upload-agent connections used ($run): $(grep -o '"connections":[0-9]*' "$DIR/agent-$run.json" | cut -d: -f2 | sort -n | tail -1)"
        if ! same "$FILE" "$DIR/relay/store/dev/$key"; then
            say "stored object $DIR/relay/store/dev/$key differs from the source"
            return 1
        fi
        say "verified $DIR/relay/store/dev/$key"
        discard "$DIR/relay/store/dev/$key"
        echo "$name|$(secs "$t0" "$t1")|$rss|$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f", u + s }')|$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.2f", b - a }')" >>"$DIR/ours.partial"
    done
    hwm=$(vmhwm_kib "$relay_pid")
    stop_pids "$relay_pid"
    wait "$relay_pid" 2>/dev/null || say "relay exit status $? after SIGTERM"
    while IFS='|' read -r name s rss ccpu scpu; do
        record "$name" "$s" "$rss" "${hwm:-}" "$ccpu" "$scpu"
    done <"$DIR/ours.partial"
}

# ---------------------------------------------------------------- b) scp
bench_scp() {
    set -euo pipefail
    local port d=$DIR/ssh sshd_pid t0 t1
    ensure_pkgs openssh-server openssh-client || { say "cannot install openssh-server"; return 1; }
    [ "$(id -u)" = 0 ] || { say "sshd needs root"; return 1; }
    mkdir -p "$d" "$DIR/scp-dest" /run/sshd
    chmod 0755 /run/sshd
    ssh-keygen -q -t ed25519 -N '' -C bench-host -f "$d/host_ed25519"
    ssh-keygen -q -t ed25519 -N '' -C bench-client -f "$d/client_ed25519"
    cp "$d/client_ed25519.pub" "$d/authorized_keys"
    chmod 600 "$d/authorized_keys"
    port=$(free_port)
    cat >"$d/sshd_config" <<EOF
Port $port
ListenAddress $HOST
HostKey $d/host_ed25519
PidFile $d/sshd.pid
AuthorizedKeysFile $d/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
# the keys live under /tmp (world-writable): skip the ownership walk up the path
StrictModes no
UsePAM no
Subsystem sftp internal-sftp
LogLevel ERROR
EOF
    /usr/sbin/sshd -t -f "$d/sshd_config"
    "${SRV[@]}" /usr/sbin/sshd -D -e -f "$d/sshd_config" 2>"$d/sshd.log" &
    sshd_pid=$!
    track "$sshd_pid"
    wait_port "$port" "$sshd_pid" 10 || { cat "$d/sshd.log" >&2; return 1; }
    local opts=(-F /dev/null -i "$d/client_ed25519" -o IdentitiesOnly=yes -o BatchMode=yes
        -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR)
    t0=$(now)
    "${CLI[@]}" ssh "${opts[@]}" -p "$port" "root@$HOST" true \
        || { say "ssh login to the private sshd failed"; cat "$d/sshd.log" >&2; return 1; }
    t1=$(now)
    # the connection set-up (key exchange, sntrup761x25519 by default, and login) is a
    # fixed cost included in scp's time; show it so small BENCH_SIZE_MIB runs read right
    echo "ssh connection set-up (ssh root@$HOST true): $(secs "$t0" "$t1") s, included in scp's time"
    say "-- scp -c aes128-gcm@openssh.com (sshd pid $sshd_pid, port $port)"
    local copy
    copy="$DIR/scp-dest/$(basename "$FILE")"
    timed_copy "scp -c aes128-gcm@openssh.com" "$copy" \
        scp -q -r "${opts[@]}" -c aes128-gcm@openssh.com -P "$port" "$FILE" "root@$HOST:$DIR/scp-dest/"
    # rsync -a through the same sshd (rsync on both ends; the same cipher)
    if command -v rsync >/dev/null || ensure_pkgs rsync; then
        say "-- rsync -a over ssh (aes128-gcm)"
        timed_copy "rsync -a over ssh" "$copy" \
            rsync -a -e "ssh ${opts[*]} -c aes128-gcm@openssh.com -p $port" "$FILE" "root@$HOST:$DIR/scp-dest/"
    else
        say "cannot install rsync: skipped"
    fi
    stop_pids "$sshd_pid"
}

# ---------------------------------------------------------------- c) curl -> nginx
bench_nginx() {
    set -euo pipefail
    local port d=$DIR/nginx nginx_pid t0 t1 rss code hwm w
    ensure_pkgs nginx libnginx-mod-http-dav-ext || { say "cannot install nginx"; return 1; }
    command -v curl >/dev/null || ensure_pkgs curl || { say "cannot install curl"; return 1; }
    local nginx_bin
    nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
    port=$(free_port)
    nginx_dav_setup "$d" "$HOST" "$port" 1 64 "$d/access.log"
    "${SRV[@]}" "$nginx_bin" -t -q -p "$d/" -e "$d/error.log" -c "$d/nginx.conf"
    "${SRV[@]}" "$nginx_bin" -p "$d/" -e "$d/error.log" -c "$d/nginx.conf" &
    nginx_pid=$!
    track "$nginx_pid"
    wait_port "$port" "$nginx_pid" 10 || { cat "$d/error.log" >&2; return 1; }
    local SERVER_PIDS
    SERVER_PIDS=$(children "$nginx_pid" | tr '\n' ' ')
    if [ -d "$FILE" ]; then
        bench_nginx_files "$d" "$port" "$nginx_pid"
        return
    fi
    say "-- curl -T over HTTPS to nginx (pid $nginx_pid, port $port)"
    local before after user sys
    before=$(server_cpu)
    t0=$(now)
    code=$(/usr/bin/time -f '%M %U %S' -o "$d/curl.rss" \
        "${CLI[@]}" curl -sS -k -T "$FILE" "https://$HOST:$port/upload/file" -o "$d/curl.out" -w '%{http_code}')
    t1=$(now)
    after=$(server_cpu)
    read -r rss user sys < <(tail -1 "$d/curl.rss")
    case "$code" in 200 | 201 | 204) ;; *) say "PUT answered $code: $(head -c 500 "$d/curl.out")"; return 1 ;; esac
    # the worker's peak RSS (children of the master)
    hwm=0
    for w in /proc/[0-9]*; do
        if [ "$(awk '/^PPid:/ { print $2 }' "$w/status" 2>/dev/null)" = "$nginx_pid" ]; then
            w=$(vmhwm_kib "${w#/proc/}")
            [ "${w:-0}" -gt "$hwm" ] && hwm=$w
        fi
    done
    cmp "$FILE" "$d/www/upload/file" || { say "nginx copy differs"; return 1; }
    say "verified $d/www/upload/file"
    discard "$d/www/upload/file"
    stop_pids "$nginx_pid"
    record "curl -T https -> nginx PUT" "$(secs "$t0" "$t1")" "$rss" "$hwm" \
        "$(awk -v u="$user" -v s="$sys" 'BEGIN { printf "%.2f", u + s }')" "$(awk -v a="$before" -v b="$after" 'BEGIN { printf "%.2f", b - a }')"
}

# bench_nginx_files DIR PORT PID: a directory through curl, one connection, then -Z (8 at once); on loopback, also
# -Z 8 with the checksums our protocol requires of both sides computed beside it on the same cores
# (tools/integrity-floor/checksums.py): the most any implementation of the protocol could do with curl's and nginx's
# transport and file costs ("floor" rows; BENCH_FLOOR=0 skips them).
bench_nginx_files() {
    local d=$1 port=$2 nginx_pid=$3 f run runs=(one parallel)
    for f in "$FILE"/*; do
        printf 'upload-file = "%s"\nurl = "https://%s:%s/upload/data/%s"\noutput = "/dev/null"\n' "$f" "$HOST" "$port" "$(basename "$f")"
    done >"$d/curl.cfg"
    [ "${BENCH_WAN:-0}" != 1 ] && [ "${BENCH_FLOOR:-1}" = 1 ] && runs+=(floor)
    for run in "${runs[@]}"; do
        local args=(-sS -k --fail -K "$d/curl.cfg") name="curl -T https -> nginx PUT (one connection)"
        [ "$run" != one ] && { args+=(-Z --parallel-max 8); name="curl -Z 8 https -> nginx PUT"; }
        if [ "$run" = floor ]; then
            name="floor: curl -Z 8 + SHA-1 and CRC-32 of both sides"
            say "-- $name (pid $nginx_pid, port $port)"
            # both to their end; the copy is checked as for the others
            timed_copy "$name" "$d/www/upload/data" bash -c \
                'python3 "$1" "$2" & sums=$!; shift 2; curl "$@"; rc=$?; wait "$sums" || rc=1; exit "$rc"' \
                _ "$PWD/tools/integrity-floor/checksums.py" "$FILE" "${args[@]}"
            continue
        fi
        say "-- $name (pid $nginx_pid, port $port)"
        timed_copy "$name" "$d/www/upload/data" curl "${args[@]}"
    done
    stop_pids "$nginx_pid"
}

# run_part NAME FUNCTION [WORD]: run FUNCTION in a subshell with errexit in force (never in a
# conditional context, where bash would ignore errexit); sets part_rc; on failure says
# SKIPPED and goes on. The subshell runs in the background and is waited for so that a
# SIGTERM to this script is handled at once; it registers the servers it starts in
# $DIR/pids.
part_rc=0
run_part() {
    echo "== $1"
    set +e
    ( trap - EXIT INT TERM; set -e; "$2" ) &
    local sub=$!
    wait "$sub"
    part_rc=$?
    set -e
    if [ "$part_rc" != 0 ]; then
        echo "$1: ${3:-SKIPPED (could not be set up or failed,} exit $part_rc; see the messages above)"
    fi
    echo
}

failed_ours=0
if [ "$ONLY_PEERS" != 1 ]; then
    run_part "ours: upload-agent -> upload-relay" bench_ours "FAILED (the benchmark exits 1;"
    [ "$part_rc" = 0 ] || failed_ours=1
else
    echo "== ours: skipped (BENCH_ONLY_PEERS=1)"
    echo
fi
run_part "peer: scp, rsync" bench_scp
run_part "peer: curl -> nginx WebDAV PUT" bench_nginx

# ---------------------------------------------------------------- table
if [ "$FILES" -gt 0 ]; then
    echo "== results ($FILES files x $FILE_KIB KiB = $BYTES bytes, MB = 10^6 bytes)"
else
    echo "== results ($SIZE_MIB MiB = $BYTES bytes, MB = 10^6 bytes)"
fi
python3 - "$DIR/results" "$FILES" "$BYTES" <<'EOF'
import sys
files = int(sys.argv[2])
gb = int(sys.argv[3]) / 1e9
rows = [line.rstrip("\n").split("|") for line in open(sys.argv[1]) if line.strip()]
ours = [r for r in rows if r[0].startswith("upload-agent")]
def mib(k): return f"{int(k) / 1024:.1f}" if k and k.isdigit() and int(k) > 0 else "-"
head = ["tool", "seconds", "MB/s"] + (["files/s"] if files else []) + \
       [f"{o[0].split('(')[1].rstrip(')')} / this" for o in ours] + \
       ["agent|client peak RSS MiB", "relay|server peak RSS MiB", "client CPU-s/GB", "server CPU-s/GB"]
table = [head]
def per_gb(cpu): return f"{float(cpu) / gb:.2f}" if cpu else "-"
for name, secs, mbs, crss, srss, ccpu, scpu in rows:
    ratios = [f"{float(o[2]) / float(mbs):.2f}" if float(mbs) > 0 else "-" for o in ours]
    rate = [f"{files / float(secs):.0f}" if float(secs) > 0 else "-"] if files else []
    table.append([name, secs, mbs] + rate + ratios + [mib(crss), mib(srss), per_gb(ccpu), per_gb(scpu)])
if len(table) == 1:
    print("(nothing measured)")
    sys.exit(0)
w = [max(len(r[i]) for r in table) for i in range(len(head))]
for i, r in enumerate(table):
    print("  ".join(c.ljust(w[j]) if j == 0 else c.rjust(w[j]) for j, c in enumerate(r)))
    if i == 0:
        print("  ".join("-" * x for x in w))
print()
print("agent|client: upload-agent, scp, curl (GNU time %M). relay|server: upload-relay VmHWM over both"
      " runs, nginx worker VmHWM; the per-connection sshd is gone before it can be read.")
print("CPU-s/GB: user + system CPU seconds per 10^9 bytes; client from GNU time, server from /proc"
      " (relay, nginx workers; sshd's per-connection process is not measured: -).")
if ours:
    print("'X / this' = MB/s of our run X divided by MB/s of that row (> 1: ours is faster).")
EOF
exit "$failed_ours"
