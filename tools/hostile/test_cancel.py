"""CANCEL and KEY_BUSY: SPEC §3.11, §5.4, target: KEY_BUSY never for a key whose stream was closed."""
import os

from agentlib import uniq, chunk_frame, cancel_frame, error_frame, hash_frame, open_frame, sha1, pattern, \
    SIZE_KNOWN, SHA1_KNOWN, OVERWRITE


def key(tag):
    return f"cancel/{tag}-{os.urandom(4).hex()}"


def start(c, sid, k, data):
    c.open(sid, k, data)
    o = c.expect_offset(sid)
    assert o["disposition"] == "START", o
    return o


def test_cancel_returns_all_connection_credit(relay):
    """Fill the whole connection window over 4 streams, CANCEL them: all bytes come back as CREDIT(0) (§5.4)."""
    c = relay.session()
    cw, sw = c.welcome["connection_window"], c.welcome["stream_window"]
    n = cw // sw
    assert n <= c.welcome["max_streams"]
    blobs = {1 + 2 * i: pattern(sw * 2, 10 + i) for i in range(n)}
    for sid, d in blobs.items():
        start(c, sid, key(f"fill{sid}"), d)
    for sid, d in blobs.items():
        c.send(chunk_frame(sid, 0, d[:sw]))
    for sid in blobs:
        c.send(cancel_frame(sid))
    got = c.wait_credit0(n * sw, 5.0)
    c.roundtrip()
    assert c.credit0 == n * sw, f"expected CREDIT(0) total {n * sw} after CANCEL, got {c.credit0}"
    # the window is really back: a full-window chunk on a new stream is accepted
    d = pattern(sw, 99)
    k = key("after")
    start(c, 21, k, d)
    c.send(chunk_frame(21, 0, d))
    c.hash(21, len(d), sha1(d))
    assert c.expect_result(21)["size"] == len(d)


def test_cancel_mid_upload_credit_for_held_bytes(relay):
    c = relay.session()
    d = pattern(50000, 3)
    start(c, 1, key("mid"), d)
    c.send(chunk_frame(1, 0, d[:30000]) + chunk_frame(1, 30000, d[30000:40000]) + cancel_frame(1))
    got = c.wait_credit0(40000, 5.0)
    c.roundtrip()
    assert c.credit0 == 40000, f"expected CREDIT(0) total 40000, got {c.credit0}"


def test_open_same_key_after_cancel_not_busy(relay):
    c = relay.session()
    d = pattern(30000, 4)
    k = key("busy")
    start(c, 1, k, d)
    c.chunk(1, 0, d[:10000])
    c.cancel(1)
    c.roundtrip()
    c.open(3, k, d)
    o = c.expect_offset(3)
    assert o["disposition"] == "START" and o["offset"] == 0, f"expected OFFSET START 0, got {o}"


def test_cancel_discards_session(relay):
    c = relay.session()
    d = pattern(40000, 5)
    k = key("discard")
    o = start(c, 1, k, d)
    tok = bytes.fromhex(o["resume_token"])
    c.chunk(1, 0, d[:20000])
    assert c.wait_ack(1, 20000) == 20000
    c.cancel(1)
    c.roundtrip()
    c.open(3, k, d, token=tok)
    o2 = c.expect_offset(3)
    assert o2["disposition"] == "START", f"CANCEL abandons for good (§3.11): expected START, got {o2}"


def test_cancel_while_opening(relay):
    c = relay.session()
    d = pattern(1000, 6)
    k = key("opening")
    c.send(open_frame(1, k, len(d), sha1(d)) + cancel_frame(1))
    c.roundtrip()
    c.open(3, k, d)
    o = c.expect_offset(3)
    assert o["disposition"] == "START", o


def test_cancel_while_verifying(relay):
    """HASH then CANCEL: either outcome (§3.11), but afterwards the key is not busy."""
    c = relay.session()
    d = pattern(5000, 7)
    k = key("verifying")
    start(c, 1, k, d)
    c.send(chunk_frame(1, 0, d) + hash_frame(1, len(d), sha1(d)) + cancel_frame(1))
    c.roundtrip()
    c.open(3, k, d)
    f = c._expect_on_stream(3, 5.0)
    assert f["type"] == "OFFSET" and f["disposition"] in ("START", "STORED"), f"expected OFFSET, got {f}"


def test_agent_error_keeps_session(relay):
    """ERROR(N) from the agent stops without abandoning: the session is kept (§3.11)."""
    c = relay.session()
    d = pattern(40000, 8)
    k = key("stop")
    o = start(c, 1, k, d)
    tok = bytes.fromhex(o["resume_token"])
    c.chunk(1, 0, d[:20000])
    assert c.wait_ack(1, 20000) == 20000
    c.send(error_frame(1, 0x12, b"pause"))
    c.roundtrip()
    c.open(3, k, d, token=tok)
    o2 = c.expect_offset(3)
    assert o2["disposition"] == "RESUME" and o2["offset"] == 20000, f"expected RESUME 20000, got {o2}"
    c.send_data(3, d, start=20000)
    c.hash(3, len(d), sha1(d))
    c.expect_result(3)
    assert relay.read_object(k) == d


def test_not_busy_after_stream_error(relay):
    c = relay.session()
    d = pattern(3000, 9)
    k = key("err")
    start(c, 1, k, d)
    c.chunk(1, 7, d[7:100])
    c.expect_stream_error(1, "INVALID_OFFSET")
    c.open(3, k, d)
    f = c._expect_on_stream(3, 5.0)
    assert f["type"] == "OFFSET", f"KEY_BUSY must not follow a received ERROR(N) (target), got {f}"


def test_not_busy_after_result(relay):
    c = relay.session()
    k = key("res")
    c.upload_honest(k, uniq(b"one"), sid=1)
    d = uniq(b"two two")
    c.open(3, k, d, overwrite=True)
    f = c._expect_on_stream(3, 5.0)
    assert f["type"] == "OFFSET" and f["disposition"] == "START", f"expected OFFSET START, got {f}"


def test_not_busy_after_offset_stored(relay):
    c = relay.session()
    k = key("stored")
    d = uniq(b"same bytes")
    c.upload_honest(k, d, sid=1)
    c.open(3, k, d)
    assert c.expect_offset(3)["disposition"] == "STORED"
    c.open(5, k, d)
    f = c._expect_on_stream(5, 5.0)
    assert f["type"] == "OFFSET" and f["disposition"] == "STORED", f"expected OFFSET STORED, got {f}"


def test_key_busy_concurrent_then_retry(relay):
    a = relay.session()
    b = relay.session()
    d = pattern(20000, 11)
    k = key("concurrent")
    start(a, 1, k, d)
    b.open(1, k, d)
    b.expect_stream_error(1, "KEY_BUSY")
    b.roundtrip()  # stream error only
    a.send_data(1, d)
    a.hash(1, len(d), sha1(d))
    a.expect_result(1)
    b.open(3, k, d)
    f = b._expect_on_stream(3, 5.0)
    assert f["type"] == "OFFSET" and f["disposition"] == "STORED", f"expected OFFSET STORED on retry, got {f}"


def test_connection_credit_returned_exactly(relay):
    """§5.4: every raw byte of every CHUNK comes back as CREDIT(0), no more, no less."""
    c = relay.session()
    d = pattern(200 * 1024, 12)
    r = c.upload_honest(key("exact"), d, sid=1)
    assert r["type"] == "RESULT"
    got = c.wait_credit0(len(d), 5.0)
    c.roundtrip()
    assert c.credit0 == len(d), f"CREDIT(0) total {c.credit0} != {len(d)} bytes sent"


def test_hash_and_cancel_over_stored_key_not_stuck(relay):
    """Issue 6 finding 5: a commit that fails (ALREADY_EXISTS) after the stream was cancelled must still give the key
    back and drop the session: the next OPEN of the key is answered, never KEY_BUSY, and starts at 0."""
    c = relay.session()
    k = key("stuck")
    first = pattern(3000, 21)
    c.upload_honest(k, first)
    other = uniq(pattern(3000, 22))
    # size known, no SHA-1, no OVERWRITE: the relay only learns at commit that the key holds other content
    s1 = c.sid()
    c.open(s1, k, size=len(other), flags=SIZE_KNOWN)
    o = c.expect_offset(s1)
    assert o["disposition"] == "START", o
    c.chunk(s1, 0, other)
    assert c.wait_ack(s1, len(other)) == len(other)
    c.send(hash_frame(s1, len(other), sha1(other)) + cancel_frame(s1))
    c.roundtrip()
    for sid in (c.sid(), c.sid()):
        c.open(sid, k, size=len(other), flags=SIZE_KNOWN)
        f = c._expect_on_stream(sid, 5.0)
        assert f["type"] == "OFFSET" and f["disposition"] == "START" and f["offset"] == 0, f"expected OFFSET START 0, got {f}"
        c.cancel(sid)
        c.roundtrip()


def _durable_session(c, k, d, done=20000):
    """A session of key k with `done` durable bytes, its stream stopped with ERROR(N) (which keeps it)."""
    sid = c.sid()
    o = start(c, sid, k, d)
    tok = bytes.fromhex(o["resume_token"])
    c.chunk(sid, 0, d[:done])
    assert c.wait_ack(sid, done) == done
    c.send(error_frame(sid, 0x12, b"pause"))
    c.roundtrip()
    return tok


def test_cancel_while_opening_discards_session(relay):
    """Issue 6 finding 12, SPEC §3.11: CANCEL means abandon, even while the relay still looks the upload up."""
    c = relay.session()
    d = uniq(pattern(40000, 23))
    k = key("opening-discard")
    tok = _durable_session(c, k, d)
    sid = c.sid()
    c.send(open_frame(sid, k, len(d), sha1(d), token=tok) + cancel_frame(sid))
    c.roundtrip()
    sid = c.sid()
    c.open(sid, k, d, token=tok)
    o = c.expect_offset(sid)
    assert o["disposition"] == "START" and o["offset"] == 0, f"expected START 0 after CANCEL, got {o}"


def test_size_mismatch_discards_session(relay):
    """Issue 6 finding 12, SPEC §8.2: after SIZE_MISMATCH the session is discarded and the agent restarts from 0."""
    c = relay.session()
    d = uniq(pattern(40000, 24))
    k = key("size-discard")
    sid = c.sid()
    o = start(c, sid, k, d)
    tok = bytes.fromhex(o["resume_token"])
    c.chunk(sid, 0, d[:20000])
    assert c.wait_ack(sid, 20000) == 20000
    c.hash(sid, 20000, sha1(d[:20000]))
    c.expect_stream_error(sid, "SIZE_MISMATCH")
    c.roundtrip()
    sid = c.sid()
    c.open(sid, k, d, token=tok)
    o = c.expect_offset(sid)
    assert o["disposition"] == "START" and o["offset"] == 0, f"expected START 0 after SIZE_MISMATCH, got {o}"
