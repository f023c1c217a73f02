#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster for the tests (issue 10): on loopback, a free port, fsync off, in DIR.
#   tools/pg/postgres.sh start DIR   # prints: export UPLOAD_TEST_POSTGRES_URL=postgres://upload:PASSWORD@127.0.0.1:PORT/upload?sslmode=disable
#                                    #         UPLOAD_TEST_POSTGRES_CA=DIR/tls/ca.pem
#   tools/pg/postgres.sh stop DIR
# The server also takes TLS (ssl=on), with a certificate for 127.0.0.1 and localhost from a CA made for it (openssl):
# the catalog's sslmode tests connect with and without it.
# Runs the server as the postgres user (initdb refuses root): DIR's parents must be searchable by it, so start makes
# DIR world-searchable (the cluster's own files stay the postgres user's). Needs the postgresql package (present on
# these machines; .ci/run installs it when missing).
set -euo pipefail
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)

start() {
    local dir=$1 port password
    [ -n "$bin" ] || { echo "PostgreSQL is not installed (apt-get install postgresql)" >&2; return 1; }
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    # Every parent must be searchable by the postgres user.
    local p=$dir
    while [ "$p" != / ]; do chmod o+x "$p" 2>/dev/null || true; p=$(dirname "$p"); done
    mkdir -p "$dir/cluster"
    chown postgres "$dir/cluster"
    password=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
    echo "$password" >"$dir/pwfile"
    chown postgres "$dir/pwfile"
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    # A CA of its own and a server certificate it signed, for 127.0.0.1 and localhost.
    mkdir -p "$dir/tls"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=upload test CA" -keyout "$dir/tls/ca.key" -out "$dir/tls/ca.pem" \
        >/dev/null 2>&1
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$dir/tls/server.key" -out "$dir/tls/server.csr" >/dev/null 2>&1
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$dir/tls/san.ext"
    openssl x509 -req -in "$dir/tls/server.csr" -CA "$dir/tls/ca.pem" -CAkey "$dir/tls/ca.key" -CAcreateserial -days 2 \
        -extfile "$dir/tls/san.ext" -out "$dir/tls/server.pem" >/dev/null 2>&1
    chown postgres "$dir/tls/server.key" "$dir/tls/server.pem"
    chmod 600 "$dir/tls/server.key"
    runuser -u postgres -- "$bin/initdb" -D "$dir/cluster/data" --auth-local=trust --auth-host=scram-sha-256 -U postgres \
        --pwfile="$dir/pwfile" --no-sync -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; return 1; }
    runuser -u postgres -- "$bin/pg_ctl" -D "$dir/cluster/data" -l "$dir/cluster/log" -w \
        -o "-p $port -k $dir/cluster -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200 -c ssl=on -c ssl_cert_file=$dir/tls/server.pem -c ssl_key_file=$dir/tls/server.key" start >/dev/null \
        || { cat "$dir/cluster/log" >&2; return 1; }
    echo "$port" >"$dir/port"
    runuser -u postgres -- psql -h "$dir/cluster" -p "$port" -U postgres -q -v ON_ERROR_STOP=1 \
        -c "CREATE USER upload CREATEDB PASSWORD '$password'" >/dev/null
    runuser -u postgres -- psql -h "$dir/cluster" -p "$port" -U postgres -q -v ON_ERROR_STOP=1 \
        -c "CREATE DATABASE upload OWNER upload" >/dev/null
    echo "export UPLOAD_TEST_POSTGRES_URL='postgres://upload:$password@127.0.0.1:$port/upload?sslmode=disable' UPLOAD_TEST_POSTGRES_CA='$dir/tls/ca.pem'"
}

stop() {
    local dir=$1
    [ -d "$dir/cluster/data" ] || return 0
    runuser -u postgres -- "$bin/pg_ctl" -D "$dir/cluster/data" -m immediate -w stop >/dev/null 2>&1 || true
}

case ${1:-} in
    start) [ -n "${2:-}" ] || { echo "usage: $0 start DIR" >&2; exit 2; }; start "$2" ;;
    stop) [ -n "${2:-}" ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
    *) echo "usage: $0 start DIR | stop DIR" >&2; exit 2 ;;
esac
