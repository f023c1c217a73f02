"""Stream ids and states: SPEC §4.3, §4.4, §4.6, §4.7."""
import os

import pytest

from agentlib import (open_frame, chunk_frame, hash_frame, cancel_frame, error_frame, sha1, pattern,
                      SIZE_KNOWN)


def key(tag):
    return f"streams/{tag}-{os.urandom(4).hex()}"


def finished(c, sid, tag="fin"):
    """Stream sid finished by RESULT."""
    data = pattern(100, sid)
    r = c.upload_honest(key(tag), data, sid=sid)
    assert r["type"] == "RESULT"
    return data


def receiving(c, sid, size=1000, tag="rx"):
    c.open(sid, key(tag), size=size, flags=SIZE_KNOWN)
    o = c.expect_offset(sid)
    assert o["disposition"] == "START", o
    return o


def reset_by_relay(c, sid):
    c.open(sid, "bad//key")
    c.expect_stream_error(sid, "INVALID_KEY")


# -- ids (§4.3)

def test_open_id_decreasing(relay):
    c = relay.session()
    receiving(c, 5)
    c.send(open_frame(3, key("dec"), 10, flags=SIZE_KNOWN))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_open_id_reused_after_result(relay):
    c = relay.session()
    finished(c, 1)
    c.send(open_frame(1, key("reuse"), 10, flags=SIZE_KNOWN))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_open_id_reused_after_stream_error(relay):
    c = relay.session()
    reset_by_relay(c, 1)
    c.send(open_frame(1, key("reuse"), 10, flags=SIZE_KNOWN))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_open_id_reused_while_open(relay):
    c = relay.session()
    receiving(c, 1)
    c.send(open_frame(1, key("reuse"), 10, flags=SIZE_KNOWN))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_open_max_stream_id(relay):
    c = relay.session()
    receiving(c, 0x7FFFFFFF)
    c.roundtrip()


def test_ids_need_not_be_consecutive(relay):
    c = relay.session()
    finished(c, 2)
    finished(c, 1000)
    finished(c, 1001)


# -- frames on never-opened streams (§4.7)

@pytest.mark.parametrize("kind", ["CHUNK", "HASH", "CANCEL", "ERROR"])
def test_frame_on_never_opened_stream(relay, kind):
    c = relay.session()
    receiving(c, 1)
    f = {"CHUNK": lambda: chunk_frame(7, 0, b"abc"), "HASH": lambda: hash_frame(7, 0, sha1(b"")),
         "CANCEL": lambda: cancel_frame(7), "ERROR": lambda: error_frame(7, 0x12)}[kind]()
    c.send(f)
    c.expect_conn_error("PROTOCOL_ERROR")


# -- frames on streams closed normally: finished (§4.4, §4.7)

def test_chunk_after_result(relay):
    c = relay.session()
    finished(c, 1)
    c.send(chunk_frame(1, 100, b"more"))
    c.expect_conn_error("STREAM_CLOSED")


def test_hash_after_result(relay):
    c = relay.session()
    data = finished(c, 1)
    c.send(hash_frame(1, len(data), sha1(data)))
    c.expect_conn_error("STREAM_CLOSED")


@pytest.mark.parametrize("kind", ["CANCEL", "ERROR"])
def test_cancel_or_error_after_result_discarded(relay, kind):
    c = relay.session()
    finished(c, 1)
    c.send(cancel_frame(1) if kind == "CANCEL" else error_frame(1, 0x12))
    c.roundtrip()
    finished(c, 3)


def _stored(c, relay):
    data = pattern(200, 77)
    k = key("stored")
    r = c.upload_honest(k, data, sid=1)
    assert r["type"] == "RESULT"
    c.open(3, k, data)
    o = c.expect_offset(3)
    assert o["disposition"] == "STORED" and o["offset"] == len(data) and o["resume_token"] == "", o
    return data


def test_chunk_after_offset_stored(relay):
    c = relay.session()
    data = _stored(c, relay)
    c.send(chunk_frame(3, 0, data[:10]))
    c.expect_conn_error("STREAM_CLOSED")


def test_cancel_after_offset_stored_discarded(relay):
    c = relay.session()
    _stored(c, relay)
    c.send(cancel_frame(3))
    c.roundtrip()


# -- frames on streams closed normally: abandoned (CANCEL / ERROR received)

@pytest.mark.parametrize("closer", ["CANCEL", "ERROR"])
@pytest.mark.parametrize("then", ["CHUNK", "HASH", "CANCEL"])
def test_frame_after_abandon(relay, closer, then):
    c = relay.session()
    receiving(c, 1)
    c.chunk(1, 0, b"x" * 10)
    c.send(cancel_frame(1) if closer == "CANCEL" else error_frame(1, 0x12))
    c.send({"CHUNK": lambda: chunk_frame(1, 10, b"y"), "HASH": lambda: hash_frame(1, 10, sha1(b"x" * 10)),
            "CANCEL": lambda: cancel_frame(1)}[then]())
    c.expect_conn_error("STREAM_CLOSED")


# -- frames on streams reset by the relay: discarded (§4.7)

def test_chunk_on_reset_stream_discarded_credit_returned(relay):
    c = relay.session()
    reset_by_relay(c, 1)
    c.roundtrip()
    base = c.credit0
    c.send(chunk_frame(1, 0, b"z" * 5000))
    got = c.wait_credit0(base + 5000, 5.0)
    assert got - base == 5000, f"expected CREDIT(0) of 5000 for the discarded CHUNK, got {got - base}"
    c.roundtrip()


def test_hash_and_cancel_on_reset_stream_discarded(relay):
    c = relay.session()
    reset_by_relay(c, 1)
    c.send(hash_frame(1, 0, sha1(b"")))
    c.send(cancel_frame(1))
    c.send(error_frame(1, 0x12))
    c.roundtrip()
    finished(c, 3)


def test_chunk_on_skipped_id_discarded(relay):
    c = relay.session()
    receiving(c, 1)
    receiving(c, 5)
    c.roundtrip()
    base = c.credit0
    c.send(chunk_frame(3, 0, b"s" * 3000))
    got = c.wait_credit0(base + 3000, 5.0)
    assert got - base == 3000, f"expected CREDIT(0) of 3000 for the CHUNK on skipped id 3, got {got - base}"
    c.roundtrip()


def test_hash_twice(relay):
    """Second HASH: stream VERIFYING (PROTOCOL_ERROR) or already finished (STREAM_CLOSED) (§4.4)."""
    c = relay.session()
    data = pattern(1000, 5)
    c.open(1, key("hash2"), data)
    c.expect_offset(1)
    c.chunk(1, 0, data)
    c.send(hash_frame(1, len(data), sha1(data)) * 2)
    c.expect_conn_error("PROTOCOL_ERROR", codes=["PROTOCOL_ERROR", "STREAM_CLOSED"])


# -- maxStreams (§4.3)

def test_more_than_max_streams_refused(relay):
    c = relay.session()
    n = c.welcome["max_streams"]
    for i in range(n):
        receiving(c, 1 + 2 * i, tag="many")
    extra = 1 + 2 * n
    c.send(open_frame(extra, key("extra"), 10, flags=SIZE_KNOWN))
    c.expect_stream_error(extra, "REFUSED_STREAM")
    # same id again: still counts as used
    c.roundtrip()
    c.send(cancel_frame(1))
    c.roundtrip()
    nxt = extra + 2
    receiving(c, nxt, tag="after-cancel")


def test_refused_id_counts_as_used(relay):
    c = relay.session()
    n = c.welcome["max_streams"]
    for i in range(n):
        receiving(c, 1 + i, tag="used")
    c.send(open_frame(100, key("x"), 10, flags=SIZE_KNOWN))
    c.expect_stream_error(100, "REFUSED_STREAM")
    c.send(open_frame(100, key("y"), 10, flags=SIZE_KNOWN))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_interleaved_concurrent_uploads(relay):
    c = relay.session()
    n = c.welcome["max_streams"]
    blobs = {1 + 2 * i: pattern(20000 + i, 100 + i) for i in range(n)}
    keys = {sid: key(f"multi{sid}") for sid in blobs}
    for sid, d in blobs.items():
        c.open(sid, keys[sid], d)
    for sid in blobs:
        assert c.expect_offset(sid)["disposition"] == "START"
    for off in range(0, 20000, 5000):
        for sid, d in blobs.items():
            c.send_data(sid, d[:off + 5000], start=off)
    for sid, d in blobs.items():
        c.send_data(sid, d, start=20000)
        c.hash(sid, len(d), sha1(d))
    for sid, d in blobs.items():
        r = c.expect_result(sid)
        assert r["size"] == len(d)
    for sid, d in blobs.items():
        assert relay.read_object(keys[sid]) == d
