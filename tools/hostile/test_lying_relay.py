"""The agent against a relay it trusts that lies (issue 40 finding 6, SPEC §2.3): a relay that trickles its WELCOME, one
that welcomes and then answers no OPEN (PONGs keep the link alive), and one that floods PINGs. `upload-agent send
--retry-for 5s` ends within --retry-for + 15 s each time with an error that says why, and stays under 64 MiB.

The lying relay is a TLS server here, holding the dev certificate of the shared relay (trusted through its CA)."""
import os
import socket
import ssl
import subprocess
import tempfile
import threading
import time

import wire
from agentlib import ALPN, REPO

RETRY_FOR = 5
LIMIT = RETRY_FOR + 15


def agent_bin():
    return os.environ.get("UPLOAD_AGENT_BIN") or os.path.join(REPO, ".build/debug/upload-agent")


def welcome():
    return wire.encode({"type": "WELCOME", "stream": 0, "flags": 0, "version": 1, "max_frame_size": 1114112,
                        "features": 0, "max_streams": 64, "connection_window": 8 << 20, "stream_window": 8 << 20,
                        "max_key_length": 1024, "idle_timeout_millis": 120000, "account": "dev"})


def ping(n):
    return wire.encode({"type": "PING", "stream": 0, "flags": 0, "data": n.to_bytes(8, "big").hex()})


class LyingRelay:
    """Accepts TLS connections and runs `behave(tls_socket, stop)` on each, in a thread."""

    def __init__(self, relay, behave):
        dev = os.path.join(relay.data, "dev")
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_3
        self.context.load_cert_chain(os.path.join(dev, "server.pem"), os.path.join(dev, "server-key.pem"))
        self.context.set_alpn_protocols([ALPN])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.behave = behave
        self.stop = threading.Event()
        self.threads = []
        self.accepter = threading.Thread(target=self._accept, daemon=True)
        self.accepter.start()

    def _accept(self):
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                raw, _ = self.listener.accept()
            except (socket.timeout, OSError):
                continue
            t = threading.Thread(target=self._serve, args=(raw,), daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, raw):
        try:
            with self.context.wrap_socket(raw, server_side=True) as tls:
                tls.settimeout(1.0)
                self.behave(tls, self.stop)
        except (OSError, ssl.SSLError):
            pass

    def close(self):
        self.stop.set()
        self.listener.close()
        self.accepter.join(5)
        for t in self.threads:
            t.join(5)


def read_some(tls):
    try:
        return tls.recv(65536)
    except (socket.timeout, ssl.SSLWantReadError):
        return b""


def trickle_welcome(tls, stop):
    read_some(tls)  # HELLO
    for byte in welcome():
        if stop.wait(1.0):
            return
        tls.sendall(bytes([byte]))


def welcome_then_silence(tls, stop):
    read_some(tls)
    tls.sendall(welcome())
    buf = b""
    while not stop.is_set():
        data = read_some(tls)
        if data == b"" and tls.fileno() < 0:
            return
        buf += data
        # Answers every PING (so the link looks alive), never an OPEN.
        while len(buf) >= wire.HEADER_SIZE:
            length = int.from_bytes(buf[0:4], "big")
            if length < wire.HEADER_SIZE or len(buf) < length:
                break
            frame, buf = buf[:length], buf[length:]
            if frame[4] == wire.TYPE_CODES["PING"]:
                pong = bytearray(frame)
                pong[4] = wire.TYPE_CODES["PONG"]
                tls.sendall(bytes(pong))


def ping_flood(tls, stop):
    read_some(tls)
    tls.sendall(welcome())
    tls.setblocking(True)
    tls.settimeout(5.0)
    burst = b"".join(ping(i) for i in range(1000))
    while not stop.is_set():
        tls.sendall(burst)


def run_agent(relay, port, tmp):
    path = os.path.join(tmp, "photo.jpg")
    with open(path, "wb") as fh:
        fh.write(os.urandom(100_000))
    argv = [agent_bin(), "send", "--relay", f"127.0.0.1:{port}", "--server-name", "localhost", "--ca", relay.ca,
            "--token", relay.token, "--retry-for", f"{RETRY_FOR}s", "--json", path]
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp)
    peak = 0
    try:
        while proc.poll() is None and time.monotonic() - start < LIMIT + 30:
            try:
                with open(f"/proc/{proc.pid}/status") as fh:
                    for line in fh:
                        if line.startswith("VmRSS:"):
                            peak = max(peak, int(line.split()[1]) // 1024)
            except OSError:
                pass
            time.sleep(0.1)  # sampling the agent's memory while it runs, not synchronisation
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate(timeout=10)
    return proc.returncode, time.monotonic() - start, peak, out.decode(errors="replace"), err.decode(errors="replace")


def check(relay, behave, expect):
    liar = LyingRelay(relay, behave)
    try:
        with tempfile.TemporaryDirectory(prefix="hostile-agent-") as tmp:
            rc, took, peak, out, err = run_agent(relay, liar.port, tmp)
    finally:
        liar.close()
    assert took <= LIMIT, f"the agent ran {took:.1f}s against the lying relay (limit {LIMIT}s): {err[-600:]}"
    assert rc not in (0, None), f"exit {rc}: {out[-400:]} {err[-400:]}"
    assert peak < 64, f"the agent grew to {peak} MiB"
    assert expect in out + err, f"{expect!r} not said: {out[-600:]} {err[-600:]}"


def test_trickled_welcome(relay):
    check(relay, trickle_welcome, "WELCOME")


def test_welcome_then_no_answer(relay):
    check(relay, welcome_then_silence, "answered nothing")


def test_ping_flood(relay):
    check(relay, ping_flood, "more than 10 PINGs in one second")
