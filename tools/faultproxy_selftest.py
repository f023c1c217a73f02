#!/usr/bin/env python3
"""Self-test of tools/faultproxy.py (Python 3.11+, standard library only).

Starts a local echo server, then runs tools/faultproxy.py as a subprocess in
front of it with each option, and checks what the server received and what the
client saw. Loopback only. Prints one line per check and "N passed, N failed";
exits non-zero on any failure.

    python3 tools/faultproxy_selftest.py [-k SUBSTRING] [-v]
"""
from __future__ import annotations

import argparse
import os
import queue
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
PROXY = os.path.join(HERE, "faultproxy.py")


# ---------------------------------------------------------------- echo server
class Record:
    def __init__(self):
        self.data = bytearray()
        self.end = "open"


class EchoServer:
    """Echoes every byte back. After the client's EOF it sends b"BYE" and
    closes (so half-close can be checked). Every finished connection's
    received bytes and end ("eof" or "reset") are put on self.done."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.done: queue.Queue[Record] = queue.Queue()
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket):
        rec = Record()
        try:
            while True:
                b = c.recv(256 * 1024)
                if not b:
                    rec.end = "eof"
                    try:
                        c.sendall(b"BYE")
                        c.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass  # the proxy already dropped us after a cut (EPIPE, ENOTCONN)
                    break
                rec.data += b
                c.sendall(b)
        except OSError as e:
            # after a cut the echo of data may hit the closed proxy socket (EPIPE or ECONNRESET)
            rec.end = "reset" if isinstance(e, ConnectionError) else f"error:{e!r}"
        finally:
            c.close()
            self.done.put(rec)

    def next_record(self, timeout=10.0) -> Record:
        return self.done.get(timeout=timeout)

    def drain_records(self):
        while True:
            try:
                self.done.get_nowait()
            except queue.Empty:
                return


# ---------------------------------------------------------------- proxy process
class Proxy:
    def __init__(self, tmp: str, target_port: int, *opts: str):
        self.ready = os.path.join(tmp, f"ready-{time.monotonic_ns()}")
        self.logpath = os.path.join(tmp, f"log-{time.monotonic_ns()}")
        cmd = [sys.executable, PROXY, "--listen", "127.0.0.1:0", "--target", f"127.0.0.1:{target_port}",
               "--ready-file", self.ready, "--log", self.logpath, *opts]
        self.p = subprocess.Popen(cmd, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while not os.path.exists(self.ready):
            if self.p.poll() is not None:
                raise RuntimeError(f"proxy exited {self.p.returncode}: {self.p.stderr.read().decode()}")
            if time.monotonic() > deadline:
                raise RuntimeError("proxy never became ready")
            time.sleep(0.01)
        text = open(self.ready).read()
        assert text.endswith("\n") and text.count("\n") == 1, repr(text)
        host, port = text.strip().rsplit(":", 1)
        assert host == "127.0.0.1", text
        self.port = int(port)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def log_lines(self, n: int, timeout=5.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            lines = open(self.logpath).read().splitlines() if os.path.exists(self.logpath) else []
            if len(lines) >= n or time.monotonic() > deadline:
                return lines
            time.sleep(0.01)

    def vmhwm_kib(self) -> int:
        for line in open(f"/proc/{self.p.pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
        return -1

    def stop(self) -> tuple[int, float]:
        t0 = time.monotonic()
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        self.p.stderr.close()
        return rc, time.monotonic() - t0


def log_field(line: str, key: str) -> str:
    for part in line.split():
        if part.startswith(key + "="):
            return part[len(key) + 1:]
    raise KeyError(f"{key} not in {line!r}")


# ---------------------------------------------------------------- client helpers
def transfer(s: socket.socket, payload: bytes) -> tuple[bytes, str]:
    """Send payload (from a thread), half-close, read until EOF or error.
    Returns (bytes received, how it ended: "eof" / "reset" / error name)."""
    send_err: list[BaseException] = []

    def sender():
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)
        except OSError as e:
            send_err.append(e)

    t = threading.Thread(target=sender, daemon=True)
    t.start()
    got = bytearray()
    end = "eof"
    try:
        while True:
            b = s.recv(256 * 1024)
            if not b:
                break
            got += b
    except ConnectionResetError:
        end = "reset"
    except OSError as e:
        end = e.__class__.__name__
    t.join(10)
    s.close()
    # A reset is reported once per socket: whichever thread hit it first saw
    # ECONNRESET, the other may see EOF or EPIPE.
    if end == "eof" and any(isinstance(e, ConnectionResetError) for e in send_err):
        end = "reset"
    return bytes(got), end


def clean_roundtrip(proxy: Proxy, echo: EchoServer, size: int, seed: int) -> None:
    payload = random.Random(seed).randbytes(size)
    got, end = transfer(proxy.connect(), payload)
    rec = echo.next_record()
    assert rec.end == "eof", rec.end
    assert bytes(rec.data) == payload, f"server got {len(rec.data)} bytes, differs from the {size} sent"
    assert end == "eof", end
    assert got == payload + b"BYE", f"client got {len(got)} bytes back, expected {size + 3}"


def ping(s: socket.socket) -> float:
    t0 = time.monotonic()
    s.sendall(b"x")
    assert s.recv(16) == b"x"
    return time.monotonic() - t0


# ---------------------------------------------------------------- checks
def check_ready_and_passthrough(tmp, echo):
    p = Proxy(tmp, echo.port)
    try:
        clean_roundtrip(p, echo, 3 * 1024 * 1024 + 17, 1)
        clean_roundtrip(p, echo, 0, 2)  # empty stream: half-close straight away
        lines = p.log_lines(2)
        assert len(lines) == 2, lines
        assert log_field(lines[0], "fault") == "none", lines[0]
        assert log_field(lines[0], "c2s") == str(3 * 1024 * 1024 + 17), lines[0]
        assert log_field(lines[0], "s2c") == str(3 * 1024 * 1024 + 17 + 3), lines[0]
    finally:
        rc, secs = p.stop()
    assert rc == 0, rc


def check_cut_after(tmp, echo):
    n = 100_003
    p = Proxy(tmp, echo.port, "--cut-after", str(n))
    try:
        payload = random.Random(3).randbytes(1_000_000)
        got, end = transfer(p.connect(), payload)
        rec = echo.next_record()
        assert len(rec.data) == n, f"server received {len(rec.data)} bytes, expected exactly {n}"
        assert bytes(rec.data) == payload[:n]
        assert rec.end in ("eof", "reset"), rec.end
        assert end == "reset", f"client should see a reset, saw {end}"
        assert len(got) <= n
        # the second connection passes clean
        clean_roundtrip(p, echo, 2_000_000, 4)
        lines = p.log_lines(2)
        assert log_field(lines[0], "fault") == f"cut@{n}", lines[0]
        assert log_field(lines[0], "c2s") == str(n), lines[0]
        assert log_field(lines[0], "end") == "cut", lines[0]
        assert log_field(lines[1], "fault") == "none", lines[1]
    finally:
        rc, _ = p.stop()
    assert rc == 0, rc


def check_cut_small_writes(tmp, echo):
    # the cut falls inside one of many small segments
    n = 1001
    p = Proxy(tmp, echo.port, "--cut-after", str(n))
    try:
        s = p.connect()
        end = None
        try:
            for i in range(400):
                s.sendall(bytes([i % 256]) * 7)
                time.sleep(0.001)
        except (ConnectionResetError, BrokenPipeError):
            end = "reset"
        s.close()
        rec = echo.next_record()
        assert len(rec.data) == n, len(rec.data)
        assert bytes(rec.data) == b"".join(bytes([i % 256]) * 7 for i in range(400))[:n]
        assert end == "reset", end
    finally:
        p.stop()


def check_cut_zero(tmp, echo):
    p = Proxy(tmp, echo.port, "--cut-after", "0")
    try:
        got, end = transfer(p.connect(), b"hello" * 1000)
        rec = echo.next_record()
        assert len(rec.data) == 0, len(rec.data)
        assert end == "reset" and got == b"", (end, got[:20])
        clean_roundtrip(p, echo, 1000, 5)
    finally:
        p.stop()


def check_cut_random(tmp, echo):
    seed, a, b = 42, 10_000, 900_000
    rng = random.Random(seed)
    first, second = rng.randint(a, b), rng.randint(a, b)
    p = Proxy(tmp, echo.port, "--cut-random", str(seed), "--cut-min", str(a), "--cut-max", str(b), "--every")
    try:
        for expect in (first, second):
            payload = random.Random(expect).randbytes(1_000_000)
            _, end = transfer(p.connect(), payload)
            rec = echo.next_record()
            assert len(rec.data) == expect, f"server got {len(rec.data)}, expected {expect}"
            assert bytes(rec.data) == payload[:expect]
            assert end == "reset", end
        lines = p.log_lines(2)
        assert [log_field(x, "fault") for x in lines] == [f"cut@{first}", f"cut@{second}"], lines
    finally:
        p.stop()


def check_cut_unreached(tmp, echo):
    p = Proxy(tmp, echo.port, "--cut-after", "5000")
    try:
        clean_roundtrip(p, echo, 4999, 6)
        lines = p.log_lines(1)
        assert log_field(lines[0], "fault") == "cut-unreached@5000", lines[0]
    finally:
        p.stop()


def check_cut_server_rst(tmp, echo):
    n = 300_000
    p = Proxy(tmp, echo.port, "--cut-after", str(n), "--server-close", "rst")
    try:
        payload = random.Random(7).randbytes(1_000_000)
        _, end = transfer(p.connect(), payload)
        rec = echo.next_record()
        assert rec.end == "reset", f"server side should be reset, ended {rec.end}"
        assert bytes(rec.data) == payload[:n], f"server got {len(rec.data)} bytes, expected {n}"
        assert end == "reset", end
    finally:
        p.stop()


def check_corrupt(tmp, echo):
    k = 777_777
    p = Proxy(tmp, echo.port, "--corrupt-at", str(k))
    try:
        payload = random.Random(8).randbytes(2_000_000)
        got, end = transfer(p.connect(), payload)
        rec = echo.next_record()
        data = bytes(rec.data)
        assert len(data) == len(payload) and end == "eof" and rec.end == "eof"
        diff = [i for i in range(len(payload)) if payload[i] != data[i]] if data != payload else []
        assert diff == [k], f"differing positions: {diff[:5]}"
        assert data[k] == payload[k] ^ 0x01
        bits = bin(data[k] ^ payload[k]).count("1")
        assert bits == 1, bits
        # the server->client direction is not corrupted: it echoes the corrupted stream as is
        assert got == data + b"BYE"
        clean_roundtrip(p, echo, 2_000_000, 8)  # same payload, now clean
        lines = p.log_lines(2)
        assert log_field(lines[0], "fault") == f"corrupt@{k}", lines[0]
        assert log_field(lines[1], "fault") == "none", lines[1]
    finally:
        p.stop()


def check_corrupt_first_byte_and_beyond_cut(tmp, echo):
    p = Proxy(tmp, echo.port, "--corrupt-at", "0", "--every")
    try:
        got, _ = transfer(p.connect(), b"\x00abc")
        rec = echo.next_record()
        assert bytes(rec.data) == b"\x01abc", bytes(rec.data)
    finally:
        p.stop()
    # a corruption past the cut never happens
    p = Proxy(tmp, echo.port, "--corrupt-at", "2000", "--cut-after", "1000")
    try:
        payload = bytes(5000)
        transfer(p.connect(), payload)
        rec = echo.next_record()
        assert bytes(rec.data) == bytes(1000)
        lines = p.log_lines(1)
        assert log_field(lines[0], "fault") == "cut@1000", lines[0]
    finally:
        p.stop()


def check_delay(tmp, echo):
    d = 150
    p = Proxy(tmp, echo.port, "--delay-ms", str(d))
    try:
        s = p.connect()
        rtts = [ping(s) for _ in range(3)]
        s.close()
        echo.next_record()
        # one delay each way
        assert all(r >= 2 * d / 1000 * 0.95 for r in rtts), rtts
        assert all(r < 2 * d / 1000 + 0.5 for r in rtts), rtts
        # second connection: no delay
        s = p.connect()
        fast = [ping(s) for _ in range(3)]
        s.close()
        echo.next_record()
        assert max(fast) < 0.1, fast
    finally:
        p.stop()


def check_delay_order_and_volume(tmp, echo):
    # many segments in flight under delay: order preserved, nothing lost, throughput not serialised
    p = Proxy(tmp, echo.port, "--delay-ms", "50", "--every")
    try:
        t0 = time.monotonic()
        clean_roundtrip(p, echo, 20_000_000, 9)
        secs = time.monotonic() - t0
        assert secs < 10, secs
        # pipelined small writes keep their order
        s = p.connect()
        msgs = b"".join(struct.pack(">I", i) for i in range(5000))
        got, end = transfer(s, msgs)
        rec = echo.next_record()
        assert bytes(rec.data) == msgs and got == msgs + b"BYE", end
    finally:
        p.stop()


def check_every(tmp, echo):
    p = Proxy(tmp, echo.port, "--cut-after", "1234", "--every")
    try:
        for _ in range(3):
            _, end = transfer(p.connect(), bytes(10_000))
            rec = echo.next_record()
            assert len(rec.data) == 1234 and end == "reset", (len(rec.data), end)
        lines = p.log_lines(3)
        assert all(log_field(x, "fault") == "cut@1234" for x in lines), lines
    finally:
        p.stop()


def check_half_close(tmp, echo):
    # the client half-closes; the server's reply sent after that still arrives
    p = Proxy(tmp, echo.port)
    try:
        s = p.connect()
        s.sendall(b"question")
        s.shutdown(socket.SHUT_WR)
        time.sleep(0.2)
        got = bytearray()
        while True:
            b = s.recv(1024)
            if not b:
                break
            got += b
        s.close()
        assert bytes(got) == b"questionBYE", bytes(got)
        assert echo.next_record().end == "eof"
    finally:
        p.stop()


def check_client_reset_and_target_down(tmp, echo):
    p = Proxy(tmp, echo.port)
    try:
        s = p.connect()
        s.sendall(bytes(100_000))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # RST
        rec = echo.next_record()
        assert rec.end in ("reset", "eof"), rec.end
        clean_roundtrip(p, echo, 100_000, 10)
        assert p.p.poll() is None, "proxy died"
        lines = p.log_lines(2)
        assert len(lines) == 2, lines
    finally:
        p.stop()
    # target not listening: the client is dropped, the proxy lives on
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    p = Proxy(tmp, dead_port)
    try:
        for _ in range(2):
            got, end = transfer(p.connect(), b"hello")
            assert got == b"" and end in ("reset", "eof"), (got, end)
        assert p.p.poll() is None, "proxy died"
        lines = p.log_lines(2)
        assert all(log_field(x, "end").startswith("connect-failed") for x in lines), lines
    finally:
        p.stop()


def check_sigterm(tmp, echo):
    p = Proxy(tmp, echo.port, "--delay-ms", "1000")
    s = p.connect()
    s.sendall(b"pending")
    time.sleep(0.1)
    rc, secs = p.stop()
    s.close()
    echo.drain_records()
    assert rc == 0, f"exit code {rc}"
    assert secs < 1.5, f"took {secs:.2f}s to stop"
    assert not os.path.exists(p.ready + f".tmp.{p.p.pid}")


def check_bounded_memory(tmp, echo):
    # 256 MiB each way through a clean proxy; the proxy's peak RSS stays small
    p = Proxy(tmp, echo.port)
    try:
        size = 256 * 1024 * 1024
        s = p.connect()
        chunk = random.Random(11).randbytes(1024 * 1024)
        received = [0]

        def reader():
            while True:
                b = s.recv(1024 * 1024)
                if not b:
                    return
                received[0] += len(b)

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        for _ in range(size // len(chunk)):
            s.sendall(chunk)
        s.shutdown(socket.SHUT_WR)
        t.join(60)
        s.close()
        rec = echo.next_record()
        assert len(rec.data) == size and received[0] == size + 3, (len(rec.data), received[0])
        rec.data = bytearray()
        hwm = p.vmhwm_kib()
        assert hwm < 64 * 1024, f"proxy peak RSS {hwm} KiB"
    finally:
        p.stop()


def check_slow_reader_backpressure(tmp, echo):
    # the client never reads while the echo server sends 64 MiB back: the proxy
    # must stop reading from the server instead of buffering everything
    p = Proxy(tmp, echo.port)
    try:
        s = p.connect()
        s.setblocking(False)
        sent = 0
        blob = bytes(1024 * 1024)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and sent < 64 * 1024 * 1024:
            try:
                sent += s.send(blob)
            except BlockingIOError:
                time.sleep(0.01)
        hwm = p.vmhwm_kib()
        assert sent < 64 * 1024 * 1024, f"sent {sent} without the client reading: no backpressure"
        assert hwm < 64 * 1024, f"proxy peak RSS {hwm} KiB"
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        echo.next_record()
        assert p.p.poll() is None
    finally:
        p.stop()


CHECKS = [
    check_ready_and_passthrough,
    check_cut_after,
    check_cut_small_writes,
    check_cut_zero,
    check_cut_random,
    check_cut_unreached,
    check_cut_server_rst,
    check_corrupt,
    check_corrupt_first_byte_and_beyond_cut,
    check_delay,
    check_delay_order_and_volume,
    check_every,
    check_half_close,
    check_client_reset_and_target_down,
    check_sigterm,
    check_bounded_memory,
    check_slow_reader_backpressure,
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", default="", help="run only the checks whose name contains this")
    ap.add_argument("-v", action="store_true", help="print tracebacks")
    args = ap.parse_args()
    echo = EchoServer()
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="faultproxy-selftest-") as tmp:
        for check in CHECKS:
            if args.k not in check.__name__:
                continue
            echo.drain_records()
            t0 = time.monotonic()
            try:
                check(tmp, echo)
            except Exception as e:
                failed += 1
                print(f"FAIL {check.__name__} ({time.monotonic() - t0:.2f}s): {e!r}", flush=True)
                if args.v:
                    traceback.print_exc()
            else:
                passed += 1
                print(f"ok   {check.__name__} ({time.monotonic() - t0:.2f}s)", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
