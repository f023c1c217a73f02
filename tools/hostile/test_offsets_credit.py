"""Offsets and sizes (SPEC §4.6 CHUNK items 7-8, HASH item 6) and credit lies (§5.2, §4.6 items 2, 9)."""
import os
import zlib

import pytest

from agentlib import chunk_frame, deflated_chunk_frame, hash_frame, sha1, pattern, SIZE_KNOWN


def key(tag):
    return f"offsets/{tag}-{os.urandom(4).hex()}"


def start(c, sid, k, data=None, size=None, flags=None):
    if data is not None:
        c.open(sid, k, data)
    else:
        c.open(sid, k, size=size or 0, flags=flags if flags is not None else (SIZE_KNOWN if size else 0))
    o = c.expect_offset(sid)
    assert o["disposition"] == "START", o
    return o


def settled(relay, before, c=None):
    """After the case nothing new is in the store (alive uploads excepted)."""
    if c is not None:
        c.roundtrip()
    after = relay.store_files()
    new = {k: v for k, v in after.items() if k not in before and "/alive/" not in "/" + k}
    assert not new, f"relay stored {new}"


# -- offsets

@pytest.mark.parametrize("first_offset", [1, 5, 4096])
def test_first_chunk_not_at_zero(relay, first_offset):
    before = relay.store_files()
    c = relay.session()
    data = pattern(10000, 1)
    start(c, 1, key("nz"), data)
    c.chunk(1, first_offset, data[first_offset:first_offset + 100])
    c.expect_stream_error(1, "INVALID_OFFSET")
    settled(relay, before, c)


@pytest.mark.parametrize("second", ["gap", "overlap", "repeat"])
def test_second_chunk_not_next(relay, second):
    before = relay.store_files()
    c = relay.session()
    data = pattern(10000, 2)
    start(c, 1, key(second), data)
    c.chunk(1, 0, data[:1000])
    off = {"gap": 2000, "overlap": 500, "repeat": 0}[second]
    c.chunk(1, off, data[off:off + 1000])
    c.expect_stream_error(1, "INVALID_OFFSET")
    settled(relay, before, c)


def test_chunk_beyond_size(relay):
    before = relay.store_files()
    c = relay.session()
    start(c, 1, key("beyond"), size=100)
    c.chunk(1, 0, b"b" * 150)
    c.expect_stream_error(1, "SIZE_MISMATCH")
    settled(relay, before, c)


def test_more_bytes_than_open_size_over_chunks(relay):
    before = relay.store_files()
    c = relay.session()
    start(c, 1, key("more"), size=100)
    c.chunk(1, 0, b"m" * 60)
    c.chunk(1, 60, b"m" * 60)
    c.expect_stream_error(1, "SIZE_MISMATCH")
    settled(relay, before, c)


def test_lie_more_bytes_then_hash_of_all(relay):
    """OPEN says 100 bytes with SHA-1 of those; the agent sends 200: refused, nothing stored."""
    before = relay.store_files()
    c = relay.session()
    data = pattern(100, 3)
    start(c, 1, key("lie"), data)
    c.chunk(1, 0, data + data)
    c.expect_stream_error(1, "SIZE_MISMATCH")
    settled(relay, before, c)


def test_hash_short_of_open_size(relay):
    before = relay.store_files()
    c = relay.session()
    data = pattern(100, 4)
    start(c, 1, key("short"), size=100)
    c.chunk(1, 0, data[:50])
    c.hash(1, 50, sha1(data[:50]))
    c.expect_stream_error(1, "SIZE_MISMATCH")
    settled(relay, before, c)


def test_hash_claims_size_not_received(relay):
    before = relay.store_files()
    c = relay.session()
    data = pattern(100, 5)
    start(c, 1, key("claims"), data)
    c.chunk(1, 0, data[:50])
    c.hash(1, 100, sha1(data))
    c.expect_stream_error(1, "SIZE_MISMATCH")
    settled(relay, before, c)


@pytest.mark.parametrize("delta", [-1, 1])
def test_hash_size_mismatch_unknown_length(relay, delta):
    before = relay.store_files()
    c = relay.session()
    data = pattern(100, 6)
    start(c, 1, key("unk"), size=0, flags=0)
    c.chunk(1, 0, data)
    c.hash(1, 100 + delta, sha1(data))
    c.expect_stream_error(1, "SIZE_MISMATCH")
    settled(relay, before, c)


def test_zero_length_blob(relay):
    """§10: OPEN, OFFSET START, HASH(0, sha1("")) with no CHUNK, RESULT."""
    c = relay.session()
    k = key("empty")
    start(c, 1, k, size=0, flags=0)
    c.hash(1, 0, sha1(b""))
    r = c.expect_result(1)
    assert r["size"] == 0
    assert relay.read_object(k) == b""


def test_chunk_offset_lies_huge(relay):
    c = relay.session()
    start(c, 1, key("huge"), size=100)
    c.chunk(1, (1 << 62) - 1, b"x")
    c.expect_stream_error(1, "INVALID_OFFSET")


# -- credit lies

def test_chunk_beyond_stream_window(relay):
    before = relay.store_files()
    c = relay.session()
    sw = c.welcome["stream_window"]
    data = pattern(sw + 1, 7)
    start(c, 1, key("sw"), data)
    c.send(chunk_frame(1, 0, data))
    c.expect_stream_error(1, "FLOW_CONTROL_ERROR")
    # every byte received comes back on stream 0 (§5.4)
    got = c.wait_credit0(sw + 1, 5.0)
    assert got == sw + 1, f"expected CREDIT(0) total {sw + 1} after the refused chunk, got {got}"
    settled(relay, before, c)


def test_chunk_beyond_connection_window(relay):
    before = relay.store_files()
    c = relay.session()
    cw = c.welcome["connection_window"]
    data = pattern(cw + 1, 8)
    start(c, 1, key("cw"), data)
    c.send(chunk_frame(1, 0, data))
    c.expect_conn_error("FLOW_CONTROL_ERROR")
    settled(relay, before)


def test_connection_window_checked_before_stream_state(relay):
    """§4.6 item 2 comes before item 3: an over-window CHUNK on a never-opened stream is FLOW_CONTROL_ERROR."""
    c = relay.session()
    cw = c.welcome["connection_window"]
    c.send(chunk_frame(99, 0, b"\x00" * (cw + 1)))
    c.expect_conn_error("FLOW_CONTROL_ERROR")


def test_deflated_raw_length_beyond_connection_window(relay):
    """Windows count raw bytes (§5.1): a small zlib stream of cw+1 raw bytes overruns the connection window."""
    c = relay.session()
    cw = c.welcome["connection_window"]
    raw = b"\x00" * (cw + 1)
    start(c, 1, key("dcw"), raw)
    c.send(deflated_chunk_frame(1, 0, raw))
    c.expect_conn_error("FLOW_CONTROL_ERROR")


def test_deflated_raw_length_beyond_stream_window(relay):
    before = relay.store_files()
    c = relay.session()
    sw = c.welcome["stream_window"]
    raw = b"\x00" * (sw + 1)
    start(c, 1, key("dsw"), raw)
    c.send(deflated_chunk_frame(1, 0, raw))
    c.expect_stream_error(1, "FLOW_CONTROL_ERROR")
    settled(relay, before, c)
