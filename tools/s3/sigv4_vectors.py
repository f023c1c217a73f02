#!/usr/bin/env python3
"""Reference SigV4 signatures of S3 requests, made by botocore with a fixed clock (issue 10).

    tools/s3/sigv4_vectors.py            # print the vectors as JSON
    tools/s3/sigv4_vectors.py --check F  # exit 1 unless botocore signs every request of F as F says, and curl
                                         # --aws-sigv4 (a second signer) signs the requests it can make alike

The Swift signer (Sources/UploadS3/SigV4.swift) is tested against the output, checked in at
Tests/UploadS3Tests/Fixtures/sigv4-vectors.json; tools/test runs --check on it so that the file stays botocore's.
Each vector: the request (method, path and query decoded, the headers sent before signing, the payload hash),
the credentials, region and time, and what botocore made of it: canonical request, string to sign, signature,
and the headers signing added.
"""
import datetime
import http.server
import subprocess
import threading
import hashlib
import json
import sys
import urllib.parse
from unittest import mock

import botocore.auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

KEY = ("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
EMPTY = hashlib.sha256(b"").hexdigest()


def case(name, method, path, query=(), headers=(), body=b"", unsigned=False, region="us-east-1",
         when="2026-11-25T10:15:30", token=None, host="127.0.0.1:8333"):
    return dict(name=name, method=method, path=path, query=[list(q) for q in query], headers=[list(h) for h in headers],
                body=body.decode("latin-1"), unsigned=unsigned, region=region, time=when, token=token, host=host)


CASES = [
    case("get object", "GET", "/bucket/photos/IMG_0001.jpg"),
    case("put object with checksum and If-None-Match", "PUT", "/bucket/acct/photos/a.jpg", body=b"hello world\n",
         headers=[("content-type", "application/octet-stream"), ("x-amz-checksum-sha1", "ImaC3QNKf7W1BJcY+j9jMzIxpio="),
                  ("if-none-match", "*"), ("content-length", "12")]),
    case("create multipart upload: uploads=", "POST", "/bucket/acct/videos/v.mp4", query=[("uploads", "")]),
    case("upload part, unsigned payload", "PUT", "/bucket/acct/videos/v.mp4",
         query=[("uploadId", "abc/def+ghi="), ("partNumber", "2")], unsigned=True,
         headers=[("content-length", "5242880"), ("x-amz-checksum-sha1", "2jmj7l5rSw0yVb/vlWAYkK/YBwk=")]),
    case("complete multipart upload", "POST", "/bucket/acct/videos/v.mp4", query=[("uploadId", "xyz")],
         body=b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>\"e\"</ETag></Part></CompleteMultipartUpload>"),
    case("abort multipart upload", "DELETE", "/bucket/k", query=[("uploadId", "xyz")]),
    case("key with spaces, unicode and reserved characters", "GET", "/bucket/acct/Ferien 2026/Été/a+b=c&d~e(1)!.jpg"),
    case("list with prefix and continuation, sorted query", "GET", "/bucket",
         query=[("prefix", "acct/in progress/"), ("list-type", "2"), ("continuation-token", "1/2=3"), ("max-keys", "1000")]),
    case("copy object with a copy source", "PUT", "/bucket/acct/b.jpg",
         headers=[("x-amz-copy-source", "/bucket/acct/a%20b.jpg"), ("x-amz-metadata-directive", "COPY")]),
    case("headers with runs of spaces", "HEAD", "/bucket/k", headers=[("x-amz-meta-note", "  two   spaces  here ")]),
    case("another region and a session token", "GET", "/bucket/k", region="eu-central-1", token="FQoGZXIvYXdzEXAMPLE//token="),
    case("range read", "GET", "/bucket/k", headers=[("range", "bytes=0-1048575")], when="2027-01-02T03:04:05"),
]


def sign(c):
    creds = Credentials(KEY[0], KEY[1], c["token"])
    url = "http://" + c["host"] + urllib.parse.quote(c["path"], safe="/~")
    if c["query"]:
        url += "?" + "&".join(urllib.parse.quote(k, safe="~") + "=" + urllib.parse.quote(v, safe="~") for k, v in c["query"])
    body = c["body"].encode("latin-1")
    request = AWSRequest(method=c["method"], url=url, data=body, headers=dict(c["headers"]))
    request.headers["host"] = c["host"]
    if c["unsigned"]:
        request.headers["X-Amz-Content-SHA256"] = "UNSIGNED-PAYLOAD"
        request.context["payload_signing_enabled"] = False
    when = datetime.datetime.fromisoformat(c["time"]).replace(tzinfo=datetime.timezone.utc)
    auth = botocore.auth.S3SigV4Auth(creds, "s3", c["region"])
    if c["unsigned"]:
        auth._should_sha256_sign_payload = lambda request: False
    seen = {}
    canonical_request, string_to_sign = auth.canonical_request, auth.string_to_sign
    auth.canonical_request = lambda r: seen.setdefault("canonical", canonical_request(r))
    auth.string_to_sign = lambda r, c: seen.setdefault("to_sign", string_to_sign(r, c))
    with mock.patch("botocore.auth.get_current_datetime", return_value=when):
        before = set(k.lower() for k in request.headers.keys())
        auth.add_auth(request)
    canonical, to_sign = seen["canonical"], seen["to_sign"]
    added = {k.lower(): v for k, v in request.headers.items() if k.lower() not in before or k.lower() == "x-amz-content-sha256"}
    payload_hash = request.headers["X-Amz-Content-SHA256"]
    signature = request.headers["Authorization"].rsplit("Signature=", 1)[1]
    return dict(c, payload_hash=payload_hash, canonical_request=canonical, string_to_sign=to_sign, signature=signature,
                authorization=request.headers["Authorization"], added_headers=sorted(added.items()),
                access_key_id=KEY[0], secret_access_key=KEY[1])


def curl_signature(v):
    """curl --aws-sigv4's Authorization for vector v, or None when curl cannot make that request as given (a body, a
    session token, several headers it would order or drop its own way, or a query of several parameters, which curl
    7.88 signs in the order given instead of sorted). Its date comes from the x-amz-date header."""
    if v["body"] or v["token"] or v["unsigned"] or v["headers"] or len(v["query"]) > 1:
        return None
    got = {}

    class Capture(http.server.BaseHTTPRequestHandler):
        def answer(self):
            got.update({k.lower(): val for k, val in self.headers.items()})
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = answer

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        path = urllib.parse.quote(v["path"], safe="/~")
        query = "&".join(urllib.parse.quote(k, safe="~") + "=" + urllib.parse.quote(val, safe="~") for k, val in v["query"])
        url = f"http://{v['host']}{path}" + (f"?{query}" if query else "")
        amz_date = dict(v["added_headers"])["x-amz-date"]
        subprocess.run(
            ["curl", "-s", "-o", "/dev/null", "-X", v["method"], "--connect-to", f"{v['host']}:127.0.0.1:{server.server_address[1]}",
             "--aws-sigv4", f"aws:amz:{v['region']}:s3", "--user", f"{v['access_key_id']}:{v['secret_access_key']}",
             "-H", f"x-amz-date: {amz_date}", "-H", f"x-amz-content-sha256: {v['payload_hash']}", url],
            check=True, timeout=20)
    finally:
        server.shutdown()
        server.server_close()
    return got.get("authorization")


def main():
    vectors = [sign(c) for c in CASES]
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        stored = json.load(open(sys.argv[2]))
        if stored != json.loads(json.dumps(vectors)):
            print(f"{sys.argv[2]} differs from botocore {botocore.__version__}'s signatures: run {sys.argv[0]} > it",
                  file=sys.stderr)
            sys.exit(1)
        checked = 0
        for v in stored:
            theirs = curl_signature(v)
            if theirs is None:
                continue
            checked += 1
            if theirs != v["authorization"]:
                print(f"curl --aws-sigv4 signs {v['name']!r} otherwise:\n  curl:     {theirs}\n  botocore: {v['authorization']}",
                      file=sys.stderr)
                sys.exit(1)
        if checked < 3:
            print(f"curl --aws-sigv4 signed only {checked} of the vectors", file=sys.stderr)
            sys.exit(1)
        print(f"sigv4 vectors: {len(vectors)} signatures agree with botocore {botocore.__version__}, "
              f"{checked} of them with curl --aws-sigv4 too")
        return
    json.dump(vectors, sys.stdout, indent=1, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main()
