"""Integrity lies: CRC (SPEC §8.1), size/SHA-1 (§8.2, §4.6 HASH), deflate (§9, §4.6 CHUNK items 1, 10)."""
import os
import zlib

import pytest

from agentlib import uniq, chunk_frame, deflated_chunk_frame, hash_frame, open_frame, sha1, crc, pattern, \
    SIZE_KNOWN, SHA1_KNOWN, OVERWRITE, DEFLATED


def key(tag):
    return f"integrity/{tag}-{os.urandom(4).hex()}"


def start(c, sid, k, data, **kw):
    c.open(sid, k, data, **kw)
    o = c.expect_offset(sid)
    assert o["disposition"] == "START", o
    return o


def new_files(relay, before):
    return {k for k in relay.store_files() if k not in before and "alive/" not in k}


def _hexes(v):
    return {f"{v:08x}", f"{v:x}", str(v)}


# -- CRC (§8.1)

def test_bad_crc_first_chunk(relay):
    before = relay.store_files()
    c = relay.session()
    data = pattern(5000, 1)
    start(c, 1, key("crc0"), data)
    lie = crc(data) ^ 0xDEADBEEF
    c.send(chunk_frame(1, 0, data, crc32=lie))
    e = c.expect_stream_error(1, "CRC_MISMATCH")
    msg = e["message"].lower()
    assert "0" in msg and any(h in msg for h in _hexes(lie)) and any(h in msg for h in _hexes(crc(data))), \
        f"CRC_MISMATCH message must name offset, expected and actual: {e['message']!r}"
    c.roundtrip()
    assert not new_files(relay, before)


def test_bad_crc_keeps_durable_prefix(relay):
    c = relay.session()
    data = pattern(48 * 1024, 2)
    k = key("crcmid")
    o = start(c, 1, k, data)
    tok = bytes.fromhex(o["resume_token"])
    c.chunk(1, 0, data[:32768])
    acked = c.wait_ack(1, 32768, 5.0)
    assert acked == 32768, f"expected ACK(1, 32768) for the first 32 KiB, got {acked}"
    lie = crc(data[32768:]) ^ 1
    c.send(chunk_frame(1, 32768, data[32768:], crc32=lie))
    e = c.expect_stream_error(1, "CRC_MISMATCH")
    assert "32768" in e["message"], f"message must name the offset 32768: {e['message']!r}"
    # the session is kept: reopen and resume at the durable offset
    c.open(3, k, data, token=tok)
    o2 = c.expect_offset(3)
    assert o2["disposition"] == "RESUME" and o2["offset"] == 32768, \
        f"expected OFFSET RESUME 32768 after CRC_MISMATCH, got {o2['disposition']} {o2['offset']}"
    c.send_data(3, data, start=32768)
    c.hash(3, len(data), sha1(data))
    assert c.expect_result(3)["size"] == len(data)
    assert relay.read_object(k) == data


def test_crc_over_compressed_bytes(relay):
    c = relay.session()
    raw = b"compressible " * 500
    start(c, 1, key("crcz"), raw)
    z = zlib.compress(raw)
    c.send(deflated_chunk_frame(1, 0, raw, crc32=crc(z)))
    c.expect_stream_error(1, "CRC_MISMATCH")


# -- SHA-1 and size (§8.2)

def test_wrong_sha1_in_hash_nothing_stored_session_discarded(relay):
    before = relay.store_files()
    c = relay.session()
    data = pattern(20000, 3)
    k = key("sha")
    c.open(1, k, size=len(data), flags=SIZE_KNOWN)
    o = c.expect_offset(1)
    tok = bytes.fromhex(o["resume_token"])
    c.send_data(1, data)
    bad = bytearray(sha1(data))
    bad[0] ^= 1
    c.hash(1, len(data), bytes(bad))
    c.expect_stream_error(1, "HASH_MISMATCH")
    c.roundtrip()
    assert not new_files(relay, before)
    c.open(3, k, size=len(data), flags=SIZE_KNOWN, token=tok)
    o2 = c.expect_offset(3)
    assert o2["disposition"] == "START", f"session must be discarded after HASH_MISMATCH (§8.2), got {o2}"


def test_hash_sha1_differs_from_open_sha1(relay):
    before = relay.store_files()
    c = relay.session()
    data = pattern(3000, 4)
    start(c, 1, key("openhash"), data)
    c.chunk(1, 0, data)
    c.hash(1, len(data), sha1(b"something else"))
    c.expect_stream_error(1, "HASH_MISMATCH")
    c.roundtrip()
    assert not new_files(relay, before)


def test_open_sha1_lie_detected_at_hash(relay):
    before = relay.store_files()
    c = relay.session()
    data = pattern(3000, 5)
    c.open(1, key("openlie"), data, sha=sha1(b"not the data"))
    assert c.expect_offset(1)["disposition"] == "START"
    c.chunk(1, 0, data)
    c.hash(1, len(data), sha1(data))
    c.expect_stream_error(1, "HASH_MISMATCH")
    c.roundtrip()
    assert not new_files(relay, before)


def test_consistent_sha1_lie_detected(relay):
    """OPEN and HASH agree on a SHA-1 that is not that of the bytes sent."""
    before = relay.store_files()
    c = relay.session()
    claimed = pattern(3000, 6)
    sent = pattern(3000, 7)
    c.open(1, key("consistent"), claimed)
    assert c.expect_offset(1)["disposition"] == "START"
    c.chunk(1, 0, sent)
    c.hash(1, len(claimed), sha1(claimed))
    c.expect_stream_error(1, "HASH_MISMATCH")
    c.roundtrip()
    assert not new_files(relay, before)


def test_hash_mismatch_with_overwrite_keeps_old_object(relay):
    c = relay.session()
    k = key("keep")
    old = uniq(b"the good old content")
    assert c.upload_honest(k, old, sid=1)["type"] == "RESULT"
    new = pattern(4000, 8)
    c.open(3, k, size=len(new), flags=SIZE_KNOWN | OVERWRITE)
    assert c.expect_offset(3)["disposition"] == "START"
    c.chunk(3, 0, new)
    c.hash(3, len(new), sha1(b"lie"))
    c.expect_stream_error(3, "HASH_MISMATCH")
    c.roundtrip()
    assert relay.read_object(k) == old


# -- deflate (§9)

def test_deflated_chunk_without_negotiation(relay):
    c = relay.session(features=0)
    assert c.welcome["features"] & 1 == 0
    raw = b"a" * 1000
    start(c, 1, key("nodefl"), raw)
    c.send(deflated_chunk_frame(1, 0, raw))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_deflated_upload_ok(relay):
    c = relay.session()
    assert c.welcome["features"] & 1, "relay should echo DEFLATE by default"
    raw = (b"0123456789abcdef" * 4096)[:60000]
    k = key("defl")
    start(c, 1, k, raw)
    c.send(deflated_chunk_frame(1, 0, raw[:30000]))
    c.send(deflated_chunk_frame(1, 30000, raw[30000:]))
    c.hash(1, len(raw), sha1(raw))
    assert c.expect_result(1)["size"] == len(raw)
    assert relay.read_object(k) == raw


RAW = (b"hostile deflate " * 400)[:6000]
Z = zlib.compress(RAW)
BAD_DEFLATE = {
    "garbage": lambda: (os.urandom(200), len(RAW)),
    "raw-length-larger": lambda: (Z, len(RAW) + 1),
    "raw-length-smaller": lambda: (Z, len(RAW) - 1),
    "trailing-after-stream": lambda: (Z + b"tail", len(RAW)),
    "truncated-stream": lambda: (Z[:-6], len(RAW)),
    "raw-deflate-no-zlib-header": lambda: (zlib.compress(RAW)[2:-4], len(RAW)),
    "two-streams": lambda: (zlib.compress(RAW[:3000]) + zlib.compress(RAW[3000:]), len(RAW)),
}


@pytest.mark.parametrize("case", list(BAD_DEFLATE))
def test_bad_deflate(relay, case):
    before = relay.store_files()
    c = relay.session()
    c.open(1, key(case), size=len(RAW) + 100, flags=SIZE_KNOWN)  # room for a rawLength lie (§4.6 item 8)
    assert c.expect_offset(1)["disposition"] == "START"
    z, raw_len = BAD_DEFLATE[case]()
    c.send(deflated_chunk_frame(1, 0, RAW, z=z, raw_length=raw_len, crc32=crc(RAW)))
    c.expect_stream_error(1, "DECOMPRESSION_ERROR")
    got = c.wait_credit0(raw_len, 5.0)
    assert got == raw_len, f"every raw byte comes back as CREDIT(0) (§5.4): expected {raw_len}, got {got}"
    c.roundtrip()
    assert not new_files(relay, before)


def test_deflate_bomb(relay):
    """rawLength 60000 but the zlib stream inflates to 64 MiB: bounded by rawLength (§9)."""
    c = relay.session()
    raw = b"\x00" * 60000
    start(c, 1, key("bomb"), raw)
    bomb = zlib.compress(b"\x00" * (64 << 20), 9)
    c.send(deflated_chunk_frame(1, 0, raw, z=bomb, raw_length=60000, crc32=crc(raw)))
    c.expect_stream_error(1, "DECOMPRESSION_ERROR")
    relay.assert_rss()
