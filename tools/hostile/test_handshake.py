"""Handshake: SPEC §2.1, §2.2, §2.3, §3.1, §4.1."""
import socket
import ssl
import struct
import time

import pytest

from agentlib import (ALPN, Closed, NoFrame, frame, hello_frame, hello_payload, open_frame, chunk_frame,
                      hash_frame, ping_frame, error_frame, goaway_frame, sha1, s16)


def hs(relay):
    return relay.connect()


# -- first frame is not HELLO (§2.1, §4.1 AWAITING_HELLO)

@pytest.mark.parametrize("first", [
    pytest.param(lambda: open_frame(1, "k", 3, sha1(b"abc")), id="OPEN"),
    pytest.param(lambda: ping_frame(), id="PING"),
    pytest.param(lambda: frame(0x90, 0, 0, b"ext"), id="extension-0x90"),
    pytest.param(lambda: goaway_frame(0), id="GOAWAY"),
    pytest.param(lambda: chunk_frame(1, 0, b"x"), id="CHUNK"),
])
def test_first_frame_not_hello(relay, first):
    c = hs(relay)
    c.send(first())
    c.expect_conn_error("PROTOCOL_ERROR")


def test_first_frame_relay_only_welcome(relay):
    c = hs(relay)
    c.send(frame(0x02, 0, 0, struct.pack(">HIIIIIHI", 1, 1114112, 0, 8, 1 << 20, 1 << 16, 1024, 0) + s16(b"x")))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_error0_as_first_frame_closes_without_reply(relay):
    c = hs(relay)
    c.send(error_frame(0, 0x15, b"bye"))
    c.expect_closed(5.0)
    assert c.seen == [], f"relay answered ERROR(0) with {c.summary()}"


# -- garbage

def test_garbage_http_request(relay):
    c = hs(relay)
    c.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # length 0x47455420 > 65536
    c.expect_conn_error("FRAME_SIZE_ERROR")


def test_garbage_length_below_header(relay):
    c = hs(relay)
    c.send(b"\x00\x00\x00\x03")  # 4 bytes decide (§1.3)
    c.expect_conn_error("FRAME_SIZE_ERROR")


def test_garbage_oversized_before_welcome_4_bytes(relay):
    c = hs(relay)
    c.send(struct.pack(">I", 65537))  # initial max frame size is 65536 (§1.3)
    c.expect_conn_error("FRAME_SIZE_ERROR")


def test_garbage_unknown_type(relay):
    c = hs(relay)
    c.send(frame(0x00, 0, 0, b"\x00" * 30))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_hello_bad_magic(relay):
    c = hs(relay)
    c.send(frame(0x01, 0, 0, hello_payload(relay.token.encode(), magic=b"UPLX")))
    c.expect_conn_error("PROTOCOL_ERROR")


# -- versions (§2.2 step 1)

@pytest.mark.parametrize("lo,hi", [(2, 5), (0, 0), (7, 0xFFFF)])
def test_no_common_version(relay, lo, hi):
    c = hs(relay)
    c.send(hello_frame(relay.token.encode(), min_v=lo, max_v=hi))
    c.expect_conn_error("UNSUPPORTED_VERSION")


def test_version_min_above_max(relay):
    c = hs(relay)
    c.send(hello_frame(relay.token.encode(), min_v=2, max_v=1))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_version_wide_range_selects_1(relay):
    c = hs(relay)
    w = c.hello(min_v=0, max_v=9)
    assert w["version"] == 1


def test_bad_version_checked_before_token(relay):
    c = hs(relay)
    c.send(hello_frame(b"not-a-token", min_v=3, max_v=4))
    c.expect_conn_error("UNSUPPORTED_VERSION")


# -- tokens (§2.2 step 2, §3.1)

@pytest.mark.parametrize("kind", ["empty", "unknown", "1024-bytes", "prefix", "suffix-newline", "nul-inside"])
def test_bad_token_unauthenticated(relay, kind):
    t = relay.token.encode()
    tok = {"empty": b"", "unknown": b"x" * 43, "1024-bytes": b"a" * 1024, "prefix": t[:-1],
           "suffix-newline": t + b"\n", "nul-inside": t + b"\x00"}[kind]
    c = hs(relay)
    c.send(hello_frame(tok))
    f = c.expect_conn_error("UNAUTHENTICATED")
    assert relay.token not in f["message"], "token echoed in ERROR message (§12.3)"


def test_token_over_1024_bytes(relay):
    c = hs(relay)
    c.send(hello_frame(b"a" * 1025))
    c.expect_conn_error("PROTOCOL_ERROR")


@pytest.mark.parametrize("method", [0, 3, 255])
def test_unsupported_auth_method(relay, method):
    c = hs(relay)
    c.send(hello_frame(relay.token.encode(), auth=method))
    c.expect_conn_error("UNAUTHENTICATED")


def test_auth_method_2_client_cert_unsupported(relay):
    c = hs(relay)
    c.send(hello_frame(b"", auth=2))
    c.expect_conn_error("UNAUTHENTICATED")


def test_auth_method_2_with_valid_token(relay):
    c = hs(relay)
    c.send(hello_frame(relay.token.encode(), auth=2))
    c.expect_conn_error("UNAUTHENTICATED")


# -- other HELLO fields (§3.1)

@pytest.mark.parametrize("mfs", [16383, 16777217, 0])
def test_hello_max_frame_size_out_of_range(relay, mfs):
    c = hs(relay)
    c.send(hello_frame(relay.token.encode(), max_frame=mfs))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_hello_agent_name_too_long(relay):
    c = hs(relay)
    c.send(hello_frame(relay.token.encode(), name=b"n" * 256))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_hello_agent_name_invalid_utf8(relay):
    c = hs(relay)
    c.send(hello_frame(relay.token.encode(), name=b"agent\xc0\xaf"))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_hello_trailing_bytes(relay):
    c = hs(relay)
    c.send(frame(0x01, 0, 0, hello_payload(relay.token.encode()) + b"\x00"))
    c.expect_conn_error("FRAME_SIZE_ERROR")


def test_hello_truncated_credential(relay):
    c = hs(relay)
    p = b"UPLD" + struct.pack(">HHIIB", 1, 1, 1114112, 1, 1) + struct.pack(">H", 50) + b"short"
    c.send(frame(0x01, 0, 0, p))
    c.expect_conn_error("FRAME_SIZE_ERROR")


def test_hello_on_stream_1(relay):
    c = hs(relay)
    c.send(frame(0x01, 0, 1, hello_payload(relay.token.encode())))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_hello_with_flag(relay):
    c = hs(relay)
    c.send(frame(0x01, 0x01, 0, hello_payload(relay.token.encode())))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_second_hello(relay):
    c = hs(relay)
    c.hello()
    c.send(hello_frame(relay.token.encode()))
    c.expect_conn_error("PROTOCOL_ERROR")


def test_welcome_fields(relay):
    c = hs(relay)
    w = c.hello(features=0)
    assert w["features"] == 0, "WELCOME.features must be a subset of HELLO.features (§3.2)"
    assert w["account"] == "dev"
    assert w["max_streams"] == 8 and w["stream_window"] == 65536 and w["connection_window"] == 262144


# -- frames before WELCOME (§2.1)

def test_bad_token_pipelined_upload_stores_nothing(relay):
    """HELLO with a wrong token pipelined with OPEN/CHUNK/HASH: never WELCOME, nothing stored."""
    before = relay.store_files()
    data = b"sneaky bytes"
    c = hs(relay)
    c.send(hello_frame(b"wrong-token") + open_frame(1, "sneak/in", len(data), sha1(data))
           + chunk_frame(1, 0, data) + hash_frame(1, len(data), sha1(data)))
    c.expect_conn_error("UNAUTHENTICATED", codes=["UNAUTHENTICATED", "PROTOCOL_ERROR"])
    assert not any(f["type"] in ("WELCOME", "OFFSET", "RESULT") for f in c.seen), c.summary()
    assert relay.store_files() == before


def test_frame_pipelined_before_welcome(relay):
    """PING sent right behind HELLO: either the relay had sent WELCOME (then PONG), or ERROR(0, PROTOCOL_ERROR)."""
    c = hs(relay)
    c.send(hello_frame(relay.token.encode()) + ping_frame(b"early!!!"))
    f = c.next_frame(5.0)
    if f["type"] == "ERROR":
        assert f["stream"] == 0 and f["code"] == "PROTOCOL_ERROR", f"got {f}"
        c.expect_closed()
    else:
        assert f["type"] == "WELCOME", f"expected WELCOME or ERROR(0, PROTOCOL_ERROR), got {f['type']}"
        g = c.next_frame(5.0)
        assert g["type"] == "PONG" or (g["type"] == "ERROR" and g["stream"] == 0), f"got {g}"
        if g["type"] == "ERROR":
            raise AssertionError(f"relay sent WELCOME and then rejected the PING that followed: {g}")


# -- TLS (§2.1)

def _tls_handshake_fails(relay, ctx):
    raw = relay.raw_tcp(10.0)
    try:
        s = ctx.wrap_socket(raw, server_hostname="localhost")
    except (ssl.SSLError, ConnectionError, OSError):
        return True, None
    try:
        return False, s.selected_alpn_protocol()
    finally:
        s.close()


def _refused_for_alpn(relay, ctx):
    """SPEC §2.1: a connection whose handshake did not select upload/1 is refused: the handshake fails, or the relay
    closes the connection right after it without reading or sending a single frame (its TLS library, NIOSSL, cannot
    send the no_application_protocol alert itself). Returns why not, or None."""
    raw = relay.raw_tcp(10.0)
    try:
        s = ctx.wrap_socket(raw, server_hostname="localhost")
    except (ssl.SSLError, ConnectionError, OSError):
        return None
    try:
        selected = s.selected_alpn_protocol()
        try:
            s.sendall(hello_frame(relay.token.encode()))
        except (ssl.SSLError, ConnectionError, OSError):
            return None
        s.settimeout(5.0)
        try:
            data = s.recv(65536)
        except (ssl.SSLError, ConnectionError, OSError):
            return None
        if data:
            return f"handshake OK (ALPN {selected!r}) and the relay answered {len(data)} bytes to HELLO"
        return None
    finally:
        s.close()


def test_tls_without_alpn_refused(relay):
    why = _refused_for_alpn(relay, relay.tls_context(alpn=()))
    assert why is None, f"expected a client without ALPN to be refused: {why}"


def test_tls_alpn_h2_only_refused(relay):
    why = _refused_for_alpn(relay, relay.tls_context(alpn=("h2",)))
    assert why is None, f"expected a client offering only h2 to be refused: {why}"


def test_tls_alpn_choice_includes_upload1(relay):
    ctx = relay.tls_context(alpn=("h2", ALPN))
    raw = relay.raw_tcp()
    s = ctx.wrap_socket(raw, server_hostname="localhost")
    try:
        assert s.selected_alpn_protocol() == ALPN
        assert s.version() == "TLSv1.3"
    finally:
        s.close()


def test_tls12_refused(relay):
    failed, _ = _tls_handshake_fails(relay, relay.tls_context(max_version=ssl.TLSVersion.TLSv1_2))
    assert failed, "expected TLS 1.2 to be refused (TLS 1.3 only, §2.1)"
