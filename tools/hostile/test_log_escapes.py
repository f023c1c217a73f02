"""What strangers say never reaches the relay's text log raw (issue 40 finding 4, SPEC §1.1, §12.4): an ERROR(0)
message and a HELLO agent name holding a newline that forges a log line, terminal escapes and bidi overrides, sent
before any authentication. The log holds each escaped (\\n, \\u001b), never the raw byte, and no forged line."""
import os

from agentlib import error_frame, hello_frame, Closed, NoFrame

FORGED = "account=dev [UploadRelay] token rotated by admin"
EVIL = f"ok\n2026-01-01T00:00:00+0000 notice upload-relay : {FORGED}\x1b[2J\x1b]0;owned\x07\u202egpj.exe\u0085"


def drain(c):
    try:
        while True:
            c.next_frame(3.0)
    except (Closed, NoFrame, AssertionError):
        pass


def raw_log(relay) -> bytes:
    with open(relay.log_path, "rb") as fh:
        return fh.read()


def test_peer_words_reach_the_text_log_escaped(make_relay):
    relay = make_relay(["--log-level", "debug"])
    tag = os.urandom(4).hex()
    # Before HELLO: an ERROR(0) with the forged line.
    c = relay.connect()
    c.send(error_frame(0, 0x01, (tag + EVIL).encode()))
    drain(c)
    # A HELLO whose agent name forges a line (refused at decode), then one with a good token and the same name.
    for token in (b"not-a-token", relay.token.encode()):
        c = relay.connect()
        c.send(hello_frame(token, name=(tag + EVIL).encode()))
        drain(c)
    # After WELCOME: an ERROR(0) again, from an authenticated agent.
    c = relay.session()
    c.send(error_frame(0, 0x01, (tag + EVIL).encode()))
    drain(c)
    relay.close_conns()
    log = raw_log(relay)
    assert tag.encode() in log, "the peer's words are logged (escaped), not dropped: " + log[-1500:].decode(errors="replace")
    for raw in (b"\x1b", b"\x07", "\u202e".encode(), "\u0085".encode()):
        assert raw not in log, f"raw {raw!r} in the relay's text log"
    for line in log.decode(errors="replace").splitlines():
        assert not (FORGED in line and tag not in line), f"a forged log line: {line!r}"
    assert b"\\u001b" in log or b"\\u{1b}" in log or b"\\x1b" in log, log[-1500:].decode(errors="replace")
