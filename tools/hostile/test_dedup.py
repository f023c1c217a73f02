"""Dedup and STORED answers: SPEC §7, §3.4."""
import os

from agentlib import uniq, sha1, pattern, open_frame, SIZE_KNOWN, SHA1_KNOWN, OVERWRITE


def key(tag):
    return f"dedup/{tag}-{os.urandom(4).hex()}"


def test_open_existing_content_offset_stored(relay):
    c = relay.session()
    k = key("same")
    d = pattern(9000, 31)
    c.upload_honest(k, d, sid=1)
    before = relay.store_files()
    c.open(3, k, d)
    o = c.expect_offset(3)
    assert o["disposition"] == "STORED" and o["offset"] == len(d) and o["resume_token"] == "", o
    c.roundtrip()
    assert relay.store_files() == before
    assert relay.read_object(k) == d


def test_open_existing_with_overwrite_same_content_stored(relay):
    c = relay.session()
    k = key("same-ow")
    d = pattern(900, 32)
    c.upload_honest(k, d, sid=1)
    c.open(3, k, d, overwrite=True)
    o = c.expect_offset(3)
    assert o["disposition"] == "STORED" and o["offset"] == len(d), o


def test_open_different_sha_no_overwrite_already_exists(relay):
    c = relay.session()
    k = key("diff")
    orig = uniq(b"original")
    c.upload_honest(k, orig, sid=1)
    c.open(3, k, uniq(b"replacement"))
    c.expect_stream_error(3, "ALREADY_EXISTS")
    assert relay.read_object(k) == orig


def test_same_sha_different_size_not_stored(relay):
    c = relay.session()
    k = key("size")
    d = uniq(b"original bytes")
    c.upload_honest(k, d, sid=1)
    c.open(3, k, size=len(d) + 1, sha=sha1(d), flags=SIZE_KNOWN | SHA1_KNOWN)
    f = c._expect_on_stream(3, 5.0)
    assert not (f["type"] == "OFFSET" and f["disposition"] == "STORED"), f"STORED for a different size: {f}"


def test_unknown_sha_different_content_already_exists_at_commit(relay):
    c = relay.session()
    k = key("commit")
    first = uniq(b"first version")
    c.upload_honest(k, first, sid=1)
    d = uniq(b"second version!")
    c.open(3, k, size=len(d), flags=SIZE_KNOWN)
    assert c.expect_offset(3)["disposition"] == "START"
    c.chunk(3, 0, d)
    c.hash(3, len(d), sha1(d))
    c.expect_stream_error(3, "ALREADY_EXISTS")
    assert relay.read_object(k) == first


def test_unknown_sha_same_content_result_unchanged(relay):
    c = relay.session()
    k = key("unchanged")
    d = pattern(3000, 33)
    c.upload_honest(k, d, sid=1)
    c.open(3, k, size=len(d), flags=SIZE_KNOWN)
    assert c.expect_offset(3)["disposition"] == "START"
    c.chunk(3, 0, d)
    c.hash(3, len(d), sha1(d))
    r = c.expect_result(3)
    assert r["status"] == "UNCHANGED", r


def test_overwrite_different_content(relay):
    c = relay.session()
    k = key("ow")
    new = uniq(b"brand new")
    c.upload_honest(k, uniq(b"old old old"), sid=1)
    r = c.upload_honest(k, new, sid=3, overwrite=True)
    assert r["type"] == "RESULT" and r["status"] == "STORED", r
    assert relay.read_object(k) == new


def test_dedup_other_key_same_account(relay):
    """§7: MAY place a copy under the new key (STORED) or upload normally (START)."""
    c = relay.session()
    d = pattern(4000, 34)
    k1, k2 = key("src"), key("copy")
    c.upload_honest(k1, d, sid=1)
    c.open(3, k2, d)
    o = c.expect_offset(3)
    if o["disposition"] == "STORED":
        assert relay.read_object(k2) == d, "STORED for a new key: the object must be there"
    else:
        assert o["disposition"] == "START"


# -- the dedup probe (§7.1): feature bit 1, OPEN flag PROBE 0x08, OFFSET CONFIRM

PROBE = 0x08
MIB = 1048576
PROBE_LEN = 262144


def test_probe_not_negotiated_is_protocol_error(relay):
    c = relay.session(features=1)
    assert not c.welcome["features"] & 2
    c.send(open_frame(1, key("probe-off"), size=2 * MIB, sha=sha1(b"x"), flags=SIZE_KNOWN | PROBE))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_probe_granted_confirm_for_stored_bytes_start_for_new(relay):
    c = relay.session(features=3)
    assert c.welcome["features"] & 2, c.welcome
    k = key("probe")
    d = pattern(2 * MIB + 77, 41)
    c.upload_honest(k, d, sid=1)
    # Same size, same first 256 KiB: CONFIRM, and the stream is closed.
    c.send(open_frame(3, key("probe-twin"), size=len(d), sha=sha1(d[:PROBE_LEN]), flags=SIZE_KNOWN | PROBE))
    o = c.expect_offset(3)
    assert o["disposition"] == "CONFIRM" and o["offset"] == 0 and o["resume_token"] == "", o
    # Other first 256 KiB: START, as for an OPEN without SHA-1.
    e = pattern(2 * MIB + 77, 42)
    c.send(open_frame(5, key("probe-new"), size=len(e), sha=sha1(e[:PROBE_LEN]), flags=SIZE_KNOWN | PROBE))
    o = c.expect_offset(5)
    assert o["disposition"] == "START", o
    c.roundtrip()


def test_already_exists_for_a_long_key_fits_its_message(relay):
    """A refusal that names a key of ~1,000 bytes still sends a message of at most 1024 bytes (SPEC 12.1), cut at a
    character boundary: the relay once sent 1,118 and broke the protocol."""
    c = relay.session()
    k = "/".join(("é" * 100 + f"-{os.urandom(4).hex()}-" + "x" * 30) for _ in range(4))
    assert 900 < len(k.encode()) <= 1024
    orig = uniq(b"original")
    c.upload_honest(k, orig, sid=1)
    c.open(3, k, uniq(b"replacement"))
    f = c.expect_stream_error(3, "ALREADY_EXISTS")
    assert len(f["message"].encode()) <= 1024, len(f["message"].encode())
    assert relay.read_object(k) == orig
    c.roundtrip()
