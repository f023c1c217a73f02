"""Striped uploads (SPEC §6.7) by agents that lie: stripes short or long, tokens of other accounts, HASH before
the stripes, stripes sent twice at once. Each case ends with the honest upload beside it intact."""
import os
import struct

from agentlib import SHA1_KNOWN, SIZE_KNOWN, ZERO_SHA1, frame, open_payload, pattern, sha1, uniq

STRIPES = 4
STRIPED, PART = 0x10, 0x20
MIB = 1 << 20
STRIPE = 16 * MIB  # stripe length of blobs up to 4 GiB


def blob(tail=65536):
    """Two stripes: 16 MiB, then `tail` bytes."""
    return uniq(pattern(STRIPE + tail - 15))[: STRIPE + tail]


def open_striped(c, sid, key, data):
    c.send(frame(0x03, SIZE_KNOWN | SHA1_KNOWN | STRIPED, sid, open_payload(key, len(data), sha1(data))))
    off = c.expect_offset(sid)
    assert off["disposition"] == "START" and off["offset"] == 0, off
    assert off["resume_token"], "a striped upload needs a resume token for its PART streams"
    return bytes.fromhex(off["resume_token"]) if isinstance(off["resume_token"], str) else off["resume_token"]


def open_part(c, sid, key, size, token, index):
    c.send(frame(0x03, SIZE_KNOWN | PART, sid, open_payload(key, size, ZERO_SHA1, b"", token) + struct.pack(">I", index)))


def send_stripe(c, sid, key, data, token, index=1):
    open_part(c, sid, key, len(data), token, index)
    off = c.expect_offset(sid)
    assert off["disposition"] == "START", off
    stripe = data[index * STRIPE:(index + 1) * STRIPE]
    c.send_data(sid, stripe)
    c.hash(sid, len(stripe), ZERO_SHA1)
    return c.expect_result(sid)


def finish(relay, c, sid, key, data):
    c.send_data(sid, data[:STRIPE], timeout=30.0)
    c.hash(sid, len(data), sha1(data))
    res = c.expect_result(sid, timeout=30.0)
    assert res["size"] == len(data)
    assert relay.read_object(key) == data


def test_striped_upload_over_two_connections(relay):
    data = blob()
    main, other = relay.session(features=STRIPES), relay.session(features=STRIPES)
    token = open_striped(main, 1, "stripes/ok.bin", data)
    res = send_stripe(other, 1, "stripes/ok.bin", data, token)
    assert res["size"] == len(data) - STRIPE
    finish(relay, main, 1, "stripes/ok.bin", data)


def test_part_with_another_accounts_token_is_refused(relay):
    """Two accounts, one key name: B cannot write into A's striped upload with A's token."""
    data = blob()
    tok_b = relay.add_account("stripesb" + uniq(b"")[-6:].decode())
    a, b = relay.session(features=STRIPES), relay.session(token=tok_b, features=STRIPES)
    token = open_striped(a, 1, "same/name.bin", data)
    open_part(b, 1, "same/name.bin", len(data), token, 1)
    b.expect_stream_error(1, "STORAGE_ERROR")
    send_stripe(a, 3, "same/name.bin", data, token)
    finish(relay, a, 1, "same/name.bin", data)


def test_stripe_short_then_hash_before_stripes(relay):
    data = blob()
    main, liar = relay.session(features=STRIPES), relay.session(features=STRIPES)
    token = open_striped(main, 1, "stripes/short.bin", data)
    open_part(liar, 1, "stripes/short.bin", len(data), token, 1)
    liar.expect_offset(1)
    liar.send_data(1, data[STRIPE:STRIPE + 1000])
    liar.hash(1, 65536, ZERO_SHA1)
    liar.expect_stream_error(1, "SIZE_MISMATCH")
    # The main stream states the blob without its second stripe: refused, stripe 0 kept.
    main.send_data(1, data[:STRIPE], timeout=30.0)
    main.hash(1, len(data), sha1(data))
    main.expect_stream_error(1, "SIZE_MISMATCH", timeout=30.0)
    assert not os.path.exists(relay.object_path("stripes/short.bin")), "nothing may be visible before the commit"
    # The honest agent comes back: stripe 1 whole, then the main stream resumes past stripe 0 and commits.
    send_stripe(liar, 3, "stripes/short.bin", data, token)
    main.send(frame(0x03, SIZE_KNOWN | SHA1_KNOWN | STRIPED, 3, open_payload("stripes/short.bin", len(data), sha1(data), b"", token)))
    off = main.expect_offset(3)
    assert off["disposition"] == "RESUME" and off["offset"] == STRIPE, off
    main.hash(3, len(data), sha1(data))
    main.expect_result(3, timeout=30.0)
    assert relay.read_object("stripes/short.bin") == data


def test_stripe_overrun_and_twin_part(relay):
    data = blob(tail=4096)
    main, one, two = (relay.session(features=STRIPES) for _ in range(3))
    token = open_striped(main, 1, "stripes/over.bin", data)
    open_part(one, 1, "stripes/over.bin", len(data), token, 1)
    one.expect_offset(1)
    # The same stripe on another stream while this one is open: KEY_BUSY.
    open_part(two, 1, "stripes/over.bin", len(data), token, 1)
    two.expect_stream_error(1, "KEY_BUSY")
    # Past the stripe's end (4096 bytes): SIZE_MISMATCH on that stream only.
    one.send_data(1, data[STRIPE:] + b"extra!")
    one.expect_stream_error(1, "SIZE_MISMATCH")
    send_stripe(two, 3, "stripes/over.bin", data, token)
    finish(relay, main, 1, "stripes/over.bin", data)


def test_part_of_a_cancelled_upload_names_nothing_of_the_relay(relay):
    """SPEC §12.3: the main stream is cancelled while a PART stream sends; the PART's HASH is refused with words that
    name no staging file or session of the relay's (issue 40 finding 8)."""
    data = blob()
    main, part = relay.session(features=STRIPES), relay.session(features=STRIPES)
    key = f"stripes/cancelled-{os.urandom(3).hex()}.bin"
    token = open_striped(main, 1, key, data)
    open_part(part, 1, key, len(data), token, 1)
    assert part.expect_offset(1)["disposition"] == "START"
    staging = os.path.join(relay.data, "staging")
    names = set(os.listdir(staging)) if os.path.isdir(staging) else set()
    assert names, "the striped upload stages a file"
    stripe = data[STRIPE:2 * STRIPE]
    part.send_data(1, stripe)
    main.cancel(1)
    main.roundtrip()
    part.hash(1, len(stripe), ZERO_SHA1)
    f = part._expect_on_stream(1, 10.0)
    assert f["type"] == "ERROR", f
    message = f["message"]
    for name in names:
        stem = name.split(".")[0]
        assert stem not in message and stem[:8] not in message, f"the refusal names a staging file: {message!r}"
    assert token.hex() not in message and token.hex()[:8] not in message, message
