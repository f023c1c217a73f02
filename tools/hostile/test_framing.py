"""Framing after WELCOME: SPEC §1.2-§1.9, §3 layouts and value rules, direction (§1.4)."""
import os
import struct

import pytest

from agentlib import (frame, hello_frame, open_frame, open_payload, chunk_frame, hash_frame, cancel_frame,
                      error_frame, ping_frame, pong_frame, goaway_frame, sha1, s16, b8, pattern, ZERO_SHA1,
                      SIZE_KNOWN, SHA1_KNOWN, DEFLATED)

U62 = 1 << 62


def opened(relay, size=1000, deflate=True):
    """A session with stream 1 in RECEIVING (OPEN of a fresh key, OFFSET START)."""
    c = relay.session(features=1 if deflate else 0)
    c.open(1, f"framing/{os.urandom(6).hex()}", size=size, flags=SIZE_KNOWN)
    o = c.expect_offset(1)
    assert o["disposition"] == "START"
    return c


# -- length (§1.3)

@pytest.mark.parametrize("length", [0, 9])
def test_length_below_header(relay, length):
    c = relay.session()
    c.send(struct.pack(">I", length))
    c.expect_conn_error("FRAME_SIZE_ERROR")


def test_length_above_negotiated_max_4_bytes(relay):
    c = relay.session()
    c.send(struct.pack(">I", c.welcome["max_frame_size"] + 1))
    c.expect_conn_error("FRAME_SIZE_ERROR")


def test_length_ffffffff(relay):
    c = relay.session()
    c.send(b"\xff\xff\xff\xff")
    c.expect_conn_error("FRAME_SIZE_ERROR")


def test_above_initial_max_is_fine_after_welcome(relay):
    """An extension frame of 70000 bytes (> 65536, <= negotiated max) is read and dropped (§1.3, §1.7)."""
    c = relay.session()
    assert c.welcome["max_frame_size"] >= 70000
    c.send(frame(0xA0, 0, 0, b"\x00" * (70000 - 10)))
    c.roundtrip()


def test_hello_sized_over_initial_max(relay):
    c = relay.connect()
    c.send(struct.pack(">IBBI", 70000, 1, 0, 0) + b"\x00" * 100)
    c.expect_conn_error("FRAME_SIZE_ERROR")


# -- R bit (§1.5)

@pytest.mark.parametrize("which", ["PING", "OPEN", "extension"])
def test_reserved_stream_bit(relay, which):
    c = relay.session()
    if which == "PING":
        c.send(frame(0x0C, 0, 0x80000000, b"12345678"))
    elif which == "OPEN":
        c.send(frame(0x03, 0, 0x80000001, open_payload("rbit")))
    else:
        c.send(frame(0x85, 0, 0x80000000, b"x"))
    c.expect_conn_error("PROTOCOL_ERROR")


# -- flags (§1.6)

FLAG_CASES = {
    "OPEN-0x40": lambda: frame(0x03, 0x40, 3, open_payload("flags/x")),
    "CHUNK-0x02": lambda: frame(0x05, 0x02, 1, struct.pack(">QI", 0, 0) + b"x"),
    "CHUNK-0x80": lambda: frame(0x05, 0x80, 1, struct.pack(">QI", 0, 0) + b"x"),
    "HASH-0x01": lambda: frame(0x08, 0x01, 1, struct.pack(">Q", 0) + ZERO_SHA1),
    "CANCEL-0x01": lambda: frame(0x0B, 0x01, 1, struct.pack(">H", 0x12) + s16(b"")),
    "ERROR-0x01": lambda: frame(0x0A, 0x01, 1, struct.pack(">H", 0x12) + s16(b"")),
    "PING-0x01": lambda: frame(0x0C, 0x01, 0, b"12345678"),
    "PONG-0x80": lambda: frame(0x0D, 0x80, 0, b"12345678"),
    "GOAWAY-0x01": lambda: frame(0x0E, 0x01, 0, struct.pack(">IH", 0, 0) + s16(b"")),
    "CREDIT-0x01": lambda: frame(0x07, 0x01, 0, struct.pack(">I", 1)),
}


@pytest.mark.parametrize("case", list(FLAG_CASES))
def test_undefined_flag(relay, case):
    c = opened(relay)
    c.send(FLAG_CASES[case]())
    c.expect_conn_error("PROTOCOL_ERROR")


# -- stream id rule per type (§1.5)

SID_CASES = {
    "PING-on-1": lambda: frame(0x0C, 0, 1, b"12345678"),
    "PONG-on-1": lambda: frame(0x0D, 0, 1, b"12345678"),
    "GOAWAY-on-1": lambda: frame(0x0E, 0, 1, struct.pack(">IH", 0, 0) + s16(b"")),
    "HELLO-on-1": lambda: frame(0x01, 0, 1, b"UPLD" + struct.pack(">HHIIB", 1, 1, 1114112, 0, 1) + s16(b"t") + s16(b"")),
    "OPEN-on-0": lambda: frame(0x03, 0, 0, open_payload("sid0")),
    "CHUNK-on-0": lambda: frame(0x05, 0, 0, struct.pack(">QI", 0, 0) + b"x"),
    "HASH-on-0": lambda: frame(0x08, 0, 0, struct.pack(">Q", 0) + ZERO_SHA1),
    "CANCEL-on-0": lambda: frame(0x0B, 0, 0, struct.pack(">H", 0x12) + s16(b"")),
}


@pytest.mark.parametrize("case", list(SID_CASES))
def test_wrong_stream_id_for_type(relay, case):
    c = opened(relay)
    c.send(SID_CASES[case]())
    c.expect_conn_error("PROTOCOL_ERROR")


# -- payload layout (§1.8): too short / trailing -> FRAME_SIZE_ERROR

LAYOUT_CASES = {
    "PING-7": lambda: frame(0x0C, 0, 0, b"1234567"),
    "PING-9": lambda: frame(0x0C, 0, 0, b"123456789"),
    "PONG-empty": lambda: frame(0x0D, 0, 0, b""),
    "OPEN-key-beyond-payload": lambda: frame(0x03, 0, 3, struct.pack(">H", 500) + b"abc" + bytes(30)),
    "OPEN-trailing-byte": lambda: frame(0x03, 0, 3, open_payload("layout/t") + b"\x00"),
    "OPEN-no-token-len": lambda: frame(0x03, 0, 3, open_payload("layout/t")[:-1]),
    "OPEN-fp-beyond": lambda: frame(0x03, 0, 3, s16(b"k") + struct.pack(">Q", 0) + ZERO_SHA1 + b"\x05ab"),
    "HASH-27": lambda: frame(0x08, 0, 1, struct.pack(">Q", 0) + bytes(19)),
    "HASH-29": lambda: frame(0x08, 0, 1, struct.pack(">Q", 0) + bytes(21)),
    "CHUNK-11": lambda: frame(0x05, 0, 1, bytes(11)),
    "CHUNK-DEFLATED-15": lambda: frame(0x05, DEFLATED, 1, bytes(15)),
    "CANCEL-3": lambda: frame(0x0B, 0, 1, b"\x00\x12\x00"),
    "CANCEL-msg-beyond": lambda: frame(0x0B, 0, 1, struct.pack(">HH", 0x12, 10) + b"abc"),
    "ERROR-N-3": lambda: frame(0x0A, 0, 1, b"\x00\x12\x00"),
    "ERROR-0-trailing": lambda: frame(0x0A, 0, 0, struct.pack(">H", 0x12) + s16(b"m") + b"!"),
    "GOAWAY-7": lambda: frame(0x0E, 0, 0, bytes(7)),
}


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_payload_layout(relay, case):
    c = opened(relay)
    c.send(LAYOUT_CASES[case]())
    c.expect_conn_error("FRAME_SIZE_ERROR")


# -- field values (§3) -> PROTOCOL_ERROR (connection)

VALUE_CASES = {
    "CHUNK-empty-data": lambda: frame(0x05, 0, 1, struct.pack(">QI", 0, 0)),
    "CHUNK-offset-over-2^62": lambda: chunk_frame(1, U62 + 1, b"x"),
    "CHUNK-offset-plus-len-over-2^62": lambda: chunk_frame(1, U62, b"x"),
    "CHUNK-rawLength-0": lambda: frame(0x05, DEFLATED, 1, struct.pack(">QII", 0, 0, 0) + b"x\x9c"),
    "CHUNK-rawLength-over-max": lambda: frame(0x05, DEFLATED, 1, struct.pack(">QII", 0, 0, 16777217) + b"x\x9c"),
    "OPEN-size-over-2^62": lambda: open_frame(3, "v/size", U62 + 1, ZERO_SHA1, SIZE_KNOWN),
    "OPEN-size-without-SIZE_KNOWN": lambda: open_frame(3, "v/size", 10, ZERO_SHA1, 0),
    "OPEN-sha1-without-SHA1_KNOWN": lambda: open_frame(3, "v/sha", 0, b"\x01" * 20, 0),
    "OPEN-fingerprint-65": lambda: open_frame(3, "v/fp", 0, ZERO_SHA1, 0, fp=b"f" * 65),
    "OPEN-resume-token-65": lambda: open_frame(3, "v/tok", 0, ZERO_SHA1, 0, token=b"t" * 65),
    "HASH-size-over-2^62": lambda: hash_frame(1, U62 + 1, ZERO_SHA1),
    "CANCEL-message-1025": lambda: cancel_frame(1, 0x12, b"m" * 1025),
    "CANCEL-message-bad-utf8": lambda: cancel_frame(1, 0x12, b"\xff\xfe"),
    "ERROR-N-message-bad-utf8": lambda: error_frame(1, 0x12, b"bad \xed\xa0\x80"),
    "ERROR-N-message-1025": lambda: error_frame(1, 0x12, b"m" * 1025),
    "GOAWAY-reserved-bit": lambda: goaway_frame(0x80000000),
    "GOAWAY-message-1025": lambda: goaway_frame(1, 0, b"m" * 1025),
}


@pytest.mark.parametrize("case", list(VALUE_CASES))
def test_field_value(relay, case):
    before = relay.store_files()
    c = opened(relay)
    c.send(VALUE_CASES[case]())
    c.expect_conn_error("PROTOCOL_ERROR")
    assert relay.store_files() == before


# -- unknown types and extension frames (§1.7)

@pytest.mark.parametrize("t", [0x00, 0x11, 0x7F])
def test_unknown_type_below_0x80(relay, t):
    c = relay.session()
    c.send(frame(t, 0, 0, b"\x00" * 8))
    c.expect_conn_error("PROTOCOL_ERROR")


@pytest.mark.parametrize("t,flags,sid", [(0x80, 0, 0), (0xFF, 0xFF, 0x7FFFFFFF), (0xC3, 0x01, 999), (0x80, 0, 1)])
def test_extension_frame_discarded(relay, t, flags, sid):
    c = relay.session()
    c.send(frame(t, flags, sid, os.urandom(33)))
    c.send(frame(t, flags, sid, b""))  # empty payload: nothing is checked (§1.7)
    c.roundtrip()


def test_extension_frames_interleaved_with_upload(relay):
    c = relay.session()
    data = pattern(50000, 3)
    key = f"framing/ext-{os.urandom(4).hex()}"
    c.open(1, key, data)
    assert c.expect_offset(1)["disposition"] == "START"
    for off in range(0, len(data), 10000):
        c.send(frame(0xEE, 0x55, 1, os.urandom(100)))
        c.chunk(1, off, data[off:off + 10000])
    c.send(frame(0x80, 0, 12345, b""))
    c.hash(1, len(data), sha1(data))
    r = c.expect_result(1)
    assert r["status"] == "STORED" and r["size"] == len(data)
    assert relay.read_object(key) == data


# -- frames only a relay sends (§1.4 direction)

DIRECTION_CASES = {
    "WELCOME": lambda: frame(0x02, 0, 0, struct.pack(">HIIIIIHI", 1, 1114112, 0, 8, 1 << 20, 1 << 16, 1024, 0) + s16(b"x")),
    "OFFSET": lambda: frame(0x04, 0, 1, struct.pack(">BQ", 0, 0) + b8(b"")),
    "ACK": lambda: frame(0x06, 0, 1, struct.pack(">Q", 1)),
    "CREDIT-0": lambda: frame(0x07, 0, 0, struct.pack(">I", 1000)),
    "CREDIT-N": lambda: frame(0x07, 0, 1, struct.pack(">I", 1000)),
    "RESULT": lambda: frame(0x09, 0, 1, struct.pack(">BQ", 0, 0) + ZERO_SHA1 + s16(b"k")),
}


@pytest.mark.parametrize("case", list(DIRECTION_CASES))
def test_relay_only_frame_from_agent(relay, case):
    c = opened(relay)
    c.send(DIRECTION_CASES[case]())
    c.expect_conn_error("PROTOCOL_ERROR")


# -- misc connection frames

def test_unsolicited_pong_ignored(relay):
    c = relay.session()
    c.send(pong_frame(b"nobody!!"))
    c.roundtrip()


def test_agent_error0_closes_without_reply(relay):
    c = relay.session()
    c.send(error_frame(0, 0x15, b"agent gives up"))
    c.expect_closed()
    assert not [f for f in c.seen if f["type"] == "ERROR"], c.summary()


def test_open_after_agent_goaway(relay):
    """§4.3: an OPEN received by a relay that has received GOAWAY is PROTOCOL_ERROR (connection)."""
    c = opened(relay)
    c.send(goaway_frame(1) + open_frame(3, "goaway/after", 1, flags=SIZE_KNOWN))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_agent_goaway_increasing(relay):
    """§3.14: a GOAWAY whose lastStreamID is greater than a previous one is PROTOCOL_ERROR (connection)."""
    c = opened(relay)
    c.send(goaway_frame(1) + goaway_frame(5))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_agent_goaway_then_finish_upload(relay):
    """After the agent's GOAWAY, its open stream still completes (§6.5: the agent opens no more streams)."""
    c = relay.session()
    data = pattern(5000)
    k = f"framing/goaway-{os.urandom(4).hex()}"
    c.open(1, k, data)
    assert c.expect_offset(1)["disposition"] == "START"
    c.send(goaway_frame(1))
    c.chunk(1, 0, data)
    c.hash(1, len(data), sha1(data))
    assert c.expect_result(1)["size"] == len(data)


def test_agent_goaway_no_streams_still_ready(relay):
    """§4.1: GOAWAY received in READY only records lastStreamID; PING is still answered."""
    c = relay.session()
    c.send(goaway_frame(0))
    c.roundtrip()
