"""Accounts: per-account namespaces (target: <store>/<account>/<key>), no cross-account dedup,
overwrite or resume; quotas (target: staged bytes count); revocation (target: within 5 s)."""
import os
import time

import pytest

from agentlib import Closed, NoFrame, chunk_frame, hash_frame, open_frame, sha1, pattern, uniq, SIZE_KNOWN


def acct(tag):
    return f"{tag}{os.urandom(3).hex()}"


def attempt(c, sid, k, data, size_known=True):
    """Upload; return the final frame on sid (RESULT, OFFSET STORED or ERROR)."""
    if size_known:
        c.open(sid, k, data)
    else:
        c.open(sid, k, size=0, flags=0)
    f = c._expect_on_stream(sid, 5.0)
    if f["type"] != "OFFSET" or f["disposition"] == "STORED":
        return f
    off = 0
    while off < len(data):
        err = [x for x in c.seen if x["type"] == "ERROR" and x["stream"] in (0, sid)]
        if err:
            return err[-1]
        room = min(c.conn_window, c.stream_window.get(sid, 0), 16384, len(data) - off)
        if room <= 0:
            c.next_frame(5.0, lambda x: x["type"] == "CREDIT" or x["type"] == "ERROR")
            continue
        c.chunk(sid, off, data[off:off + room])
        off += room
    c.hash(sid, len(data), sha1(data))
    return c._expect_on_stream(sid, 10.0)


def disk_usage(relay, account):
    d = os.path.join(relay.store, account)
    total = 0
    for root, _, files in os.walk(d):
        for fn in files:
            total += os.path.getsize(os.path.join(root, fn))
    return total


def test_store_layout_per_account(relay):
    c = relay.session()
    k = f"layout/{os.urandom(4).hex()}"
    c.upload_honest(k, uniq(b"where am I"), sid=1)
    assert os.path.isfile(os.path.join(relay.store, "dev", k)), \
        f"expected <store>/dev/{k}; store has {sorted(x for x in relay.store_files() if 'layout' in x)}"


def test_welcome_names_account(relay):
    name = acct("w")
    tok = relay.add_account(name)
    c = relay.session(token=tok)
    assert c.welcome["account"] == name


def test_two_accounts_same_key_separate_objects(relay):
    name = acct("b")
    tok = relay.add_account(name)
    k = f"shared/{os.urandom(4).hex()}"
    a = relay.session()
    b = relay.session(token=tok)
    da, db = uniq(b"bytes of A"), uniq(b"bytes of B, longer")
    assert a.upload_honest(k, da, sid=1)["type"] == "RESULT"
    r = b.upload_honest(k, db, sid=1)
    assert r["type"] == "RESULT" and r["status"] == "STORED", f"B's upload must store its own object, got {r}"
    assert relay.read_object(k, "dev") == da
    assert relay.read_object(k, name) == db


def test_other_account_cannot_dedup(relay):
    name = acct("d")
    tok = relay.add_account(name)
    k = f"dedup/{os.urandom(4).hex()}"
    x = pattern(5000, 21)
    a = relay.session()
    a.upload_honest(k, x, sid=1)
    b = relay.session(token=tok)
    b.open(1, k, x)
    o = b.expect_offset(1)
    assert o["disposition"] == "START", f"B must not dedup against A's object (same key): got {o}"
    b.open(3, k + "-other", x)
    o = b.expect_offset(3)
    assert o["disposition"] == "START", f"B must not dedup against A's object (other key): got {o}"


def test_other_account_cannot_overwrite(relay):
    name = acct("o")
    tok = relay.add_account(name)
    k = f"over/{os.urandom(4).hex()}"
    a = relay.session()
    da, db = uniq(b"A's precious"), uniq(b"B's attempt")
    a.upload_honest(k, da, sid=1)
    b = relay.session(token=tok)
    r = b.upload_honest(k, db, sid=1, overwrite=True)
    assert r["type"] == "RESULT"
    assert relay.read_object(k, "dev") == da
    assert relay.read_object(k, name) == db


def test_other_account_cannot_use_resume_token(relay):
    name = acct("r")
    tok = relay.add_account(name)
    k = f"hijack/{os.urandom(4).hex()}"
    d = pattern(40000, 22)
    a = relay.session()
    a.open(1, k, d)
    o = a.expect_offset(1)
    rt = bytes.fromhex(o["resume_token"])
    a.chunk(1, 0, d[:20000])
    assert a.wait_ack(1, 20000) == 20000
    b = relay.session(token=tok)
    b.open(1, k, d, token=rt)
    f = b._expect_on_stream(1, 5.0)
    assert not (f["type"] == "OFFSET" and f["disposition"] == "RESUME"), f"B resumed A's session: {f}"
    assert f["type"] == "OFFSET" and f["disposition"] == "START", \
        f"B's key {k!r} is free in B's namespace: expected OFFSET START, got {f}"


def test_quota_size_known_over(relay):
    name = acct("q")
    tok = relay.add_account(name, quota="100K")
    c = relay.session(token=tok)
    f = attempt(c, 1, "big", pattern(150 * 1024, 23))
    assert f["type"] == "ERROR" and f["code"] == "QUOTA_EXCEEDED", f"expected QUOTA_EXCEEDED, got {f}"
    assert disk_usage(relay, name) <= 100 * 1024


def test_quota_unknown_size_over(relay):
    name = acct("q")
    tok = relay.add_account(name, quota="100K")
    c = relay.session(token=tok)
    f = attempt(c, 1, "big-unknown", pattern(150 * 1024, 24), size_known=False)
    assert f["type"] == "ERROR" and f["code"] == "QUOTA_EXCEEDED", f"expected QUOTA_EXCEEDED, got {f}"
    assert disk_usage(relay, name) <= 100 * 1024


def test_quota_exact_fit_then_one_more_byte(relay):
    name = acct("q")
    tok = relay.add_account(name, quota="100K")
    c = relay.session(token=tok)
    f = attempt(c, 1, "exact", pattern(100 * 1024, 25))
    assert f["type"] == "RESULT", f"an upload of exactly the quota fits, got {f}"
    f = attempt(c, 3, "one-more", b"!")
    assert f["type"] == "ERROR" and f["code"] == "QUOTA_EXCEEDED", f"expected QUOTA_EXCEEDED, got {f}"
    assert disk_usage(relay, name) <= 100 * 1024


def test_quota_counts_staged_bytes(relay):
    """Target: OPEN whose size + used + staged bytes passes the quota -> QUOTA_EXCEEDED."""
    name = acct("q")
    tok = relay.add_account(name, quota="100K")
    c = relay.session(token=tok)
    d1, d2 = pattern(60 * 1024, 26), pattern(60 * 1024, 27)
    c.open(1, "first", d1)
    assert c.expect_offset(1)["disposition"] == "START"
    c.chunk(1, 0, d1[:10000])
    c.open(3, "second", d2)
    f = c._expect_on_stream(3, 5.0)
    assert f["type"] == "ERROR" and f["code"] == "QUOTA_EXCEEDED", f"expected ERROR(3, QUOTA_EXCEEDED), got {f}"


def test_quota_two_concurrent_commits_in_one_write(relay):
    name = acct("q")
    tok = relay.add_account(name, quota="100K")
    c = relay.session(token=tok)
    d1, d2 = pattern(60 * 1024, 28), pattern(60 * 1024, 29)
    for sid in (1, 3):
        c.open(sid, f"con{sid}", size=0, flags=0)
    for sid in (1, 3):
        assert c.expect_offset(sid)["disposition"] == "START"
    # both blobs fit the stream windows (64K) and together the connection window (256K)
    c.send(chunk_frame(1, 0, d1) + chunk_frame(3, 0, d2) + hash_frame(1, len(d1), sha1(d1)) + hash_frame(3, len(d2), sha1(d2)))
    outcomes = {}
    for sid in (1, 3):
        f = c._expect_on_stream(sid, 10.0)
        outcomes[sid] = f["type"] if f["type"] == "RESULT" else f.get("code")
    assert sorted(outcomes.values()) == ["QUOTA_EXCEEDED", "RESULT"], f"got {outcomes}"
    assert disk_usage(relay, name) <= 100 * 1024, f"on disk {disk_usage(relay, name)} > quota"


def test_revoked_account_live_connection(relay):
    name = acct("rv")
    tok = relay.add_account(name)
    c = relay.session(token=tok)
    c.roundtrip()
    relay.revoke(name)
    t0 = time.monotonic()
    c.expect_conn_error("UNAUTHENTICATED", timeout=6.0)
    assert time.monotonic() - t0 <= 5.5
    c2 = relay.connect()
    c2.hello(token=tok, expect_welcome=False)
    c2.expect_conn_error("UNAUTHENTICATED")


# -- quota plans (PLAN and ROOM, SPEC §3.15, §3.16, §7.2)

QUOTA_PLAN = 0x08


def plan_frame(request, entries, flags=0):
    """PLAN laid out by the independent codec; keys may be bytes that are not UTF-8."""
    import wire
    return wire.encode({"type": "PLAN", "flags": flags, "request": request,
                        "entries": [{"key": k, "size": n} for k, n in entries]})


def test_plan_answers_from_the_account_alone(relay):
    """ROOM counts only the asking account: another account's object under the same key adds nothing to it."""
    a, b = acct("pa"), acct("pb")
    ta, tb = relay.add_account(a, quota="100K"), relay.add_account(b, quota="100K")
    ca = relay.session(token=ta, features=1 | QUOTA_PLAN)
    assert ca.welcome["features"] & QUOTA_PLAN, ca.welcome
    assert attempt(ca, 1, "same", pattern(40 * 1024, 61))["type"] == "RESULT"
    cb = relay.session(token=tb, features=1 | QUOTA_PLAN)
    cb.send(plan_frame(7, [(b"same", 40 * 1024), (b"new", 10)]))
    f = cb.next_frame(5.0, lambda x: x["type"] in ("ROOM", "ERROR"))
    assert f["type"] == "ROOM" and f["request"] == 7, f
    assert f["quota"] == 100 * 1024 and f["used"] == 0 and f["needs"] == [40 * 1024, 10], f
    ca.send(plan_frame(8, [(b"same", 40 * 1024), (b"same", 50 * 1024)]))
    f = ca.next_frame(5.0, lambda x: x["type"] in ("ROOM", "ERROR"))
    assert f["type"] == "ROOM" and f["used"] == 40 * 1024 and f["needs"] == [0, 0], f


def test_plan_pipelined_or_unoffered_is_a_protocol_error(relay):
    """One PLAN at a time (the relay holds at most one per connection), and none without QUOTA_PLAN in force."""
    tok = relay.add_account(acct("pp"), quota="1G")
    c = relay.session(token=tok, features=1 | QUOTA_PLAN)
    assert c.welcome["features"] & QUOTA_PLAN, c.welcome
    # Both in one TLS record, so that the relay reads the second before it could have answered the first.
    c.send(plan_frame(1, [(b"a.jpg", 1)]) + plan_frame(2, [(b"b.jpg", 2)]))
    c.expect_conn_error("PROTOCOL_ERROR")
    plain = relay.session(token=tok, features=1)
    assert not plain.welcome["features"] & QUOTA_PLAN
    plain.send(plan_frame(1, []))
    plain.expect_conn_error("PROTOCOL_ERROR")
    assert relay.alive()


def test_plan_withheld_from_an_account_without_quota(relay):
    """With no quota every selection fits: the relay does not grant QUOTA_PLAN, and a PLAN sent anyway is refused."""
    tok = relay.add_account(acct("pn"))
    c = relay.session(token=tok, features=1 | QUOTA_PLAN)
    assert not c.welcome["features"] & QUOTA_PLAN, c.welcome
    c.send(plan_frame(1, [(b"a.jpg", 1)]))
    c.expect_conn_error("PROTOCOL_ERROR")
    assert relay.alive()


def test_plans_in_turn_are_answered_in_order(relay):
    """PLANs of the most entries, one after the other, each answered before the next is sent: the relay keeps up."""
    tok = relay.add_account(acct("pt"), quota="1G")
    c = relay.session(token=tok, features=1 | QUOTA_PLAN)
    for request in range(20):
        c.send(plan_frame(request, [(f"k/{request}/{i}".encode(), 1000) for i in range(1000)]))
        f = c.next_frame(10.0, lambda x: x["type"] in ("ROOM", "ERROR"))
        assert f["type"] == "ROOM" and f["request"] == request and f["needs"] == [1000] * 1000, describe_short(f)
    assert relay.alive()


def describe_short(f):
    return {k: (v if not isinstance(v, list) else f"[{len(v)} items]") for k, v in f.items()}
