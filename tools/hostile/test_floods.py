"""Floods and exhaustion: SPEC §2.3 (PING), §12.3, target: >100 refused OPENs/s -> ENHANCE_YOUR_CALM.
The relay's RSS (VmRSS) must stay bounded."""
import os
import socket
import ssl
import time

from agentlib import (Closed, NoFrame, frame, open_frame, cancel_frame, chunk_frame, ping_frame, sha1,
                      SIZE_KNOWN, RSS_LIMIT_MB)


def staging_count(relay):
    d = os.path.join(relay.data, "staging")
    return len(os.listdir(d)) if os.path.isdir(d) else 0


def test_ping_flood_enhance_your_calm(relay):
    c = relay.session()
    c.send(b"".join(ping_frame(os.urandom(8)) for _ in range(40)))
    c.expect_conn_error("ENHANCE_YOUR_CALM")


def test_ten_pings_in_a_second_are_fine(relay):
    c = relay.session()
    datas = [os.urandom(8) for _ in range(10)]
    c.send(b"".join(ping_frame(d) for d in datas))
    for d in datas:
        f = c.next_frame(5.0, lambda f, d=d: f["type"] == "PONG" and f["data"] == d.hex()
                         or f["type"] == "ERROR")
        assert f["type"] == "PONG", f"10 PINGs in a second are allowed (§2.3), got {f}"


def test_refused_open_flood_enhance_your_calm(relay):
    """Target: more than 100 refused OPENs in one second on a connection -> ERROR(0, ENHANCE_YOUR_CALM)."""
    before = relay.store_files()
    c = relay.session()
    c.send(b"".join(open_frame(1 + 2 * i, "../flood", 4, sha1(b"evil")) for i in range(160)))
    c.expect_conn_error("ENHANCE_YOUR_CALM", timeout=10.0)
    refused = [f for f in c.seen if f["type"] == "ERROR" and f["stream"] != 0]
    assert 100 <= len(refused) <= 101, f"calm after >100 refused OPENs; refused {len(refused)} before it"
    assert all(f["code"] == "INVALID_KEY" for f in refused)
    assert not {k for k in relay.store_files() if k not in before and "alive/" not in k}


def test_refused_stream_flood_enhance_your_calm(relay):
    c = relay.session()
    n = c.welcome["max_streams"]
    for i in range(n):
        c.open(1 + i, f"floods/open-{os.urandom(4).hex()}", size=10, flags=SIZE_KNOWN)
    for i in range(n):
        c.expect_offset(1 + i)
    c.send(b"".join(open_frame(100 + i, f"floods/more{i}", 10, flags=SIZE_KNOWN) for i in range(150)))
    c.expect_conn_error("ENHANCE_YOUR_CALM", timeout=10.0)
    refused = [f for f in c.seen if f["type"] == "ERROR" and f["stream"] >= 100]
    assert all(f["code"] == "REFUSED_STREAM" for f in refused), {f["code"] for f in refused}


def test_open_cancel_flood(relay):
    """Many OPEN+CANCEL pairs without reading: the relay stays bounded; it may calm the agent down (§12.3)."""
    before_staging = staging_count(relay)
    before = relay.store_files()
    c = relay.session()
    batch = []
    sid = 1
    ok = True
    for i in range(1500):
        batch.append(open_frame(sid, f"floods/oc-{i % 7}", 100, flags=SIZE_KNOWN) + cancel_frame(sid))
        sid += 2
        if len(batch) == 300:
            ok = c.try_send(b"".join(batch))
            batch = []
            if not ok:
                break
    relay.assert_rss()
    calm = False
    if ok:
        try:
            c.roundtrip(10.0)
        except AssertionError:
            calm = True
    if calm or not ok:
        e = c.conn_error
        assert e is None or e["code"] == "ENHANCE_YOUR_CALM", f"only ENHANCE_YOUR_CALM may end this: {e}"
    else:
        # each CANCEL was processed before the next OPEN of the key: never KEY_BUSY (target)
        bad = [f for f in c.seen if f["type"] == "ERROR" and f["code"] != "REFUSED_STREAM"]
        assert not bad, f"unexpected errors {[(f['stream'], f['code']) for f in bad[:3]]}"
    c.close()
    assert not {k for k in relay.store_files() if k not in before and "alive/" not in k}
    # cancelled sessions do not leave staging files behind (bounded wait for asynchronous cleanup)
    deadline = time.monotonic() + 5
    while staging_count(relay) > before_staging and time.monotonic() < deadline:
        time.sleep(0.05)
    assert staging_count(relay) <= before_staging, f"staging grew from {before_staging} to {staging_count(relay)}"
    relay.assert_rss()


def test_invalid_open_flood_not_reading(relay):
    """~2 MiB of OPENs with invalid 1000-byte keys, never reading the answers: RSS stays bounded and the
    relay ends the connection (target: ENHANCE_YOUR_CALM)."""
    before = relay.store_files()
    c = relay.session()
    c.sock.settimeout(5.0)
    k = "../" + "k" * 997
    sent = 0
    t0 = time.monotonic()
    sid = 1
    while sent < 2 << 20 and time.monotonic() - t0 < 5:
        blob = b"".join(open_frame(sid + 2 * i, k, 4, sha1(b"evil")) for i in range(256))
        sid += 512
        try:
            c.sock.sendall(blob)
        except (OSError, ssl.SSLError, socket.timeout):
            break
        sent += len(blob)
    rss = relay.assert_rss()
    try:
        c.expect_closed(5.0)
    except AssertionError as e:
        raise AssertionError(f"relay still served the flooding connection after {sent} bytes (RSS {rss:.0f} MB): {e}")
    if c.conn_error is not None:
        assert c.conn_error["code"] == "ENHANCE_YOUR_CALM", c.conn_error
    assert not {x for x in relay.store_files() if x not in before and "alive/" not in x}


def test_big_extension_frames_flood(relay):
    """8 MiB of 1 MiB extension frames after WELCOME: read and dropped, not buffered."""
    c = relay.session()
    big = frame(0x99, 0, 0, b"\x00" * (1 << 20))
    for _ in range(8):
        c.send(big)
    c.roundtrip(15.0)
    relay.assert_rss()


def test_many_connections(relay):
    conns = []
    for _ in range(48):
        conns.append(relay.session())
    relay.assert_rss()
    for c in conns[::7]:
        c.roundtrip()
    for c in conns:
        c.close()


def test_chunks_on_reset_stream_flood(relay):
    """2 MiB of CHUNKs on a stream the relay reset: each is discarded and its credit returned at once (§4.7)."""
    c = relay.session()
    c.open(1, "bad//flood", size=10, flags=SIZE_KNOWN)
    c.expect_stream_error(1, "INVALID_KEY")
    piece = b"d" * 16384
    total = 0
    deadline = time.monotonic() + 20
    while total < 2 << 20:
        assert time.monotonic() < deadline, f"credit stalled at {total} bytes; seen {c.summary()}"
        if c.conn_window >= len(piece):
            c.send(chunk_frame(1, total, piece))
            c.conn_window -= len(piece)
            total += len(piece)
        else:
            try:
                c.next_frame(5.0, lambda f: f["type"] == "CREDIT" and f["stream"] == 0 or f["type"] == "ERROR")
            except NoFrame:
                raise AssertionError(f"no CREDIT(0) for discarded chunks after {total} bytes")
    got = c.wait_credit0(total, 5.0)
    assert got == total, f"CREDIT(0) {got} != {total} discarded bytes"
    relay.assert_rss()
