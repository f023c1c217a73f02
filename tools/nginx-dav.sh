# Sourced by the benchmarks (tools/bench-upload.sh, tools/bench-many.sh): a private nginx that takes WebDAV PUTs over
# TLS, the peer `upload-relay` is measured against.
#
# nginx_dav_setup DIR HOST PORT WORKERS CONNECTIONS ACCESS_LOG
#   makes DIR/www/upload (where PUTs under /upload/ land), DIR/body and DIR/tmp, a self-signed certificate for the IP
#   HOST (DIR/cert.pem, DIR/key.pem) and DIR/nginx.conf: listening on HOST:PORT, WORKERS worker processes ("auto": one
#   per core) of CONNECTIONS connections each, ACCESS_LOG a file or "off". Start it with
#   nginx -p DIR/ -e DIR/error.log -c DIR/nginx.conf
nginx_dav_setup() {
    local d=$1 host=$2 port=$3 workers=$4 connections=$5 access_log=$6
    mkdir -p "$d/www/upload" "$d/body" "$d/tmp"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=$host" -addext "subjectAltName=IP:$host" \
        -keyout "$d/key.pem" -out "$d/cert.pem" 2>/dev/null
    cat >"$d/nginx.conf" <<EOF
# the temp dir is root-only (0700): workers run as root to write into it
user root;
worker_processes $workers;
daemon off;
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections $connections; }
http {
    access_log $access_log;
    client_body_temp_path $d/body;
    proxy_temp_path $d/tmp/proxy;
    fastcgi_temp_path $d/tmp/fastcgi;
    uwsgi_temp_path $d/tmp/uwsgi;
    scgi_temp_path $d/tmp/scgi;
    server {
        listen $host:$port ssl;
        ssl_certificate $d/cert.pem;
        ssl_certificate_key $d/key.pem;
        root $d/www;
        location /upload/ {
            dav_methods PUT;
            create_full_put_path on;
            client_max_body_size 0;
        }
    }
}
EOF
}
