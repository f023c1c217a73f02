"""Strangers (connections that have not authenticated) cannot fill a listener (issue 40 finding 2): while a client
from 127.0.0.2 holds as many bare TCP connections as it can to each listener, reopening them as they close, an honest
upload from 127.0.0.1 succeeds within 10 s, the status endpoint and /readyz answer within 2 s, and the relay writes
few log lines about it (sshd's MaxStartups, nginx's limit_conn)."""
import socket
import ssl
import threading
import time

import pytest

import agentlib
from agentlib import describe, pattern


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Flood:
    """Up to `count` bare TCP connections from 127.0.0.2 to each port, reopened as they close, until stopped."""

    def __init__(self, ports, count=1000):
        self.ports, self.count = ports, count
        self.stop = threading.Event()
        self.opened = 0
        self.threads = [threading.Thread(target=self.run, args=(p,), daemon=True) for p in ports]

    def run(self, port):
        held = []
        try:
            while not self.stop.is_set():
                held = [s for s in held if not self.closed(s)]
                while len(held) < self.count and not self.stop.is_set():
                    s = socket.socket()
                    s.setblocking(False)
                    try:
                        s.bind(("127.0.0.2", 0))
                        s.connect_ex(("127.0.0.1", port))
                    except OSError:
                        s.close()
                        break
                    held.append(s)
                    self.opened += 1
                self.stop.wait(0.05)  # the flood's own pace (reopening at most 20 times a second), not a synchronisation
        finally:
            for s in held:
                s.close()

    @staticmethod
    def closed(s):
        try:
            return s.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(10)


def http_get(host, port, target, timeout, tls_ca=None, token=None):
    raw = socket.create_connection((host, port), timeout=timeout)
    s = raw
    if tls_ca:
        ctx = ssl.create_default_context(cafile=tls_ca)
        ctx.set_alpn_protocols(["http/1.1"])
        s = ctx.wrap_socket(raw, server_hostname="localhost")
    try:
        head = f"GET {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        s.sendall((head + "\r\n").encode())
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
        return out
    finally:
        s.close()


@pytest.fixture
def frelay(_case):
    status, ops = free_port(), free_port()
    r = agentlib.Relay.start(["--status-listen", f"127.0.0.1:{status}", "--metrics-listen", f"127.0.0.1:{ops}",
                              "--log-level", "info"])
    r.status_port, r.ops_port = status, ops
    _case.owned.append(r)
    return r


def test_strangers_from_one_address_shut_out_nobody(frelay):
    r = frelay
    data = pattern(100_000, seed=40)
    with open(r.log_path, "rb") as fh:
        lines_before = fh.read().count(b"\n")
    with Flood([r.port, r.status_port, r.ops_port]) as flood:
        deadline = time.monotonic() + 10
        while flood.opened < 600 and time.monotonic() < deadline:
            flood.stop.wait(0.1)  # until the flood holds its connections (an observable count), bounded
        t0 = time.monotonic()
        c = r.session()
        res = c.upload_honest("honest/100k.bin", data, timeout=10)
        took = time.monotonic() - t0
        assert res["type"] == "RESULT" and res["size"] == len(data), describe(res)
        assert took < 10, f"an honest upload took {took:.1f} s under the flood"
        c.close()
        t0 = time.monotonic()
        ready = http_get("127.0.0.1", r.ops_port, "/readyz", timeout=2)
        assert ready.startswith(b"HTTP/1.1 200"), ready[:200]
        status = http_get("127.0.0.1", r.status_port, "/v1/status?key=honest/100k.bin", timeout=2, tls_ca=r.ca, token=r.token)
        assert status.startswith(b"HTTP/1.1 200"), status[:200]
        assert time.monotonic() - t0 < 4
        flood_seconds = time.monotonic() - deadline + 10
    with open(r.log_path, "rb") as fh:
        log = fh.read()
    lines = log.count(b"\n") - lines_before
    assert lines < 1000 * max(1.0, flood_seconds / 60), f"{lines} log lines in {flood_seconds:.0f} s of flood"
    metrics = http_get("127.0.0.1", r.ops_port, "/metrics", timeout=5)
    assert b'upload_relay_connections_refused_total{listener="upload",reason="source_full"}' in metrics, \
        [line for line in metrics.split(b"\n") if b"refused" in line]
