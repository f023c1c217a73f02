"""The HTTPS status endpoint (`upload-relay serve --status-listen`), attacked by hostile HTTP clients.

README "What an app sees: the status endpoint" and Sources/UploadRelay/Status/StatusHTTPHandler.swift state the
bounds: requests answered one at a time, in order; the connection is not read while one is answered, while requests
wait their turn, or while it is not writable; more than 16 requests sent ahead close it; each request must arrive and
be answered, its answer written, within --status-request-timeout (30 s) of the connection opening or of the previous
answer; --status-max-connections (256) more are closed at accept. Refusals: 400 (bad key, unknown/repeated parameter,
bad percent-encoding, control bytes, head over 16 KiB), 401, 404, 405, 413 (any body), 503, each with a JSON `error`.

Every case checks (a) what the relay answers, or that it closes; (b) that the relay's RSS (VmRSS, sampled every
50 ms during the case) grows by less than RSS_GROWTH_MB over the case; (c) that a normal client (a fresh TLS
connection with the account's token) gets a correct 200 afterwards and, for the floods, during the attack too.

The ready file names the main port only; the status port of a `--status-listen 127.0.0.1:0` relay is the relay
process's other listening socket, found through /proc/PID/fd and /proc/net/tcp.

Relays here: `srelay` (module; defaults but the status listener) and `_trelay` (module; --status-request-timeout
REQUEST_TIMEOUT and --status-max-connections 8), each holding small keys (small/...) and BIG_KEYS keys of about
1 KB each (big/...), so that a `prefix=big/&limit=1000` listing is about 300 KB. The timeout cases share one run
(`timeout_run`): eight connections misbehaving in time at once on `_trelay`, which fill its places (a 9th is closed
at accept) and are watched closing, as the client sees it and as /proc/net/tcp shows the relay's side. A close by the
relay is a TLS close_notify when a TLS session is up, then TCP after NIOSSL's clean-shutdown wait
(TLS_SHUTDOWN_GRACE); both are measured. The binary is copied to a temporary directory first (it may be rebuilt meanwhile).
"""
import contextlib
import hashlib
import json
import os
import select
import shutil
import socket
import ssl
import struct
import tempfile
import threading
import time

import pytest

import agentlib
from agentlib import Closed

RSS_GROWTH_MB = 40
REQUEST_TIMEOUT = 3.0               # --status-request-timeout given to trelay
TIMEOUT_OPTION = "--status-request-timeout"
MAX_CONNECTIONS = 8                 # --status-max-connections given to trelay
PIPELINE_BOUND = 16                 # StatusEndpoint.maxPipelinedRequests
SLACK = 2.5                         # how late past a deadline a close may come
# The status endpoint's TLS shutdown timeout (RelayStatusServer: 1 s): a relay that closes a TLS connection sends
# close_notify and waits this long for the client's before it closes TCP; the timeout bounds allow it beyond the request
# timeout.
TLS_SHUTDOWN_GRACE = 1.0
SMALL_KEYS = 12
BIG_KEYS = 300
ALPN_HTTP = "http/1.1"


# ------------------------------------------------------------------ the relay and its status port

def listening_ports(pid: int) -> set:
    """TCP ports the process listens on (its socket inodes matched in /proc/net/tcp{,6}, state LISTEN)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                lines = fh.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def tcp_info(local_port: int, remote_port: int):
    """(state, send queue, receive queue) of the IPv4 loopback socket local_port -> remote_port in /proc/net/tcp
    (state in hex: 01 ESTABLISHED), or (None, 0, 0) when it is gone."""
    with open("/proc/net/tcp") as fh:
        for line in fh.readlines()[1:]:
            f = line.split()
            if int(f[1].rsplit(":", 1)[1], 16) == local_port and int(f[2].rsplit(":", 1)[1], 16) == remote_port:
                tx, rx = (int(x, 16) for x in f[4].split(":"))
                return f[3], tx, rx
    return None, 0, 0


ESTABLISHED = "01"


def http_request(target: str, token=None, extra=(), close=False, method="GET", version="HTTP/1.1") -> bytes:
    lines = [f"{method} {target} {version}", "Host: localhost"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    lines += list(extra)
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Resp:
    def __init__(self, status, reason, headers, body):
        self.status, self.reason, self.headers, self.body = status, reason, headers, body

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"{self.status} {self.reason} {self.body[:300]!r}"


class Http(agentlib.Transport):
    """One connection speaking raw HTTP/1.1 (over TLS, or not)."""

    def response(self, timeout=10.0, head_only=False) -> Resp:
        """The next whole response (Content-Length framed). Closed if the connection ends first, TimeoutError."""
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in self.buf:
            if not self.fill(deadline):
                raise TimeoutError(f"no response head within {timeout}s (have {self.buf[:200]!r})")
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        assert parts[0].startswith("HTTP/1."), f"not an HTTP response: {head[:200]!r}"
        status, reason = int(parts[1]), (parts[2] if len(parts) > 2 else "")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        assert "transfer-encoding" not in headers, f"unexpected Transfer-Encoding: {headers}"
        n = 0 if head_only else int(headers.get("content-length", "0"))
        self.buf = rest
        while len(self.buf) < n:
            if not self.fill(deadline):
                raise TimeoutError(f"body incomplete within {timeout}s ({len(self.buf)} of {n})")
        body, self.buf = self.buf[:n], self.buf[n:]
        return Resp(status, reason, headers, body)

    def closed_within(self, timeout: float) -> bool:
        """Reads (and keeps) what comes until EOF/reset: True, or False when still open after timeout."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                if not self.fill(deadline):
                    return False
        except Closed:
            return True


def expect_answer_or_close(h: Http, timeout=10.0):
    """The next response, or None when the relay closes without one."""
    try:
        return h.response(timeout)
    except Closed:
        return None


class StatusRelay:
    """An `upload-relay serve --dev --status-listen 127.0.0.1:0` and what it holds."""

    def __init__(self, relay: agentlib.Relay):
        self.relay = relay
        ports = listening_ports(relay.proc.pid) - {relay.port}
        assert len(ports) == 1, (f"cannot tell the status port: the relay listens on {sorted(ports | {relay.port})}, "
                                 f"main port {relay.port}")
        self.port = ports.pop()
        self.token = relay.token
        self.expected = {}      # key -> the JSON the status endpoint must answer for it
        self.socks = []

    @classmethod
    def start(cls, binary, extra=()):
        r = agentlib.Relay.start(["--status-listen", "127.0.0.1:0", *extra], binary=binary)
        try:
            s = cls(r)
            s.populate()
            s.check_normal()
        except BaseException:
            r.stop()
            raise
        return s

    def stop(self):
        self.close_all()
        self.relay.stop()

    def close_all(self):
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass
        self.socks = []

    # -- content
    @staticmethod
    def big_key(i):
        return f"big/{'a' * 250}/{'b' * 250}/{'c' * 250}/{i:04d}-{'d' * 200}"

    def populate(self):
        items = [(f"small/k{i:03d}", agentlib.uniq(b"small %d" % i)) for i in range(SMALL_KEYS)]
        items += [(self.big_key(i), agentlib.uniq(b"big")) for i in range(BIG_KEYS)]
        upload_many(self.relay, items)
        for k, d in items:
            self.expected[k] = {"bytes": len(d), "key": k, "sha1": hashlib.sha1(d).hexdigest(), "size": len(d),
                                "status": "stored"}

    def listing(self, prefix):
        return sorted((v for k, v in self.expected.items() if k.startswith(prefix)), key=lambda e: e["key"].encode())

    # -- connections
    def context(self, alpn=(ALPN_HTTP,)):
        ctx = ssl.create_default_context(cafile=self.relay.ca)
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        return ctx

    def tcp(self, timeout=10.0, rcvbuf=None):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socks.append(s)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(timeout)
        s.connect(("127.0.0.1", self.port))
        return s

    def tls(self, timeout=10.0, rcvbuf=None) -> Http:
        raw = self.tcp(timeout, rcvbuf)
        s = self.context().wrap_socket(raw, server_hostname="localhost")
        self.socks.append(s)
        return Http(s)

    def get(self, target, token="default", extra=(), timeout=10.0, method="GET") -> Resp:
        """One request on a fresh TLS connection."""
        h = self.tls(timeout)
        try:
            h.send(http_request(target, self.token if token == "default" else token, extra, close=True, method=method))
            return h.response(timeout, head_only=method == "HEAD")
        finally:
            h.close()

    def check_normal(self, timeout=10.0):
        """A normal client is served: a key answered 200 with its exact status, a listing 200 with exactly the keys."""
        key = f"small/k{(time.monotonic_ns() // 1000) % SMALL_KEYS:03d}"
        r = self.get(f"/v1/status?key={key}", timeout=timeout)
        assert r.status == 200, f"normal client: GET ?key={key} answered {r!r}"
        assert r.json() == self.expected[key], f"normal client: wrong answer for {key}: {r.body!r}"
        r = self.get("/v1/status?prefix=small/&limit=1000", timeout=timeout)
        assert r.status == 200, f"normal client: listing answered {r!r}"
        assert r.json() == {"entries": self.listing("small/")}, f"normal client: wrong listing {r.body[:500]!r}"

    def rss_mb(self):
        return self.relay.rss_mb()


def upload_many(relay, items, window=48, timeout=20.0):
    """Upload (key, data) pairs over one agent connection, `window` streams at a time."""
    c = relay.session()
    try:
        todo = list(reversed(items))
        inflight = {}
        deadline = time.monotonic() + timeout
        while todo or inflight:
            while todo and len(inflight) < window:
                k, d = todo.pop()
                sid = c.sid()
                c.open(sid, k, d)
                inflight[sid] = (k, d)
            f = c.next_frame(max(0.1, deadline - time.monotonic()),
                             lambda f: f["type"] in ("OFFSET", "RESULT", "ERROR", "GOAWAY"))
            sid = f["stream"]
            if f["type"] == "OFFSET" and f["disposition"] not in ("STORED", "CONFIRM"):
                k, d = inflight[sid]
                c.chunk(sid, 0, d)
                c.hash(sid, len(d), agentlib.sha1(d))
            elif f["type"] in ("RESULT", "OFFSET") and sid in inflight:
                del inflight[sid]
            else:
                raise AssertionError(f"populating the relay: {agentlib.describe(f)}")
    finally:
        c.close()


# ------------------------------------------------------------------ watching a case: RSS, a normal client during it

class RssWatch(threading.Thread):
    def __init__(self, srelay):
        super().__init__(daemon=True)
        self.srelay = srelay
        self.base = srelay.rss_mb()
        self.peak = self.base
        self.stop_ev = threading.Event()

    def run(self):
        while not self.stop_ev.wait(0.05):
            try:
                self.peak = max(self.peak, self.srelay.rss_mb())
            except OSError:
                return

    def stop(self):
        self.stop_ev.set()
        self.join(5)
        with contextlib.suppress(OSError):
            self.peak = max(self.peak, self.srelay.rss_mb())
        return self.peak - self.base


class NormalPoller(threading.Thread):
    """A normal client asking again and again while an attack runs."""

    def __init__(self, srelay):
        super().__init__(daemon=True)
        self.srelay = srelay
        self.ok = 0
        self.failures = []
        self.stop_ev = threading.Event()

    def run(self):
        while True:  # at least once, however short the attack
            try:
                self.srelay.check_normal(timeout=20.0)
                self.ok += 1
            except BaseException as e:  # noqa: BLE001
                self.failures.append(f"{e.__class__.__name__}: {e}")
            if self.stop_ev.wait(0.1):
                return

    def stop(self):
        self.stop_ev.set()
        self.join(60)


class Guard:
    """(b) and (c) of a case: RSS sampled from start() to finish(); a normal client during (poll) and after."""

    def __init__(self, srelay, poll):
        self.srelay = srelay
        self.poll = poll
        self.watch = None
        self.poller = None
        self.finished = False

    def start(self):
        self.srelay.check_normal()   # warm, and served before
        self.watch = RssWatch(self.srelay)
        self.watch.start()
        if self.poll:
            self.poller = NormalPoller(self.srelay)
            self.poller.start()
        return self

    def stop_threads(self):
        growth = self.watch.stop() if self.watch else 0.0
        if self.poller:
            self.poller.stop()
        return growth

    def finish(self, need_served_during=True):
        self.finished = True
        growth = self.stop_threads()
        r = self.srelay.relay
        assert r.alive(), f"relay died (exit {r.proc.returncode}); log tail:\n{r.log_tail()}"
        print(f"  RSS {self.watch.base:.1f} MB -> peak {self.watch.peak:.1f} MB (+{growth:.1f})"
              + (f"; normal client during: {self.poller.ok} served, {len(self.poller.failures)} failed"
                 if self.poller else ""))
        if self.poller:
            assert not self.poller.failures, (f"a normal client was not served correctly during the attack "
                                              f"({len(self.poller.failures)} of {self.poller.ok + len(self.poller.failures)}): "
                                              f"{self.poller.failures[:3]}")
            if need_served_during:
                assert self.poller.ok >= 1, "no normal request was served during the attack"
        assert growth < RSS_GROWTH_MB, (f"relay RSS grew by {growth:.1f} MB during the case "
                                        f"({self.watch.base:.1f} -> {self.watch.peak:.1f} MB), bound {RSS_GROWTH_MB} MB")
        self.srelay.close_all()
        self.srelay.check_normal()
        return growth


# ------------------------------------------------------------------ fixtures

@pytest.fixture(scope="module")
def relay_binary():
    src = agentlib.relay_bin()
    if not os.path.exists(src):
        pytest.fail(f"relay binary {src} does not exist (set UPLOAD_RELAY_BIN)", pytrace=False)
    d = tempfile.mkdtemp(prefix="hostile-status-bin-")
    try:
        b = shutil.copy2(src, os.path.join(d, "upload-relay"))
        if "--status-listen" not in agentlib.serve_help(b):
            pytest.fail(f"relay binary {src} has no --status-listen", pytrace=False)
        yield b
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def _srelay(relay_binary):
    s = StatusRelay.start(relay_binary)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def _trelay(relay_binary):
    has_timeout = TIMEOUT_OPTION in agentlib.serve_help(relay_binary)
    extra = ["--status-max-connections", str(MAX_CONNECTIONS)]
    if has_timeout:
        extra += [TIMEOUT_OPTION, f"{int(REQUEST_TIMEOUT)}s"]
    s = StatusRelay.start(relay_binary, extra)
    s.request_timeout = REQUEST_TIMEOUT if has_timeout else None
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def srelay(_srelay):
    if not _srelay.relay.alive():
        pytest.fail(f"the module's relay died in an earlier case:\n{_srelay.relay.log_tail()}", pytrace=False)
    try:
        yield _srelay
    finally:
        _srelay.close_all()


@pytest.fixture
def guard():
    """guard(srelay, poll=False).start() ... .finish(): threads stopped and sockets closed even if the case fails."""
    made = []

    def make(srelay, poll=False):
        g = Guard(srelay, poll)
        made.append(g)
        return g

    yield make
    for g in made:
        if not g.finished:
            g.stop_threads()
        g.srelay.close_all()


def wait_relay_closed(srelay, socks, timeout):
    """Waits until the relay's side of each client socket leaves ESTABLISHED (closed by the relay: FIN_WAIT, or gone
    after a reset), seen in /proc/net/tcp without reading. Returns {index: seconds}."""
    t0 = time.monotonic()
    ports = [s.getsockname()[1] for s in socks]
    closed = {}
    while len(closed) < len(ports) and time.monotonic() - t0 < timeout:
        for i, p in enumerate(ports):
            if i not in closed and tcp_info(srelay.port, p)[0] != ESTABLISHED:
                closed[i] = time.monotonic() - t0
        time.sleep(0.02)  # polling /proc/net/tcp: the relay's close is observable only there without reading
    return closed


# ------------------------------------------------------------------ 1. pipelining without reading

def listing_request(srelay, prefix="small/"):
    return http_request(f"/v1/status?prefix={prefix}&limit=1000", srelay.token)


def test_pipelined_within_bound_answered_in_order(srelay, guard):
    """Control: 16 requests sent ahead in one write are all answered, in order, on the same connection."""
    g = guard(srelay).start()
    h = srelay.tls()
    keys = [f"small/k{i % SMALL_KEYS:03d}" for i in range(PIPELINE_BOUND)]
    h.send(b"".join(http_request(f"/v1/status?key={k}", srelay.token) for k in keys))
    for k in keys:
        r = h.response(10)
        assert r.status == 200 and r.json() == srelay.expected[k], f"pipelined ?key={k}: {r!r}"
    h.send(http_request("/v1/status?key=small/k000", srelay.token))
    assert h.response(10).status == 200, "the connection must stay usable after 16 pipelined requests"
    g.finish()


def _flood(h: Http, blob: bytes, total: int, piece=256 * 1024, stall=3.0):
    """Writes `total` bytes of pipelined requests, never reading. Returns (outcome, bytes written, seconds)."""
    t0 = time.monotonic()
    sent = 0
    h.sock.settimeout(stall)
    while sent < total:
        try:
            h.sock.sendall(blob[:min(piece, total - sent)])
        except (socket.timeout, TimeoutError):
            return "stalled", sent, time.monotonic() - t0
        except (OSError, ssl.SSLError) as e:
            return f"closed ({e.__class__.__name__})", sent, time.monotonic() - t0
        sent += min(piece, total - sent)
    return "all-written", sent, time.monotonic() - t0


def test_pipelining_flood_never_reading(srelay, guard):
    """8 clients at once, for about 2.5 s, each again and again: connects, writes up to 8 MiB of pipelined listing
    requests and never reads. Each connection must be closed (more than 16 requests sent ahead) or stop being read;
    RSS bounded; a normal client is served during and after."""
    clients, total, duration, max_rounds = 8, 8 << 20, 2.5, 60
    req = listing_request(srelay)
    blob = req * (256 * 1024 // len(req) + 1)
    g = guard(srelay, poll=True).start()
    rounds = [[] for _ in range(clients)]
    t_end = time.monotonic() + duration

    def run(i):
        while time.monotonic() < t_end and len(rounds[i]) < max_rounds:
            try:
                h = srelay.tls()
                outcome, sent, secs = _flood(h, blob, total)
                closed = h.closed_within(5.0)
                rounds[i].append((outcome, sent, secs, closed, h.buf.count(b"HTTP/1.1 ")))
                h.close()
            except BaseException as e:  # noqa: BLE001
                rounds[i].append((f"error {e!r}", 0, 0.0, False, 0))
                return

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    flat = [r for rs in rounds for r in rs]
    kinds = {}
    for outcome, sent, secs, closed, answers in flat:
        k = f"{outcome.split(' ')[0]}{'+closed' if closed else ''}"
        kinds[k] = kinds.get(k, 0) + 1
    print(f"\n  flood: {len(flat)} connections ({clients} clients), outcomes {kinds}, bytes written before the end: "
          f"{min(r[1] for r in flat)}..{max(r[1] for r in flat)}, answers received: {max(r[4] for r in flat)} at most")
    for outcome, sent, _, closed, answers in flat:
        assert not outcome.startswith("error"), outcome
        assert outcome != "all-written" or closed, \
            f"the relay read all {sent} bytes of pipelined requests from a client that never reads, and kept it open"
        assert closed or outcome == "stalled", f"connection neither closed nor stopped being read: {outcome}"
        assert answers <= PIPELINE_BOUND + 1, f"{answers} answers to a client that never read (bound 17)"
    g.finish()


def test_pipelined_one_over_bound_closes(srelay, guard):
    """18 requests in one write (1 answered + 16 waiting + 1): the connection closes, with at most 17 answers."""
    g = guard(srelay).start()
    h = srelay.tls()
    h.send(http_request("/v1/status?key=small/k000", srelay.token) * (PIPELINE_BOUND + 2))
    closed = h.closed_within(5.0)
    answers = h.buf.count(b"HTTP/1.1 ")
    print(f"\n  18 pipelined: closed={closed}, answers before the close={answers}")
    assert closed, "18 requests sent ahead in one write: the connection must close (more than 16 waiting)"
    assert answers <= PIPELINE_BOUND + 1
    g.finish()


# ------------------------------------------------------------------ 2. big answers never read

def test_big_answers_never_read_bounded(srelay, guard):
    """16 connections (64 KiB receive buffers) each send 16 `prefix=big/&limit=1000` requests (about 300 KB answers)
    and never read; 15 of them then send 16 more. The relay must stop reading them (the 16 more stay unread in its
    socket, and the connections are not closed for pipelining), hold about one answer per connection (RSS growth
    < 40 MiB), and serve a normal client meanwhile. Once the clients are gone, a reader gets all 16 answers, right."""
    size = len(srelay.get("/v1/status?prefix=big/&limit=1000").body)
    assert size > 250_000, f"a big listing is only {size} bytes"
    conns_n = 16
    g = guard(srelay, poll=True).start()
    req = listing_request(srelay, "big/")
    conns = [srelay.tls(rcvbuf=65536) for _ in range(conns_n)]
    for h in conns:
        h.send(req * PIPELINE_BOUND)
    deadline = time.monotonic() + 10.0
    while any(tcp_info(srelay.port, h.sock.getsockname()[1])[2] for h in conns):
        assert time.monotonic() < deadline, "the relay did not read the first 16 requests within 10 s"
        time.sleep(0.05)  # until the relay has read each connection's first 16 (its receive queues empty)
    more = req * PIPELINE_BOUND
    for h in conns[1:]:
        h.send(more)
    time.sleep(2.5)  # the attack: RSS sampled meanwhile, the normal client polling
    infos = [tcp_info(srelay.port, h.sock.getsockname()[1]) for h in conns]
    growth = g.watch.peak - g.watch.base
    unread = [rx for (_, _, rx) in infos[1:]]
    sent_out = [tx for (_, tx, _) in infos]
    print(f"\n  big answers ({size} B), {conns_n} x {PIPELINE_BOUND} never read: RSS +{growth:.1f} MB after 3 s; "
          f"relay-side states {sorted(set(i[0] for i in infos))}; unread by the relay (of {len(more)} B sent later): "
          f"min {min(unread)} max {max(unread)}; relay send queues {min(sent_out)}..{max(sent_out)} B")
    assert all(i[0] == ESTABLISHED for i in infos), \
        f"a connection that sent ahead within the bound, or sent more while unanswered, was closed: {infos}"
    assert min(unread) > 0, ("the relay read requests sent while 16 were unanswered and the client read nothing "
                             f"(its receive queues: {unread})")
    assert growth < RSS_GROWTH_MB, f"relay RSS grew by {growth:.1f} MB holding answers nobody reads"
    for h in conns[1:]:
        h.close()
    want = srelay.get("/v1/status?prefix=big/&limit=1000").json()
    for i in range(PIPELINE_BOUND):
        r = conns[0].response(20)
        assert r.status == 200 and r.json() == want, f"answer {i} once read: {r!r}"
    g.finish()


def test_clean_tls_close_by_the_client_frees_the_connection(srelay, guard):
    """A client that answers the relay's close_notify with its own (a clean TLS shutdown, RFC 8446 6.1) and then waits
    for the relay to close TCP: the relay must close at once, not hold the connection (a --status-max-connections
    place) until NIOSSL's 5 s shutdown timeout because it withholds reads while closing."""
    g = guard(srelay).start()
    h = srelay.tls()
    h.send(http_request("/v1/status?key=small/k000", srelay.token, close=True))
    r = h.response(10)
    assert r.status == 200 and r.headers.get("connection") == "close", repr(r)
    raw = h.sock.unwrap()  # reads the relay's close_notify, sends ours
    srelay.socks.append(raw)
    time.sleep(0.3)
    unread = tcp_info(srelay.port, raw.getsockname()[1])
    closed = wait_relay_closed(srelay, [raw], 8.0)
    print(f"\n  clean TLS close by the client, TCP left open: the relay closed TCP after {closed.get(0)} s; "
          f"0.3 s after our close_notify its socket was {unread} (state, send queue, unread bytes)")
    assert 0 in closed, "the relay never closed the connection after a clean TLS shutdown"
    assert closed[0] <= 1.0, (f"the relay kept the connection {closed[0]:.2f}s after both close_notify were sent "
                              f"(its socket stayed ESTABLISHED, our close_notify unread in it: {unread}): "
                              f"StatusHTTPHandler.read() withholds reads "
                              f"while closing, so NIOSSL never reads the client's close_notify and waits out its "
                              f"shutdown timeout")
    g.finish()


# ------------------------------------------------------------------ 3, 4, 6: request timeout, max connections

class Slow:
    """One connection of the timeout run and what was seen of it."""

    def __init__(self, name, sock, http=None, period=None, trickle=b"", read=True):
        self.name, self.sock, self.http = name, sock, http
        self.port = sock.getsockname()[1]
        self.opened = time.monotonic()
        self.deadline_from = self.opened   # when the relay's request deadline was (re)armed, as far as the client knows
        self.period, self.trickle, self.sent, self.next_send = period, trickle, 0, self.opened
        self.read = read                   # the client reads (a close is then seen by it)
        self.client_close = None           # seconds from deadline_from: EOF/close_notify/reset seen by the client
        self.tcp_close = None              # seconds from deadline_from: the relay's side left ESTABLISHED
        self.got = b""                     # what the client read after deadline_from
        self.last_progress = self.opened   # last change of the relay's send queue
        self.last_tx = -1
        self.note = ""


class TimeoutRun:
    pass


def _run_timeouts(tr, T):
    """Opens at once, on the relay with --status-request-timeout T and --status-max-connections 8, eight
    connections that misbehave in time, checks a 9th is closed at accept, and watches them close (each as seen by the
    client and as seen in /proc/net/tcp), then when a normal client is served again."""
    run = TimeoutRun()
    run.T = T
    run.watch = RssWatch(tr)
    run.watch.start()
    head = http_request("/v1/status?key=small/k000", tr.token)
    slows = []
    try:
        s = tr.tcp()
        slows.append(Slow("silent TCP", s, read=True))
        s = tr.tcp()
        s.sendall(client_hello(tr))
        slows.append(Slow("ClientHello then silence", s, read=True))
        for period in (1.0, 2.0):
            h = tr.tls()
            slows.append(Slow(f"head at 1 byte per {period:.0f} s", h.sock, h, period, head[:-4]))
        h = tr.tls()
        h.send(http_request("/v1/status?key=small/k001", tr.token))
        r = h.response(10)
        assert r.status == 200 and r.json() == tr.expected["small/k001"], f"idle case: first answer {r!r}"
        slows.append(Slow("silence after an answer", h.sock, h))
        h = tr.tls()
        h.send(http_request("/v1/status?key=small/k002", tr.token))
        r = h.response(10)
        assert r.status == 200, f"second-head case: first answer {r!r}"
        slows.append(Slow("answer, then the next head at 1 byte per s", h.sock, h, 1.0, head[:-4]))
        h = tr.tls()
        h.send(http_request("/v1/status?key=small/k000", tr.token, ["Content-Length: 100000"]))
        slows.append(Slow("head announcing a body, none sent", h.sock, h))
        h = tr.tls(rcvbuf=65536)
        h.send(listing_request(tr, "big/") * PIPELINE_BOUND)
        slows.append(Slow("16 big answers never read", h.sock, h, read=False))
        assert len(slows) == MAX_CONNECTIONS

        # the 9th: closed at accept, before any TLS; and so is a normal client while the 8 hold every place
        raw = tr.tcp(timeout=5.0)
        t0 = time.monotonic()
        try:
            tr.context().wrap_socket(raw, server_hostname="localhost")
            run.ninth = "TLS handshake completed"
        except (OSError, ssl.SSLError) as e:
            run.ninth = f"closed ({e.__class__.__name__}: {e})"
        run.ninth_s = time.monotonic() - t0
        try:
            tr.check_normal(timeout=3.0)
            run.normal_during = "served"
        except (AssertionError, OSError, ssl.SSLError, Closed, TimeoutError) as e:
            run.normal_during = f"refused ({e.__class__.__name__})"

        stop = time.monotonic() + T + TLS_SHUTDOWN_GRACE + SLACK + 8.0
        run.served_again = None
        while time.monotonic() < stop:
            now = time.monotonic()
            for c in slows:
                if c.tcp_close is None:
                    st, tx, _ = tcp_info(tr.port, c.port)
                    if st != ESTABLISHED:
                        c.tcp_close = now - c.deadline_from
                    elif tx != c.last_tx:
                        c.last_tx, c.last_progress = tx, now
                if c.period and c.client_close is None and c.tcp_close is None and now >= c.next_send \
                        and c.sent < len(c.trickle):
                    c.http.try_send(c.trickle[c.sent:c.sent + 1])
                    c.sent += 1
                    c.next_send += c.period
            readable = [c for c in slows if c.read and c.client_close is None]
            if readable:
                ready, _, _ = select.select([c.sock for c in readable], [], [], 0.02)
                for c in readable:
                    if c.sock not in ready and not (c.http and c.sock.pending()):
                        continue
                    try:
                        if c.http:
                            c.http.fill(time.monotonic() + 0.05)
                            c.got, c.http.buf = c.got + c.http.buf, b""
                        else:
                            c.sock.settimeout(0.05)
                            d = c.sock.recv(65536)
                            if not d:
                                raise Closed("EOF")
                    except (Closed, OSError, ssl.SSLError) as e:
                        c.client_close = time.monotonic() - c.deadline_from
                        c.note = str(e)[:80]
            if all(c.tcp_close is not None for c in slows):
                break
            time.sleep(0.02)  # pacing the trickles and the /proc/net/tcp polling
        # the places are given back once the relay closed the connections: a normal client is served again
        t0 = time.monotonic()
        seen = [c.deadline_from + c.client_close for c in slows if c.client_close is not None]
        while time.monotonic() - t0 < 10.0:
            try:
                tr.check_normal(timeout=3.0)
                run.served_again = time.monotonic() - t0
                run.served_after_client_close = time.monotonic() - max(seen) if seen else None
                break
            except (OSError, ssl.SSLError, Closed, TimeoutError):
                time.sleep(0.1)  # a place frees when the relay's channel has closed
        run.slows = {c.name: c for c in slows}
        print("\n  timeout run (T = %.0fs, seconds from the connection opening or the last answer):" % T)
        for c in slows:
            print(f"    {c.name}: client saw the close at {c.client_close}, relay's TCP close at "
                  f"{None if c.tcp_close is None else round(c.tcp_close, 2)}, "
                  f"last send-queue change at {round(c.last_progress - c.deadline_from, 2)}, got {len(c.got)} B "
                  f"{c.got[:40]!r} {c.note}")
        print(f"    9th connection: {run.ninth} after {run.ninth_s:.2f}s; normal client meanwhile: {run.normal_during}; "
              f"served again {run.served_again} s after the relay's last TCP close, "
              f"{getattr(run, 'served_after_client_close', None)} s after the last close a client saw")
    finally:
        run.growth = run.watch.stop()
        print(f"    RSS {run.watch.base:.1f} MB -> peak {run.watch.peak:.1f} MB (+{run.growth:.1f})")
        for c in slows:
            with contextlib.suppress(OSError):
                c.sock.close()
        tr.close_all()
    return run


@pytest.fixture(scope="module")
def timeout_run(_trelay):
    if _trelay.request_timeout is None:
        return None
    return _run_timeouts(_trelay, _trelay.request_timeout)


def _slow(timeout_run, name):
    if timeout_run is None:
        pytest.xfail(f"the relay binary has no {TIMEOUT_OPTION}: these cases would wait the 30 s default "
                     f"(target: serve gains {TIMEOUT_OPTION} <duration>)")
    return timeout_run.slows[name], timeout_run.T


def _assert_closed_at_timeout(c, T, client_sees=True):
    if client_sees:
        assert c.client_close is not None, f"{c.name}: the client saw no close ({T + TLS_SHUTDOWN_GRACE + SLACK + 8:.0f}s)"
        assert T - 1.0 <= c.client_close <= T + SLACK, \
            f"{c.name}: the client saw the close {c.client_close:.2f}s after the connection opened/the last answer, " \
            f"request timeout {T}s"
    assert c.tcp_close is not None, f"{c.name}: the relay's side still ESTABLISHED past the timeout"
    assert c.tcp_close <= T + TLS_SHUTDOWN_GRACE + SLACK, \
        f"{c.name}: the relay's TCP close came {c.tcp_close:.2f}s after, bound {T}s + {TLS_SHUTDOWN_GRACE}s TLS grace"
    assert b"HTTP/" not in c.got, f"{c.name}: answered {c.got[:200]!r}"


def test_timeout_silent_tcp(timeout_run):
    """6: a TCP connection that never starts TLS is closed at the request timeout (TLS handshake included)."""
    c, T = _slow(timeout_run, "silent TCP")
    _assert_closed_at_timeout(c, T)


def test_timeout_client_hello_then_silence(timeout_run):
    """6: a ClientHello, then nothing: closed at the request timeout."""
    c, T = _slow(timeout_run, "ClientHello then silence")
    _assert_closed_at_timeout(c, T)


def test_timeout_slowloris_head(timeout_run):
    """3: a request head sent one byte per second (and one per 2 s) never completes: closed at the request timeout,
    unanswered."""
    for name in ("head at 1 byte per 1 s", "head at 1 byte per 2 s"):
        c, T = _slow(timeout_run, name)
        _assert_closed_at_timeout(c, T)
        assert c.sent >= 2, f"{name}: only {c.sent} bytes trickled"


def test_timeout_silence_after_an_answer(timeout_run):
    """4: one request answered, then silence: closed at the request timeout after the answer."""
    c, T = _slow(timeout_run, "silence after an answer")
    _assert_closed_at_timeout(c, T)


def test_timeout_slow_second_head(timeout_run):
    """3+4: one request answered, then the next head one byte per second: closed at the timeout after the answer."""
    c, T = _slow(timeout_run, "answer, then the next head at 1 byte per s")
    _assert_closed_at_timeout(c, T)


def test_timeout_head_announcing_a_body_never_sent(timeout_run):
    """8: a head with Content-Length: 100000 and no body: closed at the request timeout (a 413 then would be welcome,
    not required: no body byte arrived)."""
    c, T = _slow(timeout_run, "head announcing a body, none sent")
    if c.got.startswith(b"HTTP/1.1 413"):
        c.got = b""
    _assert_closed_at_timeout(c, T)


def test_timeout_big_answers_never_read(timeout_run):
    """2: 16 big answers never read: the relay writes what the socket takes, then its write waits; the connection
    is closed within the request timeout of the last answer written (seen as the relay's side leaving ESTABLISHED,
    counted from the last change of its send queue: the client does not read)."""
    c, T = _slow(timeout_run, "16 big answers never read")
    assert c.tcp_close is not None, f"{c.name}: still ESTABLISHED"
    after_progress = c.tcp_close + c.deadline_from - c.last_progress
    assert after_progress <= T + TLS_SHUTDOWN_GRACE + SLACK, \
        f"{c.name}: closed {after_progress:.2f}s after its last write progressed, bound {T}s + {TLS_SHUTDOWN_GRACE}s"


def test_max_connections_ninth_closed_at_accept_then_served_again(timeout_run):
    """3: with 8 slow connections and --status-max-connections 8, a 9th is closed at accept, before TLS; a normal
    client too; once the relay has closed the slow ones, a normal client is served again at once; RSS bounded."""
    _slow(timeout_run, "silent TCP")
    r = timeout_run
    assert r.ninth.startswith("closed"), f"a 9th connection was taken past --status-max-connections 8: {r.ninth}"
    assert r.ninth_s < 3.0, f"the 9th connection was closed only after {r.ninth_s:.1f}s"
    assert r.normal_during.startswith("refused"), "a normal client was served while 8 slow connections held every place"
    assert r.served_again is not None, "no normal client served within 10 s after the slow connections were closed"
    assert r.served_again <= SLACK, f"a normal client was served only {r.served_again:.1f}s after the slow ones closed"
    assert r.growth < RSS_GROWTH_MB, f"relay RSS grew by {r.growth:.1f} MB during the timeout run"


# ------------------------------------------------------------------ 5. oversized heads

def test_oversized_heads(srelay, guard):
    """A 200 KB URI, a 100 KB header, 1000 headers, 17 KiB of headers in small ones: 4xx or closed, never 2xx/5xx;
    4 of each at once; RSS bounded. Control: a 4 KB header is fine."""
    g = guard(srelay, poll=True).start()
    tok = srelay.token
    cases = {
        "200 KB URI": http_request("/v1/status?prefix=" + "a" * 200_000, tok),
        "100 KB header": http_request("/v1/status?key=small/k000", tok, [f"X-Big: {'b' * 100_000}"]),
        "1000 headers": http_request("/v1/status?key=small/k000", tok, [f"X-H{i}: v" for i in range(1000)]),
        "17 KiB in 60 headers": http_request("/v1/status?key=small/k000", tok, [f"X-H{i}: {'c' * 290}" for i in range(60)]),
        "200 KB in one Authorization": http_request("/v1/status?key=small/k000", "t" * 200_000),
    }
    seen = {}
    for name, data in cases.items():
        conns = [srelay.tls() for _ in range(4)]
        outs = []
        for h in conns:
            h.try_send(data)
        for h in conns:
            r = expect_answer_or_close(h, 10.0)
            if r is not None:
                assert 400 <= r.status < 500, f"{name}: answered {r!r}"
                assert h.closed_within(5.0), f"{name}: answered {r.status} but the connection stays open"
            outs.append(r.status if r else "closed")
        seen[name] = outs
    print("\n  oversized heads: " + "; ".join(f"{k}: {v}" for k, v in seen.items()))
    r = srelay.get("/v1/status?key=small/k002", extra=[f"X-Pad: {'p' * 4000}"])
    assert r.status == 200 and r.json() == srelay.expected["small/k002"], f"a 4 KB header: {r!r}"
    g.finish()


def test_oversized_head_refusal_says_why(srelay, guard):
    """README: "Refusals carry {"error": "..."} saying what was wrong: ... 400 for ... a request head over 16 KiB".
    A 20 KB header on a keep-alive request: 400, JSON with an `error`."""
    g = guard(srelay).start()
    h = srelay.tls()
    h.send(http_request("/v1/status?key=small/k000", srelay.token, [f"X-Big: {'b' * 20_000}"]))
    r = expect_answer_or_close(h, 10.0)
    print(f"\n  20 KB header: {r!r} headers {r.headers if r else None}")
    assert r is not None, "closed without an answer"
    assert r.status == 400, repr(r)
    assert r.headers.get("content-type", "").startswith("application/json") and r.body, \
        (f"the 400 for a head over 16 KiB carries no JSON error (README: refusals carry {{\"error\": ...}}): "
         f"headers {r.headers}, body {r.body!r}; it comes from NIO's HTTPServerProtocolErrorHandler, not StatusHTTPHandler")
    assert "error" in r.json(), r.body
    g.finish()


# ------------------------------------------------------------------ 6. bad TLS

def client_hello(srelay) -> bytes:
    """The bytes of a real TLS 1.3 ClientHello (made through a memory BIO)."""
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = srelay.context().wrap_bio(inc, out, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        obj.do_handshake()
    data = out.read()
    assert data[:1] == b"\x16", data[:16]
    return data


def _raw_outcome(s, timeout=5.0):
    """What comes back on a raw socket until it closes: (closed, bytes)."""
    got = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            d = s.recv(65536)
            if not d:
                return True, got
            got += d
    except (socket.timeout, TimeoutError):
        return False, got
    except OSError:
        return True, got
    return False, got


def test_bad_tls(srelay, guard):
    """Plain HTTP to the TLS port, garbage, a TLS record announcing 16 MB, an aborted handshake (RST after the
    ServerHello), a handshake closed cleanly mid-way: each closed, nothing in clear text back."""
    g = guard(srelay, poll=True).start()
    outcomes = {}

    def plain(data):
        s = srelay.tcp()
        s.sendall(data)
        return _raw_outcome(s)

    outcomes["plain HTTP"] = plain(http_request("/v1/status?key=small/k000", srelay.token))
    outcomes["garbage"] = plain(os.urandom(4096))
    outcomes["bad record"] = plain(b"\x16\x03\x01\xff\xff" + os.urandom(64) + b"\x17\x03\x03\x40\x00" + b"\0" * 32)
    for name, (closed, got) in outcomes.items():
        assert closed, f"{name}: connection not closed within 5 s"
        assert b"HTTP/" not in got, f"{name}: answered in clear text: {got[:200]!r}"
        assert not got or got[:1] == b"\x15", f"{name}: sent something but a TLS alert: {got[:32]!r}"

    s = srelay.tcp()
    s.sendall(client_hello(srelay))
    s.settimeout(5.0)
    first = s.recv(65536)
    assert first[:1] == b"\x16", f"no ServerHello: {first[:32]!r}"
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()  # RST mid-handshake
    outcomes["ClientHello, ServerHello, RST"] = (True, b"")
    print("\n  bad TLS: " + "; ".join(f"{k}: closed={c}, {len(b)} B back ({b[:7].hex()})" for k, (c, b) in outcomes.items()))
    g.finish()


def test_many_aborted_connections_give_places_back(srelay, guard):
    """300 aborted connections (more than --status-max-connections 256): garbage, RST mid-handshake, half a
    ClientHello then close. If places were not given back, the endpoint would refuse everyone after 256."""
    g = guard(srelay, poll=True).start()
    hello = client_hello(srelay)
    t0 = time.monotonic()
    for i in range(300):
        s = srelay.tcp()
        kind = i % 3
        try:
            if kind == 0:
                s.sendall(b"GARBAGE\r\n" * 10)
            elif kind == 1:
                s.sendall(hello)
                s.settimeout(5.0)
                s.recv(1)
            else:
                s.sendall(hello[: len(hello) // 2])
            if kind != 2:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        s.close()
        srelay.socks.remove(s)
    print(f"\n  300 aborted connections in {time.monotonic() - t0:.1f}s")
    g.finish()


# ------------------------------------------------------------------ 7. percent-encoding and control bytes

BAD_VALUES = {
    "%zz": "percent-encoded", "%4": "percent-encoded", "%FF": "percent-encoded", "%C0%AF": "percent-encoded",
    "a%": "percent-encoded", "%%41": "percent-encoded", "%E2%82": "percent-encoded",
    "%ED%A0%80": "percent-encoded", "%F4%90%80%80": "percent-encoded", "%F8%88%80%80%80": "percent-encoded",
    "%00": "control byte", "%0A": "control byte", "%7F": "control byte", "small%00": "control byte",
    "small/%0D%0AX-Injected:%20yes": "control byte", "%1F": "control byte", "%09": "control byte",
}


def _check_refusal(r: Resp, what: str, param: str, reason: str):
    assert r.status != 200, f"{what}: answered 200 {r.body[:300]!r} (an unfiltered listing?)"
    assert r.status < 500, f"{what}: answered {r!r}"
    assert r.status == 400, f"{what}: want 400, got {r!r}"
    assert r.headers.get("content-type", "").startswith("application/json"), f"{what}: {r.headers}"
    body = r.json()
    assert isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str), f"{what}: {r.body!r}"
    assert f'"{param}"' in body["error"] and reason in body["error"], f"{what}: error does not explain: {body['error']!r}"


def test_bad_percent_encoding_and_control_bytes(srelay, guard):
    """Each bad value in key, prefix and after: 400 with a JSON `error` naming the parameter and what is wrong;
    never a 200 (an unfiltered listing), never a 5xx. All on one keep-alive connection: each 400 keeps it usable."""
    g = guard(srelay).start()
    h = srelay.tls()
    n = 0
    for value, reason in BAD_VALUES.items():
        for param, target in (("key", f"/v1/status?key={value}"),
                              ("prefix", f"/v1/status?prefix={value}&limit=1000"),
                              ("after", f"/v1/status?prefix=&after={value}&limit=1000"),
                              ("after", f"/v1/status?prefix=small/&after={value}")):
            h.send(http_request(target, srelay.token))
            r = h.response(10)
            _check_refusal(r, target, param, reason)
            n += 1
    # a bad value is refused even without a token, and whatever the other parameters say
    for target, param, reason in (("/v1/status?prefix=%00", "prefix", "control byte"),
                                  ("/v1/status?limit=1&prefix=%zz", "prefix", "percent-encoded")):
        h.send(http_request(target, None))
        r = h.response(10)
        _check_refusal(r, target + " (no token)", param, reason)
    # percent-encoded parameter names and separators are not decoded into parameters
    for target in ("/v1/status?%6Bey=small/k000", "/v1/status?prefix%3Dsmall/", "/v1/status?prefix=small/&prefix=big/",
                   "/v1/status?key=small/k000&key=small/k001", "/v1/status?key=small/k000&prefix=small/"):
        h.send(http_request(target, srelay.token))
        r = h.response(10)
        assert r.status == 400 and "error" in r.json(), f"{target}: {r!r}"
    print(f"\n  {n} bad values refused 400 with an explaining JSON error")
    g.finish()


def test_raw_bytes_in_the_uri(srelay, guard):
    """Control and non-UTF-8 bytes sent raw (not percent-encoded) in the request line: 400 or closed, never a 200
    listing that ignores them, never a 5xx."""
    g = guard(srelay).start()
    seen = {}
    for raw in (b"\x00", b"\x7f", b"\x01", b"\x0b", b"\xff", b"\xc0\xaf", b"\x1b[2J"):
        for target in (b"/v1/status?key=small/k000" + raw, b"/v1/status?prefix=" + raw + b"&limit=1000"):
            h = srelay.tls()
            h.send(b"GET " + target + b" HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer "
                   + srelay.token.encode() + b"\r\n\r\n")
            r = expect_answer_or_close(h, 10.0)
            seen[target] = r.status if r else "closed"
            if r is not None:
                assert r.status < 500, f"{target!r}: {r!r}"
                if r.status == 200:
                    body = r.json()
                    assert "entries" not in body or all(raw.decode("utf-8", "replace") in e["key"] for e in body["entries"]), \
                        f"{target!r}: a 200 listing that ignores the raw bytes: {r.body[:300]!r}"
                    assert "entries" in body or body.get("key", "").endswith(raw.decode("utf-8", "replace")), \
                        f"{target!r}: answered for another key: {r.body[:300]!r}"
            h.close()
    print("\n  raw bytes: " + "; ".join(f"{k[10:]!r}: {v}" for k, v in seen.items()))
    g.finish()


# ------------------------------------------------------------------ 8. bodies

def test_bodies_refused_413_and_closed(srelay, guard):
    """Content-Length 100000 (body sent), chunked (8 KiB), a 10-byte body: 413 with a JSON error, then closed."""
    g = guard(srelay).start()
    tok = srelay.token
    cases = {
        "Content-Length 100000": http_request("/v1/status?key=small/k000", tok, ["Content-Length: 100000"]) + b"z" * 100000,
        "chunked 8 KiB": http_request("/v1/status?key=small/k000", tok, ["Transfer-Encoding: chunked"])
        + b"2000\r\n" + b"z" * 0x2000 + b"\r\n0\r\n\r\n",
        "chunked, never ending": http_request("/v1/status?key=small/k000", tok, ["Transfer-Encoding: chunked"])
        + (b"400\r\n" + b"z" * 0x400 + b"\r\n") * 64,
        "Content-Length 10": http_request("/v1/status?key=small/k000", tok, ["Content-Length: 10"]) + b"0123456789",
        "POST with a body": http_request("/v1/status?key=small/k000", tok, ["Content-Length: 5000"], method="POST") + b"p" * 5000,
    }
    seen = {}
    for name, data in cases.items():
        h = srelay.tls()
        h.try_send(data)
        r = expect_answer_or_close(h, 10.0)
        assert r is not None, f"{name}: closed without an answer"
        seen[name] = r.status
        if name.startswith("POST"):
            assert r.status in (405, 413), f"{name}: {r!r}"
        else:
            assert r.status == 413, f"{name}: want 413, got {r!r}"
        assert "error" in r.json(), f"{name}: {r.body!r}"
        assert r.headers.get("connection", "").lower() == "close", f"{name}: no Connection: close: {r.headers}"
        assert h.closed_within(5.0), f"{name}: answered {r.status} but the connection stays open"
        assert b"HTTP/" not in h.buf, f"{name}: a second answer after the refusal: {h.buf[:200]!r}"
    print("\n  bodies: " + "; ".join(f"{k}: {v}" for k, v in seen.items()))
    g.finish()
