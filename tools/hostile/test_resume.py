"""Resume: SPEC §6.1-§6.3; target: KEY_BUSY is retryable."""
import os
import time

from agentlib import chunk_frame, sha1, pattern, SIZE_KNOWN, SHA1_KNOWN


def key(tag):
    return f"resume/{tag}-{os.urandom(4).hex()}"


def open_retrying_busy(relay, k, d, token=b"", fp=b"", timeout=5.0, size=None, flags=None):
    """New connection, OPEN; KEY_BUSY (the old connection may not be gone yet) is retried."""
    deadline = time.monotonic() + timeout
    sid = 1
    c = relay.session()
    while True:
        if size is None:
            c.open(sid, k, d, token=token, fp=fp)
        else:
            c.open(sid, k, size=size, flags=flags, token=token, fp=fp)
        f = c._expect_on_stream(sid, 5.0)
        if f["type"] == "ERROR" and f["code"] == "KEY_BUSY" and time.monotonic() < deadline:
            sid += 2
            c.expect_quiet(0.1)
            continue
        return c, sid, f


def interrupted(relay, k, d, sent, fp=b"", flags=None):
    """Upload `sent` bytes in two chunks, wait for the ACK of the first, then drop the connection."""
    c = relay.session()
    if flags is None:
        c.open(1, k, d, fp=fp)
    else:
        c.open(1, k, size=len(d), flags=flags, fp=fp)
    o = c.expect_offset(1)
    assert o["disposition"] == "START"
    half = sent // 2
    c.chunk(1, 0, d[:half])
    acked = c.wait_ack(1, half, 5.0)
    assert acked == half, f"expected ACK(1, {half}), got {acked}"
    c.chunk(1, half, d[half:sent])
    c.roundtrip()
    c.close()
    return bytes.fromhex(o["resume_token"]), acked


def test_resume_after_disconnect(relay):
    d = pattern(120000, 41)
    k = key("disc")
    tok, acked = interrupted(relay, k, d, 60000)
    c, sid, f = open_retrying_busy(relay, k, d, token=tok)
    assert f["type"] == "OFFSET" and f["disposition"] == "RESUME", f"expected OFFSET RESUME, got {f}"
    assert acked <= f["offset"] <= 60000, f"RESUME offset {f['offset']} not in [{acked}, 60000]"
    c.send_data(sid, d, start=f["offset"])
    c.hash(sid, len(d), sha1(d))
    assert c.expect_result(sid)["size"] == len(d)
    assert relay.read_object(k) == d


def test_resume_by_fingerprint(relay):
    d = pattern(60000, 42)
    k = key("fp")
    fp = b"inode-1234-mtime-5678"
    _, acked = interrupted(relay, k, d, 30000, fp=fp)
    c, sid, f = open_retrying_busy(relay, k, d, fp=fp)
    assert f["type"] == "OFFSET" and f["disposition"] == "RESUME" and acked <= f["offset"] <= 30000, f
    c.send_data(sid, d, start=f["offset"])
    c.hash(sid, len(d), sha1(d))
    c.expect_result(sid)
    assert relay.read_object(k) == d


def test_resume_fingerprint_changed_starts_over(relay):
    d = pattern(60000, 43)
    k = key("fpchg")
    tok, _ = interrupted(relay, k, d, 30000, fp=b"version-1")
    c, sid, f = open_retrying_busy(relay, k, d, token=tok, fp=b"version-2")
    assert f["type"] == "OFFSET" and f["disposition"] == "START", f"expected START (§6.2), got {f}"


def test_resume_size_changed_starts_over(relay):
    d = pattern(60000, 44)
    k = key("size")
    tok, _ = interrupted(relay, k, d, 30000)
    d2 = d + b"more"
    c, sid, f = open_retrying_busy(relay, k, d2, token=tok)
    assert f["type"] == "OFFSET" and f["disposition"] == "START", f"expected START (§6.2), got {f}"


def test_resume_wrong_offset_after_resume(relay):
    d = pattern(60000, 45)
    k = key("wrongoff")
    tok, _ = interrupted(relay, k, d, 30000)
    c, sid, f = open_retrying_busy(relay, k, d, token=tok)
    assert f["type"] == "OFFSET" and f["disposition"] == "RESUME", f
    c.chunk(sid, 0, d[:1000])
    c.expect_stream_error(sid, "INVALID_OFFSET")


def test_resume_garbage_token_starts(relay):
    c = relay.session()
    d = pattern(1000, 46)
    c.open(1, key("garbage"), d, token=os.urandom(16))
    o = c.expect_offset(1)
    assert o["disposition"] == "START", o


def test_resume_token_other_key_starts(relay):
    d = pattern(60000, 47)
    k = key("tokA")
    tok, _ = interrupted(relay, k, d, 30000)
    c = relay.session()
    c.open(1, key("tokB"), d, token=tok)
    o = c.expect_offset(1)
    assert o["disposition"] == "START", f"a token is for the same account and key only (§6.2), got {o}"
