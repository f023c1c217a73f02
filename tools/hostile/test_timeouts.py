"""Timeouts and trickles: SPEC §2.3, target options --handshake-timeout 2s --frame-timeout 2s --idle-timeout 4s.
A partial frame is not activity; a frame not complete within the frame timeout -> ERROR(0, TIMEOUT)."""
import os
import socket
import time

from agentlib import Closed, NoFrame, hello_frame, ping_frame, chunk_frame, sha1, pattern, SIZE_KNOWN

HANDSHAKE, FRAME, IDLE = 2.0, 2.0, 4.0
SLACK = 1.5


def trickle(c, data, per_byte=1.0, until=None):
    """Send one byte per `per_byte` seconds, waiting in between for the relay to say something.
    Returns (frame or None, seconds since the first byte)."""
    t0 = time.monotonic()
    for i, b in enumerate(data):
        if not c.try_send(bytes([b])):
            break
        try:
            f = c.next_frame(per_byte)
            return f, time.monotonic() - t0
        except NoFrame:
            pass
        except Closed:
            return None, time.monotonic() - t0
        if until is not None and time.monotonic() - t0 > until:
            break
    return None, time.monotonic() - t0


def test_handshake_timeout_no_hello(trelay):
    c = trelay.connect()
    t0 = time.monotonic()
    c.expect_conn_error("TIMEOUT", timeout=HANDSHAKE + SLACK + 2)
    assert time.monotonic() - t0 <= HANDSHAKE + SLACK


def test_handshake_timeout_partial_hello(trelay):
    c = trelay.connect()
    t0 = time.monotonic()
    c.send(hello_frame(trelay.token.encode())[:7])
    c.expect_conn_error("TIMEOUT", timeout=HANDSHAKE + SLACK + 2)
    assert time.monotonic() - t0 <= HANDSHAKE + SLACK


def test_handshake_timeout_raw_tcp_no_tls(trelay):
    s = trelay.raw_tcp()
    t0 = time.monotonic()
    s.settimeout(HANDSHAKE + SLACK + 2)
    try:
        data = s.recv(100)
    except (ConnectionResetError, OSError) as e:
        if isinstance(e, socket.timeout):
            raise AssertionError("relay kept a silent TCP connection (no TLS ClientHello) open past the handshake timeout")
        data = b""
    assert time.monotonic() - t0 <= HANDSHAKE + SLACK, "closed, but later than the handshake timeout"


def test_trickled_hello(trelay):
    """HELLO at one byte per second: the handshake (and frame) timeout fires."""
    c = trelay.connect()
    f, dt = trickle(c, hello_frame(trelay.token.encode()), 1.0, until=HANDSHAKE + SLACK + 1)
    assert f is not None and f["type"] == "ERROR" and f["stream"] == 0 and f["code"] == "TIMEOUT", \
        f"expected ERROR(0, TIMEOUT), got {f} after {dt:.1f}s"
    assert dt <= HANDSHAKE + SLACK


def test_idle_timeout(trelay):
    c = trelay.session()
    assert c.welcome["idle_timeout_millis"] == int(IDLE * 1000), c.welcome["idle_timeout_millis"]
    t0 = time.monotonic()
    c.expect_conn_error("TIMEOUT", timeout=IDLE + SLACK + 2)
    dt = time.monotonic() - t0
    assert IDLE - 0.5 <= dt <= IDLE + SLACK, f"idle timeout after {dt:.1f}s, expected ~{IDLE}s"


def test_pings_keep_connection_alive(trelay):
    c = trelay.session()
    for _ in range(3):
        c.expect_quiet(IDLE / 2.5, allow=("PONG",))
        c.roundtrip()
    c.roundtrip()


def test_trickled_ping_frame_timeout(trelay):
    """A PING at one byte per second after WELCOME: ERROR(0, TIMEOUT) within the frame timeout,
    well before the idle timeout (a partial frame is not activity, but the frame timeout is shorter)."""
    c = trelay.session()
    f, dt = trickle(c, ping_frame(b"slowslow"), 1.0, until=IDLE + SLACK)
    assert f is not None and f["type"] == "ERROR" and f["stream"] == 0 and f["code"] == "TIMEOUT", \
        f"expected ERROR(0, TIMEOUT), got {f} after {dt:.1f}s"
    assert dt <= FRAME + SLACK, f"TIMEOUT after {dt:.1f}s: the frame timeout ({FRAME}s) should fire"


def test_trickled_chunk_mid_upload(trelay):
    c = trelay.session()
    d = pattern(3000, 51)
    k = f"timeouts/trickle-{os.urandom(4).hex()}"
    before = trelay.store_files()
    c.open(1, k, d)
    assert c.expect_offset(1)["disposition"] == "START"
    c.chunk(1, 0, d[:1000])
    assert c.wait_ack(1, 1000) == 1000
    c.roundtrip()
    fr = chunk_frame(1, 1000, d[1000:])
    c.send(fr[:100])  # header and part of the payload, then a trickle
    f, dt = trickle(c, fr[100:200], 0.5, until=IDLE + SLACK)
    assert f is not None and f["type"] == "ERROR" and f["stream"] == 0 and f["code"] == "TIMEOUT", \
        f"expected ERROR(0, TIMEOUT), got {f} after {dt:.1f}s"
    assert dt <= FRAME + SLACK, f"TIMEOUT after {dt:.1f}s: the frame timeout ({FRAME}s) should fire"
    assert not {x for x in trelay.store_files() if x not in before and "alive/" not in x}


def test_partial_frame_is_not_activity(trelay):
    """Complete frames, then a partial one that stays partial: TIMEOUT arrives (frame or idle), never later
    than the idle timeout counted from the last complete frame."""
    c = trelay.session()
    c.roundtrip()
    t0 = time.monotonic()
    c.send(ping_frame(b"halfhalf")[:9])
    c.expect_conn_error("TIMEOUT", timeout=IDLE + SLACK + 2)
    assert time.monotonic() - t0 <= min(FRAME, IDLE) + SLACK
