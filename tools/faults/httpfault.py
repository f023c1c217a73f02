#!/usr/bin/env python3
"""httpfault: an HTTP/1.1 fault-injecting proxy in front of an S3 server (Python 3.11+, standard library only).

Used in-process by tools/faults/run.py (the harness switches faults on and off while an upload runs):

    proxy = HTTPFaultProxy(("127.0.0.1", 8333), seed=7, log_path="proxy.log")
    port = proxy.start()                 # listens on 127.0.0.1:<port>
    proxy.set_fault("503", fraction=0.5) # "503", "500", "stall", "reset" or "none"
    ...
    proxy.set_fault("none")              # stalled requests are then dropped without an answer
    proxy.counts                          # what fired: {"503": n, "500-before": n, "500-after": n, ...}
    proxy.stop()

Every request is read whole (head, then a Content-Length or chunked body) and, without a fault, sent on a new
connection to the target and its answer relayed back (the client's connection is kept alive). The Host header is
passed on unchanged, so SigV4 signatures made for the proxy's address still verify. Faults, decided per request with
random.Random(seed) while switched on, for `fraction` of the requests:

  503    answered 503 with an S3 XML body (<Code>SlowDown</Code>) without reaching the target
  500    answered 500 (<Code>InternalError</Code>): half of them without reaching the target ("500-before"), half
         after the target handled the request, whose real answer is thrown away ("500-after": outcome unknown)
  stall  the request is read whole and never answered; the connection is held until the fault is switched off,
         then closed without an answer ("stall")
  reset  the connection is reset (RST): half of them after the request head only, before anything reached the
         target ("reset-before"), half after the target answered, the answer lost ("reset-after")

Standalone, for trying it by hand: python3 tools/faults/httpfault.py --target HOST:PORT --fault 503 --fraction 0.5
(one fault for the whole run; prints the port). `--selftest` checks each mode against a local HTTP server.
"""
from __future__ import annotations

import argparse
import random
import socket
import struct
import sys
import threading
import time

HEAD_LIMIT = 64 * 1024
BODY_LIMIT = 512 * 1024 * 1024

ERROR_XML = {
    "503": ("SlowDown", "Please reduce your request rate. (injected by tools/faults/httpfault.py)"),
    "500": ("InternalError", "We encountered an internal error. Please try again. (injected by tools/faults/httpfault.py)"),
}


class ProxyClosed(Exception):
    pass


def _recv_until(sock: socket.socket, buf: bytearray, marker: bytes, limit: int) -> int:
    """Reads into buf until marker is in it; returns the index just past the marker."""
    while True:
        i = buf.find(marker)
        if i >= 0:
            return i + len(marker)
        if len(buf) > limit:
            raise ProxyClosed("head too long")
        data = sock.recv(256 * 1024)
        if not data:
            raise ProxyClosed("eof")
        buf += data


def _recv_exact(sock: socket.socket, buf: bytearray, n: int) -> bytes:
    while len(buf) < n:
        data = sock.recv(min(1 << 20, max(65536, n - len(buf))))
        if not data:
            raise ProxyClosed("eof in body")
        buf += data
    out = bytes(buf[:n])
    del buf[:n]
    return out


def _read_chunked(sock: socket.socket, buf: bytearray) -> bytes:
    """A chunked body, returned in its raw (still chunked) encoding."""
    raw = bytearray()
    while True:
        end = _recv_until(sock, buf, b"\r\n", HEAD_LIMIT)
        line = bytes(buf[:end])
        del buf[:end]
        raw += line
        size = int(line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            # trailers, then an empty line
            while True:
                end = _recv_until(sock, buf, b"\r\n", HEAD_LIMIT)
                t = bytes(buf[:end])
                del buf[:end]
                raw += t
                if t == b"\r\n":
                    return bytes(raw)
        raw += _recv_exact(sock, buf, size + 2)
        if len(raw) > BODY_LIMIT:
            raise ProxyClosed("body too large")


def parse_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    start = lines[0]
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    return start, headers


def header(headers: list[tuple[str, str]], name: str) -> str | None:
    for n, v in headers:
        if n.lower() == name:
            return v
    return None


def read_message(sock: socket.socket, buf: bytearray, request_method: str | None = None,
                 status: int | None = None) -> tuple[str, list[tuple[str, str]], bytes, bool]:
    """One HTTP message: (start line, headers, raw body, body_until_eof)."""
    end = _recv_until(sock, buf, b"\r\n\r\n", HEAD_LIMIT)
    head = bytes(buf[:end])
    del buf[:end]
    start, headers = parse_head(head)
    if request_method is None and status is None:  # a request
        status_code = None
    else:
        status_code = int(start.split()[1])
    te = (header(headers, "transfer-encoding") or "").lower()
    cl = header(headers, "content-length")
    if status_code is not None and (request_method == "HEAD" or status_code in (204, 304) or 100 <= status_code < 200):
        return start, headers, b"", False
    if "chunked" in te:
        return start, headers, _read_chunked(sock, buf), False
    if cl is not None:
        n = int(cl)
        if n > BODY_LIMIT:
            raise ProxyClosed("body too large")
        return start, headers, _recv_exact(sock, buf, n), False
    if status_code is None:
        return start, headers, b"", False  # a request without a body
    # a response without a length: until EOF
    body = bytearray(buf)
    buf.clear()
    while True:
        data = sock.recv(1 << 20)
        if not data:
            break
        body += data
    return start, headers, bytes(body), True


def build(start: str, headers: list[tuple[str, str]]) -> bytes:
    return (start + "\r\n" + "".join(f"{n}: {v}\r\n" for n, v in headers) + "\r\n").encode("latin-1")


def reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class HTTPFaultProxy:
    def __init__(self, target: tuple[str, int], seed: int = 0, log_path: str | None = None,
                 listen: tuple[str, int] = ("127.0.0.1", 0)):
        self.target = target
        self.rng = random.Random(seed)
        self.log_path = log_path
        self.listen_addr = listen
        self.lock = threading.Lock()
        self.mode = "none"
        self.fraction = 1.0
        self.epoch = 0                      # bumped on every set_fault: releases stalls
        self.cond = threading.Condition(self.lock)
        self.counts: dict[str, int] = {}
        self.requests = 0
        self.forwarded = 0
        self.upstream_errors = 0
        self.sock: socket.socket | None = None
        self.conns: set[socket.socket] = set()
        self.stopped = False
        self.port = 0

    # -- control
    def reseed(self, seed: int) -> None:
        """Fault decisions from here on come from random.Random(seed) (one replayable sequence per test)."""
        with self.lock:
            self.rng = random.Random(seed)

    def set_fault(self, mode: str, fraction: float = 1.0) -> None:
        if mode not in ("none", "503", "500", "stall", "reset"):
            raise ValueError(mode)
        with self.cond:
            self.mode, self.fraction = mode, fraction
            self.epoch += 1
            self.cond.notify_all()
        self._log(f"{time.time():.3f} fault={mode} fraction={fraction}")

    def fired(self, prefix: str) -> int:
        with self.lock:
            return sum(v for k, v in self.counts.items() if k.startswith(prefix))

    def _count(self, what: str) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def _decide(self) -> tuple[str, int]:
        with self.lock:
            self.requests += 1
            if self.mode == "none" or self.rng.random() >= self.fraction:
                return "none", self.epoch
            mode = self.mode
            if mode in ("500", "reset"):
                mode += "-before" if self.rng.random() < 0.5 else "-after"
            return mode, self.epoch

    def _log(self, line: str) -> None:
        if not self.log_path:
            return
        try:
            with self.lock:
                with open(self.log_path, "a") as f:
                    f.write(line + "\n")
        except OSError:
            pass

    # -- lifecycle
    def start(self) -> int:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(self.listen_addr)
        s.listen(128)
        self.sock = s
        self.port = s.getsockname()[1]
        threading.Thread(target=self._accept, name="httpfault-accept", daemon=True).start()
        return self.port

    def stop(self) -> None:
        self.stopped = True
        with self.cond:
            self.epoch += 1
            self.cond.notify_all()
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        for c in list(self.conns):
            reset(c)

    def _accept(self) -> None:
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conns.add(c)
            threading.Thread(target=self._serve, args=(c,), name="httpfault-conn", daemon=True).start()

    # -- one client connection: requests one after another
    def _serve(self, c: socket.socket) -> None:
        buf = bytearray()
        c.settimeout(300)
        try:
            while not self.stopped:
                try:
                    end = _recv_until(c, buf, b"\r\n\r\n", HEAD_LIMIT)
                except (ProxyClosed, OSError):
                    return
                head = bytes(buf[:end])
                del buf[:end]
                start, headers = parse_head(head)
                method = start.split()[0]
                target_path = start.split()[1] if len(start.split()) > 1 else "?"
                fault, epoch = self._decide()
                if fault == "reset-before":
                    self._count(fault)
                    self._log(f"{time.time():.3f} {method} {target_path} -> RST (before the target)")
                    reset(c)
                    return
                if (header(headers, "expect") or "").lower() == "100-continue":
                    c.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    headers = [(n, v) for n, v in headers if n.lower() != "expect"]
                te = (header(headers, "transfer-encoding") or "").lower()
                cl = header(headers, "content-length")
                try:
                    if "chunked" in te:
                        body = _read_chunked(c, buf)
                    elif cl is not None:
                        body = _recv_exact(c, buf, int(cl))
                    else:
                        body = b""
                except (ProxyClosed, OSError):
                    return
                client_close = (header(headers, "connection") or "").lower() == "close"
                if fault in ("503", "500-before"):
                    self._count(fault)
                    self._answer_error(c, fault[:3], target_path)
                    self._log(f"{time.time():.3f} {method} {target_path} -> {fault[:3]} injected (target not reached)")
                    if client_close:
                        c.close()
                        return
                    continue
                if fault == "stall":
                    self._count(fault)
                    self._log(f"{time.time():.3f} {method} {target_path} -> stalled (no answer)")
                    with self.cond:
                        while self.epoch == epoch and not self.stopped:
                            self.cond.wait(1.0)
                    self._log(f"{time.time():.3f} {method} {target_path} -> stall over: closed without an answer")
                    try:
                        c.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    c.close()
                    return
                # forward to the target
                try:
                    answer, until_eof, status = self._forward(method, start, headers, body)
                except (ProxyClosed, OSError) as e:
                    with self.lock:
                        self.upstream_errors += 1
                    self._log(f"{time.time():.3f} {method} {target_path} -> target failed: {e!r}; closing")
                    reset(c)
                    return
                with self.lock:
                    self.forwarded += 1
                if fault == "500-after":
                    self._count(fault)
                    self._answer_error(c, "500", target_path)
                    self._log(f"{time.time():.3f} {method} {target_path} -> target answered {status}; 500 injected instead")
                    continue
                if fault == "reset-after":
                    self._count(fault)
                    self._log(f"{time.time():.3f} {method} {target_path} -> target answered {status}; RST instead")
                    reset(c)
                    return
                self._log(f"{time.time():.3f} {method} {target_path} -> {status}")
                c.sendall(answer)
                if until_eof or client_close:
                    c.close()
                    return
        except OSError:
            return
        finally:
            self.conns.discard(c)
            try:
                c.close()
            except OSError:
                pass

    def _answer_error(self, c: socket.socket, status: str, resource: str) -> None:
        code, message = ERROR_XML[status]
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
                f"<Resource>{resource.split('?')[0]}</Resource><RequestId>httpfault-{time.monotonic_ns()}</RequestId>"
                "</Error>").encode()
        reason = "Slow Down" if status == "503" else "Internal Server Error"
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
                f"x-amz-request-id: httpfault\r\n\r\n").encode()
        c.sendall(head + body)

    def _forward(self, method: str, start: str, headers, body: bytes) -> tuple[bytes, bool, int]:
        up = socket.create_connection(self.target, timeout=120)
        try:
            up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            fwd = [(n, v) for n, v in headers if n.lower() not in ("connection", "keep-alive", "proxy-connection")]
            fwd.append(("Connection", "close"))
            up.sendall(build(start, fwd) + body)
            ubuf = bytearray()
            while True:
                rstart, rheaders, rbody, until_eof = read_message(up, ubuf, request_method=method, status=0)
                status = int(rstart.split()[1])
                if 100 <= status < 200:
                    continue
                break
            keep = [(n, v) for n, v in rheaders if n.lower() not in ("connection", "keep-alive")]
            if until_eof:
                keep = [(n, v) for n, v in keep if n.lower() != "content-length"]
                keep.append(("Content-Length", str(len(rbody))))
            return build(rstart, keep) + rbody, False, status
        finally:
            up.close()


# ---------------------------------------------------------------- standalone use and self-test

def _selftest() -> int:
    import http.server
    import urllib.request
    import urllib.error

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        seen = []

        def do_PUT(self):
            n = int(self.headers.get("Content-Length", "0"))
            data = self.rfile.read(n)
            H.seen.append(data)
            out = f"got {len(data)}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def do_HEAD(self):
            self.send_response(200)
            self.send_header("Content-Length", "1234")
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = HTTPFaultProxy(("127.0.0.1", server.server_address[1]), seed=1)
    port = proxy.start()
    passed = failed = 0

    def check(name, cond, detail=""):
        nonlocal passed, failed
        if cond:
            passed += 1
            print(f"ok   {name}")
        else:
            failed += 1
            print(f"FAIL {name} {detail}")

    def put(data=b"x" * 100000, timeout=10):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/b/k", data=data, method="PUT")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    st, body = put()
    check("forward PUT", st == 200 and body == b"got 100000" and H.seen[-1] == b"x" * 100000, f"{st} {body!r}")
    req = urllib.request.Request(f"http://127.0.0.1:{port}/b/k", method="HEAD")
    with urllib.request.urlopen(req, timeout=10) as r:
        check("forward HEAD", r.status == 200 and r.headers["Content-Length"] == "1234")
    proxy.set_fault("503")
    st, body = put()
    check("503 SlowDown", st == 503 and b"<Code>SlowDown</Code>" in body and proxy.counts.get("503") == 1, f"{st} {body!r}")
    proxy.set_fault("500")
    n_before = len(H.seen)
    results = [put()[0] for _ in range(8)]
    check("500 before/after", all(s == 500 for s in results) and proxy.fired("500") == 8
          and proxy.counts.get("500-after", 0) == len(H.seen) - n_before, f"{results} {proxy.counts}")
    proxy.set_fault("reset")
    errors = 0
    for _ in range(4):
        try:
            put()
        except (ConnectionError, urllib.error.URLError, OSError):
            errors += 1
    check("reset", errors == 4 and proxy.fired("reset") == 4, f"{errors} {proxy.counts}")
    proxy.set_fault("stall")
    t0 = time.monotonic()
    threading.Timer(1.0, lambda: proxy.set_fault("none")).start()
    try:
        put(timeout=10)
        outcome = "answered"
    except OSError as e:  # RemoteDisconnected, ConnectionResetError and URLError are OSErrors
        outcome = type(e).__name__
    waited = time.monotonic() - t0
    check("stall then close", outcome != "answered" and 0.9 <= waited < 5 and proxy.counts.get("stall") == 1,
          f"{outcome} {waited:.2f}s")
    st, body = put()
    check("clear", st == 200, f"{st}")
    proxy.stop()
    server.shutdown()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--selftest", action="store_true")
    p.add_argument("--target", help="HOST:PORT")
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--fault", default="none", choices=("none", "503", "500", "stall", "reset"))
    p.add_argument("--fraction", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log")
    a = p.parse_args()
    if a.selftest:
        return _selftest()
    if not a.target:
        p.error("--target HOST:PORT is needed")
    th, _, tp = a.target.rpartition(":")
    lh, _, lp = a.listen.rpartition(":")
    proxy = HTTPFaultProxy((th, int(tp)), seed=a.seed, log_path=a.log, listen=(lh, int(lp)))
    print(proxy.start(), flush=True)
    proxy.set_fault(a.fault, a.fraction)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        proxy.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
