"""One account cannot take what all accounts share (issue 40 finding 5, SPEC §7): its unfinished uploads, each a
staging file and an inode of the disk everyone stages on, are capped; past the cap a new upload is refused
QUOTA_EXCEEDED in words, while its own unfinished uploads still resume and other accounts upload as before."""
import os
import time

import pytest

from agentlib import NoFrame, pattern, sha1, describe

CAP = 12


def leave_unfinished(c, sid, key):
    """OPEN a 2-byte upload, send its first byte and wait until it is durable (ACK): a recorded, unfinished upload."""
    c.open(sid, key, size=2)
    o = c.expect_offset(sid)
    assert o["disposition"] == "START", describe(o)
    c.chunk(sid, 0, b"x")
    assert c.wait_ack(sid, 1, 10.0) == 1
    return bytes.fromhex(o["resume_token"])


def test_unfinished_uploads_are_capped_per_account(make_relay):
    relay = make_relay(["--max-unfinished-uploads", str(CAP), "--max-streams", "64"])
    hog = f"hog{os.urandom(3).hex()}"
    relay.add_account(hog)
    c = relay.session(token=relay.tokens[hog])
    tokens = {}
    for i in range(CAP):
        tokens[i] = leave_unfinished(c, 2 * i + 1, f"crumb/{i}")
    sid = 2 * CAP + 1
    c.open(sid, "crumb/one-too-many", size=2)
    f = c.expect_stream_error(sid, "QUOTA_EXCEEDED")
    assert f"{CAP} unfinished uploads" in f["message"], describe(f)
    # The cap holds once the connection is gone (the sessions stay, to be resumed).
    c.close()
    again = relay.session(token=relay.tokens[hog])
    again.open(1, "crumb/another", size=2)
    again.expect_stream_error(1, "QUOTA_EXCEEDED")
    # One of its own still resumes, and finishing it makes room for one new upload.
    for _ in range(50):
        # KEY_BUSY while the relay lets go of the closed connection's keys.
        again.open(3, "crumb/0", size=2, token=tokens[0])
        o = again._expect_on_stream(3, 10.0)
        if not (o["type"] == "ERROR" and o["code"] == "KEY_BUSY"):
            break
        again.expect_quiet(0.1)
    assert o["type"] == "OFFSET" and o["disposition"] == "RESUME" and o["offset"] == 1, describe(o)
    again.chunk(3, 1, b"y")
    again.hash(3, 2, sha1(b"xy"))
    assert again.expect_result(3)["size"] == 2
    again.open(5, "crumb/now-fits", size=2)
    assert again.expect_offset(5)["disposition"] == "START"
    # Another account is not touched by the hog's cap.
    other = relay.session()
    data = pattern(100_000, 5)
    assert other.upload_honest("photo.jpg", data)["type"] == "RESULT"
    assert relay.read_object("photo.jpg") == data


def test_one_account_cannot_take_every_upload_slot(make_relay):
    # 400 descriptors, 16 connections and the relay's reserve of 128 leave 256 upload slots (the log says so).
    relay = make_relay(["--max-connections", "16", "--max-streams", "64", "--log-level", "info"],
                       prefix=["prlimit", "--nofile=400:400"])
    assert '"uploads.max": "256"' in relay.log_tail() or "uploads.max=256" in relay.log_tail(), relay.log_tail()[-2000:]
    hog = f"hog{os.urandom(3).hex()}"
    relay.add_account(hog)
    conns = [relay.session(token=relay.tokens[hog]) for _ in range(5)]
    started, refused = 0, []
    for c in conns:
        for i in range(64):
            sid = 2 * i + 1
            c.open(sid, f"hold/{id(c)}/{i}", size=1000)
            f = c._expect_on_stream(sid, 10.0)
            if f["type"] == "OFFSET":
                started += 1
            else:
                assert f["type"] == "ERROR" and f["code"] == "REFUSED_STREAM", describe(f)
                refused.append(f["message"])
    # The hog holds what is not kept for newcomers (three quarters), and is told it holds its share.
    assert started == 192, (started, refused[:2])
    assert refused and "its share" in refused[0], refused[:1]
    # Another account, arriving now, still gets a whole connection's worth of uploads, and finishes one.
    other = relay.session()
    for i in range(63):
        sid = 2 * i + 3
        other.open(sid, f"other/{i}", size=1000)
        assert other.expect_offset(sid)["disposition"] == "START"
    data = pattern(100_000, 7)
    assert other.upload_honest("photo.jpg", data, sid=2 * 63 + 3)["type"] == "RESULT"
    assert relay.read_object("photo.jpg") == data
    for c in conns:
        c.close()


@pytest.mark.parametrize("holding", ["nothing", "an open upload"])
def test_idle_connections_give_their_memory_share_back(make_relay, holding):
    """Four connections that only wait (with nothing open, or after opening an upload and sending none of it) hold
    the whole memory budget; another account's upload gets the smallest window. Idle for 5 s while the budget is
    short, they are asked to go (GOAWAY), and the upload's window grows."""
    relay = make_relay(["--memory-budget", "4M", "--connection-window", "1M", "--stream-window", "1M"])
    hog = f"hog{os.urandom(3).hex()}"
    relay.add_account(hog)
    hogs = [relay.session(token=relay.tokens[hog]) for _ in range(4)]
    assert sum(h.welcome["connection_window"] for h in hogs) == 4 << 20, [h.welcome["connection_window"] for h in hogs]
    if holding == "an open upload":
        for n, h in enumerate(hogs):
            h.open(1, f"held{n}.bin", size=8 << 20)
            assert h.expect_offset(1)["disposition"] == "START"
    victim = relay.session()
    assert victim.welcome["connection_window"] <= 256 << 10, victim.welcome
    # As many as the upload needs are asked to go: one whole window's worth here.
    asked = []
    deadline = time.monotonic() + 20
    while not asked and time.monotonic() < deadline:
        for h in hogs:
            try:
                f = h.next_frame(0.2, lambda f: f["type"] in ("GOAWAY", "ERROR"))
            except NoFrame:
                continue
            assert f["type"] == "GOAWAY" and f["code"] == "NO_ERROR", describe(f)
            asked.append(h)
    assert asked, "no idle connection was asked to go within 20 s"
    data = pattern(4 << 20, 11)
    assert victim.upload_honest("big.bin", data, sid=1, timeout=30.0)["type"] == "RESULT"
    assert relay.read_object("big.bin") == data
    # Without the idle connections' shares it could never pass the smallest window.
    assert victim.conn_window >= 2 * victim.welcome["connection_window"], \
        f"the uploading connection's window stayed at {victim.conn_window}"
