"""agentlib: a small synchronous (mis)behaving agent for the hostile test suite.

Standard library only. Frames are built and parsed with the independent codec
tools/spec-check/wire.py (written from protocol/SPEC.md). Section references (§)
are to protocol/SPEC.md.

    relay = Relay.start(extra_args)          # a real `upload-relay serve --dev` process
    c = relay.connect()                      # TLS 1.3 + ALPN "upload/1"
    w = c.hello()                            # HELLO -> WELCOME (dict)
    c.open(1, "k", data=b"...")              # OPEN with SIZE_KNOWN|SHA1_KNOWN
    c.chunk(1, 0, b"...")                    # CHUNK with the right CRC-32
    res = c.upload_honest("key", b"data")    # full upload -> RESULT frame dict
"""
from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections import deque

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tools", "spec-check"))
import wire  # noqa: E402

ALPN = "upload/1"
AGENT_MAX_FRAME = 1114112
ZERO_SHA1 = bytes(20)
SIZE_KNOWN, SHA1_KNOWN, OVERWRITE = 0x01, 0x02, 0x04
DEFLATED = 0x01
RSS_LIMIT_MB = 400
EMPTY_SHA1 = hashlib.sha1(b"").digest()


def relay_bin() -> str:
    b = os.environ.get("UPLOAD_RELAY_BIN")
    if b:
        return b
    return os.path.join(REPO, ".build/debug/upload-relay")


_HELP_CACHE: dict = {}


def serve_help(binary: str) -> str:
    if binary not in _HELP_CACHE:
        p = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True, timeout=30)
        _HELP_CACHE[binary] = p.stdout + p.stderr
    return _HELP_CACHE[binary]


def sha1(b: bytes) -> bytes:
    return hashlib.sha1(b).digest()


def crc(b: bytes) -> int:
    return zlib.crc32(b) & 0xFFFFFFFF


def pattern(n: int, seed: int = 0) -> bytes:
    """Incompressible bytes, unique per call (the relay may dedup equal content within an account, §7)."""
    return os.urandom(n)


def uniq(b: bytes) -> bytes:
    """b with a random suffix, so that no other object of the account has the same content."""
    return b + b" #" + os.urandom(6).hex().encode()


# ------------------------------------------------------------------ frame builders
# Every layout comes from wire.encode (the independent codec), which checks nothing: the builders take any value, so a
# test can send what no honest agent would (a wrong CRC, a bad magic, a length that lies).

def frame(type_: int, flags: int, stream: int, payload: bytes) -> bytes:
    return wire.raw_frame(type_, flags, stream, payload)


def s16(b) -> bytes:
    """A 16-bit length, then the bytes (a string as UTF-8)."""
    b = b.encode() if isinstance(b, str) else bytes(b)
    return struct.pack(">H", len(b)) + b


def b8(b: bytes) -> bytes:
    """An 8-bit length, then the bytes."""
    return struct.pack(">B", len(b)) + b


def _payload(f: dict) -> bytes:
    """The payload wire.encode lays out for the frame `f` (its header dropped)."""
    return wire.encode(f)[wire.HEADER_SIZE:]


def _bytes(b) -> bytes:
    return b.encode() if isinstance(b, str) else bytes(b)


def hello_payload(token: bytes, min_v=1, max_v=1, max_frame=AGENT_MAX_FRAME, features=1, auth=1,
                  name: bytes = b"hostile/1", magic=b"UPLD") -> bytes:
    return _payload({"type": "HELLO", "magic": magic, "min_version": min_v, "max_version": max_v,
                     "max_frame_size": max_frame, "features": features, "auth_method": auth,
                     "credential": _bytes(token).hex(), "agent_name": name})


def hello_frame(token: bytes, **kw) -> bytes:
    return frame(0x01, 0, 0, hello_payload(token, **kw))


def open_payload(key, size=0, sha=ZERO_SHA1, fp=b"", token=b"") -> bytes:
    return _payload({"type": "OPEN", "key": _bytes(key), "size": size, "sha1": sha.hex(), "fingerprint": fp.hex(),
                     "resume_token": token.hex()})


def open_frame(sid, key, size=0, sha=ZERO_SHA1, flags=None, fp=b"", token=b"") -> bytes:
    if flags is None:
        flags = (SIZE_KNOWN if size else 0) | (SHA1_KNOWN if sha != ZERO_SHA1 else 0)
    return frame(0x03, flags, sid, open_payload(key, size, sha, fp, token))


def chunk_frame(sid, offset, data: bytes, crc32=None, flags=0, raw_length=None) -> bytes:
    f = {"type": "CHUNK", "flags": flags, "stream": sid, "offset": offset,
         "crc32": crc(data) if crc32 is None else crc32, "data": data.hex()}
    if raw_length is not None:
        f["raw_length"] = raw_length
    return wire.encode(f)


def deflated_chunk_frame(sid, offset, raw: bytes, crc32=None, raw_length=None, z: bytes | None = None) -> bytes:
    if z is None:
        z = zlib.compress(raw, 6)
    return chunk_frame(sid, offset, z, crc32=crc(raw) if crc32 is None else crc32, flags=DEFLATED,
                       raw_length=len(raw) if raw_length is None else raw_length)


def hash_frame(sid, size, sha: bytes) -> bytes:
    return wire.encode({"type": "HASH", "stream": sid, "size": size, "sha1": sha.hex()})


def cancel_frame(sid, code=0x12, msg=b"") -> bytes:
    return wire.encode({"type": "CANCEL", "stream": sid, "code": code, "message": msg})


def error_frame(sid, code, msg=b"") -> bytes:
    return wire.encode({"type": "ERROR", "stream": sid, "code": code, "message": msg})


def ping_frame(data=b"hostile!") -> bytes:
    return wire.encode({"type": "PING", "data": data.hex()})


def pong_frame(data=b"hostile!") -> bytes:
    return wire.encode({"type": "PONG", "data": data.hex()})


def goaway_frame(last, code=0, msg=b"") -> bytes:
    return wire.encode({"type": "GOAWAY", "last_stream_id": last, "code": code, "message": msg})


# ------------------------------------------------------------------ errors

class Closed(Exception):
    """The relay closed the connection (EOF or reset)."""


class NoFrame(Exception):
    """Nothing (matching) arrived within the timeout."""


def describe(f) -> str:
    if f is None:
        return "nothing"
    t = f["type"]
    if t == "ERROR":
        return f"ERROR({f['stream']}, {f['code']}, {f['message']!r})"
    if t == "OFFSET":
        return f"OFFSET({f['stream']}, {f['disposition']}, {f['offset']})"
    if t == "RESULT":
        return f"RESULT({f['stream']}, {f['status']}, {f['size']})"
    if t in ("CREDIT",):
        return f"CREDIT({f['stream']}, {f['increment']})"
    if t == "ACK":
        return f"ACK({f['stream']}, {f['offset']})"
    if t == "WELCOME":
        return f"WELCOME(account={f['account']!r})"
    return f"{t}({f['stream']})"


# ------------------------------------------------------------------ connection

class Transport:
    """A socket (TLS or plain) read into a buffer with deadlines: what the framed and the HTTP clients share."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.closed = False
        self.close_reason = ""

    def send(self, data: bytes):
        self.sock.sendall(data)

    def try_send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except (OSError, ssl.SSLError):
            return False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def fill(self, deadline: float) -> bool:
        """Read more bytes; False on timeout. Raises Closed on EOF/reset."""
        if self.closed:
            raise Closed(self.close_reason)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(262144)
        except (socket.timeout, TimeoutError):
            return False
        except ssl.SSLWantReadError:
            return True
        except (ConnectionResetError, BrokenPipeError, ssl.SSLError, OSError) as e:
            self.closed = True
            self.close_reason = f"reset ({e.__class__.__name__}: {e})"
            raise Closed(self.close_reason)
        if not data:
            self.closed = True
            self.close_reason = "EOF"
            raise Closed("EOF")
        self.buf += data
        return True


class Conn(Transport):
    def __init__(self, relay: "Relay", sock):
        super().__init__(sock)
        self.relay = relay
        self.pending: deque = deque()
        self.seen: list = []           # every frame received, in order
        self.conn_error = None         # ERROR(0) frame, if received
        self.welcome = None
        self.max_recv = AGENT_MAX_FRAME
        self.conn_window = 0
        self.stream_window: dict = {}
        self.acks: dict = {}           # stream -> highest ACK offset
        self.credit0 = 0               # total CREDIT(0) received
        self.closed_streams: dict = {}  # stream -> the frame that closed it at the relay
        self.next_sid = 1

    def _parse_one(self):
        try:
            f, n = wire.decode(self.buf, self.max_recv)
        except wire.WireError as e:
            raise AssertionError(f"relay sent an undecodable frame: {e} (bytes {self.buf[:64].hex()})")
        if f is None:
            return None
        self.buf = self.buf[n:]
        self.seen.append(f)
        t, sid = f["type"], f["stream"]
        # relay-side rules checked on every frame (§4.4 "CLOSED: nothing may be sent", §6.1 ACK increases)
        if sid != 0 and sid in self.closed_streams and t in ("OFFSET", "ACK", "CREDIT", "RESULT", "ERROR"):
            raise AssertionError(f"relay sent {describe(f)} on stream {sid} after closing it with "
                                 f"{self.closed_streams[sid]} (§4.4: nothing may be sent on a CLOSED stream)")
        if t == "ACK" and sid in self.acks and f["offset"] <= self.acks[sid]:
            raise AssertionError(f"relay sent {describe(f)} not above the previous ACK/OFFSET {self.acks[sid]} (§6.1)")
        if t in ("RESULT", "ERROR") and sid != 0 or t == "OFFSET" and f["disposition"] in ("STORED", "CONFIRM"):
            self.closed_streams[sid] = describe(f)
        if t == "WELCOME":
            self.welcome = f
            self.conn_window = f["connection_window"]
        elif t == "CREDIT":
            if sid == 0:
                self.conn_window += f["increment"]
                self.credit0 += f["increment"]
            else:
                self.stream_window[sid] = self.stream_window.get(sid, 0) + f["increment"]
        elif t == "OFFSET" and f["disposition"] not in ("STORED", "CONFIRM"):
            self.stream_window[sid] = self.welcome["stream_window"] if self.welcome else 0
            self.acks[sid] = f["offset"]
        elif t == "ACK":
            self.acks[sid] = max(self.acks.get(sid, 0), f["offset"])
        elif t == "ERROR" and sid == 0:
            self.conn_error = f
        return f

    def _pump(self, deadline) -> bool:
        """Parse frames into pending; read once if none. False on timeout."""
        f = self._parse_one()
        if f is not None:
            self.pending.append(f)
            return True
        if not self.fill(deadline):
            return False
        while True:
            f = self._parse_one()
            if f is None:
                break
            self.pending.append(f)
        return True

    def next_frame(self, timeout=5.0, match=None):
        """First pending/arriving frame satisfying match (default any), removed from pending.
        Raises NoFrame on timeout, Closed if the connection ends first."""
        deadline = time.monotonic() + timeout
        while True:
            for i, f in enumerate(self.pending):
                if match is None or match(f):
                    del self.pending[i]
                    return f
            try:
                ok = self._pump(deadline)
            except Closed:
                for i, f in enumerate(self.pending):
                    if match is None or match(f):
                        del self.pending[i]
                        return f
                raise
            if not ok:
                raise NoFrame(f"no matching frame within {timeout}s; seen: {self.summary()}")

    def summary(self, n=8) -> str:
        s = ", ".join(describe(f) for f in self.seen[-n:])
        return f"[{s}]" + (f" then {self.close_reason}" if self.closed else "")

    # -- handshake
    def hello(self, token=None, features=1, expect_welcome=True, **kw):
        if token is None:
            token = self.relay.token
        tok = token.encode() if isinstance(token, str) else token
        self.send(hello_frame(tok, features=features, **kw))
        if not expect_welcome:
            return None
        try:
            f = self.next_frame(10.0)
        except (Closed, NoFrame) as e:
            raise AssertionError(f"expected WELCOME, got {e}")
        assert f["type"] == "WELCOME", f"expected WELCOME, got {describe(f)}"
        return f

    # -- stream helpers
    def sid(self) -> int:
        s = self.next_sid
        self.next_sid += 2
        return s

    def open(self, sid, key, data: bytes | None = None, size=None, sha=None, flags=None, fp=b"", token=b"",
             overwrite=False):
        if data is not None:
            size = len(data) if size is None else size
            sha = sha1(data) if sha is None else sha
        size = 0 if size is None else size
        sha = ZERO_SHA1 if sha is None else sha
        if flags is None:
            flags = (SIZE_KNOWN if data is not None or size else 0) | (SHA1_KNOWN if data is not None or sha != ZERO_SHA1 else 0)
            if overwrite:
                flags |= OVERWRITE
        self.send(open_frame(sid, key, size, sha, flags, fp, token))

    def chunk(self, sid, offset, data, **kw):
        self.send(chunk_frame(sid, offset, data, **kw))
        self.conn_window -= len(data)
        if sid in self.stream_window:
            self.stream_window[sid] -= len(data)

    def hash(self, sid, size, sha):
        self.send(hash_frame(sid, size, sha))

    def cancel(self, sid, code=0x12, msg=b""):
        self.send(cancel_frame(sid, code, msg))

    def ping(self, data=b"hostile!"):
        self.send(ping_frame(data))

    # -- expectations
    def expect_offset(self, sid, timeout=5.0):
        f = self._expect_on_stream(sid, timeout)
        assert f["type"] == "OFFSET", f"expected OFFSET on stream {sid}, got {describe(f)}"
        return f

    def _expect_on_stream(self, sid, timeout):
        """Next OFFSET/RESULT/ERROR on sid (ACK/CREDIT are absorbed). ERROR(0) / close fail."""
        try:
            return self.next_frame(timeout, lambda f: (f["stream"] == sid and f["type"] in ("OFFSET", "RESULT", "ERROR"))
                                   or (f["type"] == "ERROR" and f["stream"] == 0) or f["type"] == "GOAWAY")
        except Closed as e:
            raise AssertionError(f"expected a frame on stream {sid}, connection closed ({e}); seen {self.summary()}")
        except NoFrame:
            raise AssertionError(f"expected a frame on stream {sid} within {timeout}s; seen {self.summary()}")

    def expect_result(self, sid, timeout=10.0):
        f = self._expect_on_stream(sid, timeout)
        assert f["type"] == "RESULT", f"expected RESULT on stream {sid}, got {describe(f)}"
        return f

    def expect_stream_error(self, sid, code, timeout=5.0):
        f = self._expect_on_stream(sid, timeout)
        assert f["type"] == "ERROR" and f["stream"] == sid and f["code"] == code, \
            f"expected ERROR({sid}, {code}), got {describe(f)}"
        return f

    def expect_conn_error(self, code, timeout=5.0, codes=None):
        """ERROR on stream 0 with `code` (or one of `codes`), then the connection closes."""
        want = set(codes or [code])
        try:
            f = self.next_frame(timeout, lambda f: f["type"] == "ERROR" and f["stream"] == 0)
        except Closed as e:
            raise AssertionError(f"expected ERROR(0, {'/'.join(sorted(want))}), got close without it ({e}); "
                                 f"seen {self.summary()}")
        except NoFrame:
            raise AssertionError(f"expected ERROR(0, {'/'.join(sorted(want))}) within {timeout}s, got nothing; "
                                 f"seen {self.summary()}")
        assert f["code"] in want, f"expected ERROR(0, {'/'.join(sorted(want))}), got {describe(f)}"
        self.expect_closed(timeout=5.0)
        return f

    def expect_closed(self, timeout=5.0):
        deadline = time.monotonic() + timeout
        try:
            while True:
                if not self._pump(deadline):
                    raise AssertionError(f"connection not closed by the relay within {timeout}s; seen {self.summary()}")
                while self.pending:
                    self.pending.popleft()
        except Closed:
            return

    def roundtrip(self, timeout=5.0, data=None):
        """PING and wait for its PONG: everything sent before is processed. Returns frames seen meanwhile."""
        if data is None:
            data = os.urandom(8)
        self.ping(data)
        try:
            self.next_frame(timeout, lambda f: f["type"] == "PONG" and f["data"] == data.hex()
                            or f["type"] == "ERROR" and f["stream"] == 0)
        except (Closed, NoFrame) as e:
            raise AssertionError(f"expected PONG, got {e}; seen {self.summary()}")
        if self.conn_error:
            raise AssertionError(f"expected PONG, got {describe(self.conn_error)}")

    def expect_quiet(self, seconds, allow=("CREDIT", "ACK", "PONG")):
        """Observe the connection for `seconds`; fail on an unexpected frame or close."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                f = self.next_frame(max(0.0, deadline - time.monotonic()))
            except NoFrame:
                return
            except Closed as e:
                raise AssertionError(f"connection closed ({e}); seen {self.summary()}")
            if f["type"] not in allow:
                raise AssertionError(f"unexpected {describe(f)}")

    def wait_credit0(self, total, timeout=5.0):
        deadline = time.monotonic() + timeout
        while self.credit0 < total:
            try:
                self.next_frame(max(0.01, deadline - time.monotonic()), lambda f: f["type"] == "CREDIT" and f["stream"] == 0)
            except NoFrame:
                break
        return self.credit0

    def wait_ack(self, sid, offset, timeout=5.0):
        deadline = time.monotonic() + timeout
        while self.acks.get(sid, -1) < offset:
            try:
                self.next_frame(max(0.01, deadline - time.monotonic()),
                                lambda f: f["type"] == "ACK" and f["stream"] == sid
                                or f["type"] == "ERROR" and f["stream"] in (0, sid))
            except NoFrame:
                break
        return self.acks.get(sid, 0)

    def send_data(self, sid, data: bytes, start=0, piece=16384, timeout=10.0):
        """Send data[start:] as CHUNKs, respecting both windows."""
        off = start
        deadline = time.monotonic() + timeout
        while off < len(data):
            room = min(self.conn_window, self.stream_window.get(sid, 0), piece, len(data) - off)
            if room <= 0:
                try:
                    self.next_frame(max(0.01, deadline - time.monotonic()),
                                    lambda f: f["type"] == "CREDIT" or f["type"] == "ERROR")
                except NoFrame:
                    raise AssertionError(f"no CREDIT within {timeout}s while sending stream {sid}; seen {self.summary()}")
                except Closed as e:
                    raise AssertionError(f"connection closed while sending ({e}); seen {self.summary()}")
                errs = [f for f in self.seen if f["type"] == "ERROR" and f["stream"] in (0, sid)]
                if errs:
                    raise AssertionError(f"relay sent {describe(errs[-1])} while sending stream {sid}")
                continue
            self.chunk(sid, off, data[off:off + room])
            off += room

    def upload_honest(self, key, data: bytes, sid=None, overwrite=False, timeout=15.0):
        if sid is None:
            sid = self.sid()
        self.open(sid, key, data, overwrite=overwrite)
        off = self.expect_offset(sid, timeout)
        if off["disposition"] == "STORED":
            return off
        self.send_data(sid, data, start=off["offset"], timeout=timeout)
        self.hash(sid, len(data), sha1(data))
        return self.expect_result(sid, timeout)


# ------------------------------------------------------------------ relay process

class Relay:
    def __init__(self, binary, data_dir, proc, addr, log_path, args):
        self.binary = binary
        self.data = data_dir
        self.proc = proc
        self.host, port = addr.rsplit(":", 1)
        self.port = int(port)
        self.log_path = log_path
        self.args = args
        self.ca = os.path.join(data_dir, "dev", "ca.pem")
        with open(os.path.join(data_dir, "dev", "token")) as fh:
            self.token = fh.read().split()[0]
        self.account = "dev"
        self.store = os.path.join(data_dir, "store")
        self.tokens = {"dev": self.token}
        self._alive_n = 0
        self.conns: list = []

    @classmethod
    def start(cls, extra_args=(), timeout=30.0, binary=None, prefix=()):
        binary = binary or relay_bin()
        if not os.path.exists(binary):
            raise AssertionError(f"relay binary {binary} does not exist (set UPLOAD_RELAY_BIN)")
        data = tempfile.mkdtemp(prefix="hostile-relay-")
        ready = os.path.join(data, "ready")
        log_path = os.path.join(data, "relay.log")
        # `prefix` runs the relay under another command (prlimit), which execs it: the process is the relay's.
        args = [*prefix, binary, "serve", "--dev", "--data", data, "--listen", "127.0.0.1:0", "--ready-file", ready,
                "--log-level", "warning", *extra_args]
        log = open(log_path, "wb")
        try:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except Exception:
            log.close()
            shutil.rmtree(data, ignore_errors=True)
            raise
        log.close()
        deadline = time.monotonic() + timeout
        try:
            while True:
                if os.path.exists(ready):
                    with open(ready) as fh:
                        addr = fh.read().strip()
                    if addr:
                        break
                if proc.poll() is not None:
                    with open(log_path, errors="replace") as fh:
                        out = fh.read()[-2000:]
                    raise AssertionError(f"relay exited with {proc.returncode} before listening: {' '.join(args[1:])}\n{out}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"relay did not write its ready file within {timeout}s")
                time.sleep(0.02)  # polling for the ready file (observable event), bounded
        except BaseException:
            _kill(proc)
            shutil.rmtree(data, ignore_errors=True)
            raise
        return cls(binary, data, proc, addr, log_path, args)

    def stop(self):
        self.close_conns()
        _kill(self.proc)
        shutil.rmtree(self.data, ignore_errors=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        return 0.0

    def assert_rss(self, limit=RSS_LIMIT_MB):
        assert self.alive(), f"relay died (exit {self.proc.returncode})"
        rss = self.rss_mb()
        assert rss < limit, f"relay RSS {rss:.0f} MB >= {limit} MB"
        return rss

    def log_tail(self, n=3000) -> str:
        try:
            with open(self.log_path, errors="replace") as fh:
                return fh.read()[-n:]
        except OSError:
            return ""

    # -- accounts
    def add_account(self, name, quota=None) -> str:
        cmd = [self.binary, "token", "add", name, "--data", self.data]
        if quota is not None:
            cmd += ["--quota", str(quota)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, f"token add failed: {p.stderr}"
        tok = p.stdout.strip().split()[-1]
        self.tokens[name] = tok
        return tok

    def revoke(self, name):
        p = subprocess.run([self.binary, "token", "revoke", name, "--data", self.data],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, f"token revoke failed: {p.stderr}"

    # -- connections
    def tls_context(self, alpn=(ALPN,), max_version=None):
        ctx = ssl.create_default_context(cafile=self.ca)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2 if max_version else ssl.TLSVersion.TLSv1_3
        if max_version:
            ctx.maximum_version = max_version
        if alpn:
            ctx.set_alpn_protocols(list(alpn))
        return ctx

    def raw_tcp(self, timeout=10.0):
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        self.conns.append(s)
        return s

    def connect(self, alpn=(ALPN,), timeout=10.0) -> Conn:
        raw = self.raw_tcp(timeout)
        try:
            s = self.tls_context(alpn).wrap_socket(raw, server_hostname="localhost")
        except BaseException:
            raw.close()
            raise
        c = Conn(self, s)
        self.conns.append(c)
        return c

    def close_conns(self):
        for c in self.conns:
            c.close()
        self.conns = []

    def session(self, token=None, features=1, **kw) -> Conn:
        c = self.connect()
        try:
            c.hello(token=token, features=features, **kw)
        except BaseException:
            c.close()
            raise
        return c

    # -- disk
    def store_files(self) -> dict:
        out = {}
        for root, dirs, files in os.walk(self.store):
            for fn in files:
                p = os.path.join(root, fn)
                rel = os.path.relpath(p, self.store)
                try:
                    out[rel] = os.path.getsize(p)
                except OSError:
                    pass
        return out

    def object_path(self, key, account=None) -> str:
        return os.path.join(self.store, account or self.account, key)

    def read_object(self, key, account=None):
        """Bytes of the object at <store>/<account>/<key>; AssertionError naming the legacy path if it sits there."""
        kb = key.encode() if isinstance(key, str) else key
        p = os.path.join(self.store.encode(), (account or self.account).encode(), kb)
        if os.path.isfile(p):
            with open(p, "rb") as fh:
                return fh.read()
        legacy = os.path.join(self.store.encode(), kb)
        if os.path.isfile(legacy):
            raise AssertionError(f"object {key!r} stored at legacy path <store>/{key} instead of "
                                 f"<store>/{account or self.account}/{key}")
        raise AssertionError(f"object {key!r} of account {account or self.account!r} not found at {p!r}")

    def check_alive(self):
        """A fresh connection can do a full honest upload and get RESULT; RSS bounded."""
        assert self.alive(), f"relay process died (exit {self.proc.returncode}); log tail:\n{self.log_tail()}"
        self._alive_n += 1
        data = pattern(3000 + self._alive_n, seed=self._alive_n)
        c = self.session()
        try:
            r = c.upload_honest(f"alive/{os.getpid()}-{self._alive_n}-{time.monotonic_ns()}", data)
            assert r["type"] == "RESULT" and r["size"] == len(data) and r["sha1"] == sha1(data).hex(), describe(r)
        finally:
            c.close()
        self.assert_rss()


def _kill(proc):
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except OSError:
        proc.terminate()
    try:
        proc.wait(timeout=3)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        proc.wait(timeout=5)
