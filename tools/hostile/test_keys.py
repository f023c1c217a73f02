"""Keys: SPEC §12.2 (every rule), §1.1 UTF-8, §4.6 OPEN item 6, target: key in the way."""
import os

import pytest

from agentlib import uniq, open_frame, sha1, pattern, SIZE_KNOWN, SHA1_KNOWN

SEG255 = "s" * 255

INVALID = {
    "dotdot": b"..",
    "dot": b".",
    "dotdot-traversal": b"../../etc/passwd",
    "inner-dotdot": b"a/../b",
    "trailing-dotdot": b"a/..",
    "inner-dot": b"a/./b",
    "absolute": b"/abs",
    "absolute-etc": b"/etc/passwd",
    "just-slash": b"/",
    "trailing-slash": b"trail/",
    "double-slash": b"a//b",
    "empty": b"",
    "nul": b"a\x00b",
    "ctrl-01": b"\x01key",
    "ctrl-1f": b"a\x1fb",
    "del-7f": b"a\x7fb",
    "newline": b"line\nbreak",
    "tab": b"tab\tkey",
    "backslash": b"back\\slash",
    "backslash-traversal": b"..\\..\\x",
    "segment-256": b"seg/" + b"x" * 256,
    "over-maxKeyLength": b"/".join([b"k" * 200] * 5) + b"/" + b"k" * 20,  # 1025 bytes
    "utf8-ff": b"a\xffb",
    "utf8-lone-continuation": b"\x80abc",
    "utf8-overlong-slash": b"a\xc0\xafb",
    "utf8-overlong-3byte": b"\xe0\x80\xaf",
    "utf8-surrogate": b"x\xed\xa0\x80",
    "utf8-above-10ffff": b"\xf4\x90\x80\x80",
    "utf8-truncated": b"abc\xe2\x82",
}


@pytest.mark.parametrize("name", list(INVALID))
def test_invalid_key(relay, name):
    raw = INVALID[name]
    if name == "over-maxKeyLength":
        assert len(raw) == 1025
    before = relay.store_files()
    c = relay.session()
    data = b"evil"
    c.send(open_frame(1, raw, len(data), sha1(data), SIZE_KNOWN | SHA1_KNOWN))
    c.expect_stream_error(1, "INVALID_KEY")
    # the connection goes on (stream error, §1.10) and the next OPEN works
    r = c.upload_honest(f"keys/ok-{os.urandom(4).hex()}", uniq(b"fine"), sid=3)
    assert r["type"] == "RESULT"
    after = relay.store_files()
    new = {k for k in after if k not in before and "keys/ok-" not in k}
    assert not new, f"relay stored {new} for invalid key {raw!r}"
    # nothing escaped the store either
    for p in ("abs", "etc", "x", "b"):
        assert not os.path.exists(os.path.join(relay.data, p)), f"{p} created in the data directory"


VALID = {
    "combining-after-slash": "uni/\u0301x",
    "segment-255": "long/" + SEG255,
    "max-key-length-1024": None,
    "unicode": "sp ace/\u00fc/\u65e5\u672c.txt",
    "dots-inside": "a/.b/..c/...",
    "dash-tilde": "-rf/~user",
    "emoji": "e/\U0001F600",
    "nfc": "n/\u00e9",
    "nfd": "n/e\u0301",
}


@pytest.mark.parametrize("name", list(VALID))
def test_valid_key_accepted_and_stored(relay, name):
    prefix = f"keys-{os.urandom(3).hex()}"
    if name == "max-key-length-1024":
        k = prefix + "/" + "/".join([SEG255] * 3) + "/"
        k += "m" * (1024 - len(k))
    else:
        k = prefix + "/" + VALID[name]
    if name == "max-key-length-1024":
        assert len(k.encode()) == 1024
    data = pattern(777, len(name))
    c = relay.session()
    r = c.upload_honest(k, data, sid=1)
    assert r["type"] == "RESULT", f"expected RESULT for valid key {k!r}, got {r}"
    assert r["key"] == k
    assert relay.read_object(k) == data


def test_nfc_and_nfd_are_different_objects(relay):
    """Keys are compared byte for byte, no normalization (§12.2)."""
    p = f"norm-{os.urandom(3).hex()}/"
    c = relay.session()
    a, b = uniq(b"composed"), uniq(b"decomposed")
    assert c.upload_honest(p + "\u00e9", a, sid=1)["status"] == "STORED"
    assert c.upload_honest(p + "e\u0301", b, sid=3)["status"] == "STORED"
    assert relay.read_object(p + "\u00e9") == a
    assert relay.read_object(p + "e\u0301") == b


def test_key_under_stored_object(relay):
    """Target: OPEN "a/b" when "a" is stored -> ERROR(N, INVALID_KEY) at once, naming "a"."""
    base = f"way-{os.urandom(3).hex()}"
    c = relay.session()
    fa = uniq(b"file a")
    assert c.upload_honest(f"{base}/a", fa, sid=1)["type"] == "RESULT"
    c.open(3, f"{base}/a/b", uniq(b"child"))
    e = c.expect_stream_error(3, "INVALID_KEY")
    assert f"{base}/a" in e["message"], f"message should name the key in the way: {e['message']!r}"
    assert relay.read_object(f"{base}/a") == fa


def test_key_over_stored_prefix(relay):
    """Target: OPEN "a" when "a/b" is stored -> ERROR(N, INVALID_KEY) at once, naming "a/b"."""
    base = f"way-{os.urandom(3).hex()}"
    c = relay.session()
    fc = uniq(b"child")
    assert c.upload_honest(f"{base}/a/b", fc, sid=1)["type"] == "RESULT"
    c.open(3, f"{base}/a", uniq(b"parent"))
    e = c.expect_stream_error(3, "INVALID_KEY")
    assert f"{base}/a/b" in e["message"], f"message should name the key in the way: {e['message']!r}"
    assert relay.read_object(f"{base}/a/b") == fc


def test_exact_key_uni_combining(relay):
    """The key "uni/\\u0301x" (a segment starting with a combining mark) is valid and stored byte for byte."""
    k = "uni/\u0301x"
    data = uniq(b"combining mark after a slash")
    c = relay.session()
    r = c.upload_honest(k, data, sid=1, overwrite=True)
    assert r["type"] in ("RESULT", "OFFSET"), r
    assert relay.read_object(k) == data
    names = os.listdir(os.path.join(relay.store, relay.account, "uni"))
    assert "\u0301x" in names, f"stored names {names!r} (must be the exact bytes, no normalization)"
