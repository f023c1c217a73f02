#!/usr/bin/env python3
"""Generate and/or check protocol/vectors/ for upload wire protocol v1.

    python3 tools/spec-check/gen_vectors.py          # rewrite vectors, then check them
    python3 tools/spec-check/gen_vectors.py --check  # only check the files on disk

Deterministic: no randomness, no clock. Section references are to protocol/SPEC.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import wire  # noqa: E402
from wire import encode, raw_frame, header  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
VEC = os.path.join(ROOT, "protocol", "vectors")
SPEC = os.path.join(ROOT, "protocol", "SPEC.md")

EMPTY_SHA1 = "da39a3ee5e6b4b0d3255bfef95601890afd80709"
Z20 = "00" * 20


# ---------------------------------------------------------------- frame builders (dict form)

def HELLO(features=0, max_frame_size=1114112, min_version=1, max_version=1, auth_method=1,
          credential=b"tok-0123456789".hex(), agent_name="agent-7 (linux-arm64)"):
    return {"type": "HELLO", "stream": 0, "flags": 0, "magic": "UPLD", "min_version": min_version,
            "max_version": max_version, "max_frame_size": max_frame_size, "features": features,
            "auth_method": auth_method, "credential": credential, "agent_name": agent_name}


def WELCOME(features=0, connection_window=16777216, stream_window=4194304, max_streams=64,
            max_frame_size=1114112, version=1, max_key_length=1024, idle=120000, account="cam-7"):
    return {"type": "WELCOME", "stream": 0, "flags": 0, "version": version,
            "max_frame_size": max_frame_size, "features": features, "max_streams": max_streams,
            "connection_window": connection_window, "stream_window": stream_window,
            "max_key_length": max_key_length, "idle_timeout_millis": idle, "account": account}


def OPEN(sid, key="cam-7/clips/a.mp4", size=None, sha1=None, overwrite=False, fingerprint="",
         resume_token="", probe=None, striped=False, part=None):
    flags = (0x01 if size is not None else 0) | (0x02 if sha1 is not None else 0) | \
        (0x04 if overwrite else 0) | (0x08 if probe is not None else 0) | \
        (0x10 if striped else 0) | (0x20 if part is not None else 0)
    digest = sha1 if sha1 is not None else probe if probe is not None else Z20
    f = {"type": "OPEN", "stream": sid, "flags": flags, "key": key,
         "size": size if size is not None else 0, "sha1": digest,
         "fingerprint": fingerprint, "resume_token": resume_token}
    if part is not None:
        f["part"] = part
    return f


def OFFSET(sid, disposition="START", offset=0, resume_token=""):
    return {"type": "OFFSET", "stream": sid, "flags": 0, "disposition": disposition,
            "offset": offset, "resume_token": resume_token}


def CHUNK(sid, offset, data: bytes, crc=None):
    return {"type": "CHUNK", "stream": sid, "flags": 0, "offset": offset,
            "crc32": zlib.crc32(data) if crc is None else crc, "data": data.hex()}


# zlib.compress(raw, 9) outputs, frozen so that the vectors do not depend on the
# local zlib build (zlib-ng and others may emit different, equally valid streams).
FROZEN_DEFLATE = {
    b"A" * 64: bytes.fromhex("78da7374a40c0000107e1041"),
    b"0123456789abcdef" * 16: bytes.fromhex("78da3330343236313533b7b04c4c4a4e494d3318617c00d7ae4621"),
}


def deflate(raw: bytes) -> bytes:
    comp = FROZEN_DEFLATE.get(raw)
    if comp is None:
        return zlib.compress(raw, 9)  # only for self-tests, never written to a vector file
    assert zlib.decompress(comp) == raw
    return comp


def DCHUNK(sid, offset, raw: bytes, compressed=None, raw_length=None, crc=None):
    comp = deflate(raw) if compressed is None else compressed
    return {"type": "CHUNK", "stream": sid, "flags": 0x01, "offset": offset,
            "crc32": zlib.crc32(raw) if crc is None else crc,
            "raw_length": len(raw) if raw_length is None else raw_length, "data": comp.hex()}


def ACK(sid, offset):
    return {"type": "ACK", "stream": sid, "flags": 0, "offset": offset}


def CREDIT(sid, inc):
    return {"type": "CREDIT", "stream": sid, "flags": 0, "increment": inc}


def HASH(sid, size, sha1):
    return {"type": "HASH", "stream": sid, "flags": 0, "size": size, "sha1": sha1}


def RESULT(sid, status, size, sha1, key):
    return {"type": "RESULT", "stream": sid, "flags": 0, "status": status, "size": size,
            "sha1": sha1, "key": key}


def ERROR(sid, code, message=""):
    return {"type": "ERROR", "stream": sid, "flags": 0, "code": code, "message": message}


def CANCEL(sid, code="CANCELLED", message=""):
    return {"type": "CANCEL", "stream": sid, "flags": 0, "code": code, "message": message}


def PING(data="0102030405060708"):
    return {"type": "PING", "stream": 0, "flags": 0, "data": data}


def PONG(data="0102030405060708"):
    return {"type": "PONG", "stream": 0, "flags": 0, "data": data}


def GOAWAY(last, code="NO_ERROR", message=""):
    return {"type": "GOAWAY", "stream": 0, "flags": 0, "last_stream_id": last, "code": code,
            "message": message}


def PLAN(request, entries, overwrite=False):
    """Entries are (key, size); a key given as bytes is one that is not UTF-8, written as key_hex (Appendix A.1)."""
    return {"type": "PLAN", "stream": 0, "flags": 0x04 if overwrite else 0, "request": request,
            "entries": [{"key_hex": k.hex(), "size": n} if isinstance(k, bytes) else {"key": k, "size": n}
                        for k, n in entries]}


def ROOM(request, quota, used, needs):
    return {"type": "ROOM", "stream": 0, "flags": 0, "request": request, "quota": quota, "used": used,
            "needs": list(needs)}


def p_plan(request, entries) -> bytes:
    return struct.pack(">IH", request, len(entries)) + b"".join(p_str16(k) + struct.pack(">Q", n) for k, n in entries)


def sha1hex(b: bytes) -> str:
    return hashlib.sha1(b).hexdigest()


def H(f) -> str:
    return (encode(f) if isinstance(f, dict) else f).hex()


def snd(f):
    return {"send": H(f)}


def rcv(f):
    return {"receive": H(f)}


# payload packers for hand-made (invalid) frames
def p_str16(b: bytes) -> bytes:
    return struct.pack(">H", len(b)) + b


def p_open(key: bytes, size=0, sha1=bytes(20), fp=b"", tok=b"", part=None) -> bytes:
    return p_str16(key) + struct.pack(">Q", size) + sha1 + bytes([len(fp)]) + fp + \
        bytes([len(tok)]) + tok + (b"" if part is None else struct.pack(">I", part))


def p_hello(magic=b"UPLD", minv=1, maxv=1, mfs=1114112, features=0, auth=1, cred=b"tok-0123456789",
            name=b"agent-7") -> bytes:
    return magic + struct.pack(">HHIIB", minv, maxv, mfs, features, auth) + p_str16(cred) + \
        p_str16(name)


def p_welcome(version=1, mfs=1114112, features=0, max_streams=64, cw=16777216, sw=4194304,
              mkl=1024, idle=120000, account=b"cam-7") -> bytes:
    return struct.pack(">HIIIIIHI", version, mfs, features, max_streams, cw, sw, mkl, idle) + \
        p_str16(account)


def T(name):
    return wire.TYPE_CODES[name]


# ---------------------------------------------------------------- striping (§6.7)

MIB = 1 << 20
TOKEN = bytes(range(16))


def stripes(add, R, A, hs):
    shs = relay_hs(features=4)
    big = 100 * MIB  # 7 stripes: 6 of 16 MiB, the last of 4 MiB
    add("open-striped-not-negotiated", "OPEN with STRIPED while STRIPES is not in force (§3.3, §4.6, §6.7).",
        R, hs, raw_frame(T("OPEN"), 0x11, 1, p_open(b"a", size=big)), "PROTOCOL_ERROR")
    add("open-part-not-negotiated", "OPEN with PART while STRIPES is not in force (§3.3, §4.6, §6.7).",
        R, hs, raw_frame(T("OPEN"), 0x21, 1, p_open(b"a", size=big, tok=TOKEN, part=1)), "PROTOCOL_ERROR")
    add("open-striped-one-stripe", "OPEN with STRIPED of a 16777216-byte blob, one stripe (§3.3, §6.7).",
        R, shs, raw_frame(T("OPEN"), 0x11, 1, p_open(b"a", size=16 * MIB)), "PROTOCOL_ERROR")
    add("open-striped-without-size-known", "OPEN with STRIPED but without SIZE_KNOWN (§3.3, §6.7).",
        R, shs, raw_frame(T("OPEN"), 0x10, 1, p_open(b"a")), "PROTOCOL_ERROR")
    add("open-striped-and-part", "OPEN with both STRIPED and PART (§3.3, §6.7).",
        R, shs, raw_frame(T("OPEN"), 0x31, 1, p_open(b"a", size=big, tok=TOKEN, part=1)), "PROTOCOL_ERROR")
    add("open-part-zero", "OPEN with PART 0: stripe 0 travels on the main stream (§3.3, §6.7).",
        R, shs, raw_frame(T("OPEN"), 0x21, 1, p_open(b"a", size=big, tok=TOKEN, part=0)), "PROTOCOL_ERROR")
    add("open-part-past-last", "OPEN with PART 7 of a blob of 7 stripes (§3.3, §6.7).",
        R, shs, raw_frame(T("OPEN"), 0x21, 1, p_open(b"a", size=big, tok=TOKEN, part=7)), "PROTOCOL_ERROR")
    add("open-part-without-token", "OPEN with PART and an empty resume token (§3.3, §6.7).",
        R, shs, raw_frame(T("OPEN"), 0x21, 1, p_open(b"a", size=big, part=1)), "PROTOCOL_ERROR")
    add("open-part-with-sha1-known", "OPEN with PART and SHA1_KNOWN (§3.3, §6.7).",
        R, shs, raw_frame(T("OPEN"), 0x23, 1, p_open(b"a", size=big, sha1=bytes.fromhex(EMPTY_SHA1), tok=TOKEN, part=1)),
        "PROTOCOL_ERROR")
    add("open-part-field-missing", "OPEN with PART but no part field: the payload is too short (§1.8, §3.3).",
        R, shs, raw_frame(T("OPEN"), 0x21, 1, p_open(b"a", size=big, tok=TOKEN)), "FRAME_SIZE_ERROR")
    tok = TOKEN.hex()
    main = [rcv(OPEN(1, key="b", size=big, striped=True)), snd(OFFSET(1, "RESUME", 16 * MIB - 2, tok))]
    add("chunk-beyond-first-stripe", "CHUNK on a STRIPED stream crossing the end of stripe 0 (§4.6, §6.7).",
        R, shs + main, CHUNK(1, 16 * MIB - 2, b"abcd"), "SIZE_MISMATCH", scope="stream", stream=1)
    part = [rcv(OPEN(3, key="b", size=big, resume_token=tok, part=6)), snd(OFFSET(3, "RESUME", 4 * MIB - 2))]
    add("chunk-beyond-stripe", "CHUNK on a PART stream crossing the end of its stripe (the last, 4 MiB) (§4.6, §6.7).",
        R, shs + part, CHUNK(3, 4 * MIB - 2, b"abcd"), "SIZE_MISMATCH", scope="stream", stream=3)
    done = [rcv(OPEN(1, key="b", size=big, striped=True)), snd(OFFSET(1, "RESUME", 16 * MIB, tok))]
    add("hash-striped-first-stripe-size", "HASH on a STRIPED stream stating stripe 0's length, not the blob's (§4.6, §6.7).",
        R, shs + done, HASH(1, 16 * MIB, EMPTY_SHA1), "SIZE_MISMATCH", scope="stream", stream=1)
    add("hash-striped-short", "HASH on a STRIPED stream before stripe 0 is all sent (§4.6, §6.7).",
        R, shs + main, HASH(1, big, EMPTY_SHA1), "SIZE_MISMATCH", scope="stream", stream=1)
    ahs = agent_hs(hello_features=4, features=4)
    add("offset-resume-beyond-stripe", "OFFSET RESUME on a PART stream beyond its stripe's length (§4.6, §6.7).",
        A, ahs + [snd(OPEN(1, key="b", size=big, resume_token=tok, part=6))], OFFSET(1, "RESUME", 4 * MIB + 1),
        "PROTOCOL_ERROR")
    add("offset-stored-part-blob-size", "OFFSET STORED on a PART stream saying the blob's size, not the stripe's (§4.6, §6.7).",
        A, ahs + [snd(OPEN(1, key="b", size=big, resume_token=tok, part=1))], OFFSET(1, "STORED", big),
        "PROTOCOL_ERROR")
    add("offset-resume-striped-beyond-first-stripe", "OFFSET RESUME on a STRIPED stream beyond stripe 0 (§4.6, §6.7).",
        A, ahs + [snd(OPEN(1, key="b", size=big, striped=True))], OFFSET(1, "RESUME", 16 * MIB + 1, tok),
        "PROTOCOL_ERROR")


# ---------------------------------------------------------------- refused OPENs (§12.1)

def refusals(add, R):
    """A vector lasts under a second (Appendix A.2): its refusals all fall in one second."""
    busy = relay_hs()
    for sid in range(1, 201, 2):
        busy += [rcv(OPEN(sid)), snd(ERROR(sid, "KEY_BUSY", "another upload of the key is in progress; retry when it ends"))]
    add("open-refused-101st-in-one-second",
        "100 OPENs refused with KEY_BUSY, then a 101st OPEN with an invalid key within the same second: "
        "ENHANCE_YOUR_CALM on the connection instead of its INVALID_KEY (§12.1).",
        R, busy, raw_frame(T("OPEN"), 0, 201, p_open(b"cam-7/../x")), "ENHANCE_YOUR_CALM")
    # 99 refusals of every kind the relay decides, among answers that are not refusals; the 100th is still a stream error.
    codes = ["KEY_BUSY", "QUOTA_EXCEEDED", "STORAGE_ERROR", "ALREADY_EXISTS", "TOO_LARGE", "REFUSED_STREAM",
             "INTERNAL_ERROR", "INVALID_KEY"]
    mixed = relay_hs(features=2)
    sid = 1
    for i in range(99):
        mixed += [rcv(OPEN(sid)), snd(ERROR(sid, codes[i % len(codes)]))]
        sid += 2
        if i % 20 == 0:
            # OFFSET STORED and CONFIRM answer an OPEN; an ERROR after OFFSET START and an OPEN the agent cancels
            # are not refusals either.
            mixed += [rcv(OPEN(sid, size=6, sha1=sha1hex(b"hello\n"))), snd(OFFSET(sid, "STORED", 6))]
            mixed += [rcv(OPEN(sid + 2, size=2 << 20, probe=sha1hex(bytes(262144)))), snd(OFFSET(sid + 2, "CONFIRM"))]
            mixed += [rcv(OPEN(sid + 4)), snd(OFFSET(sid + 4, "START")), snd(ERROR(sid + 4, "STORAGE_ERROR"))]
            mixed += [rcv(OPEN(sid + 6)), rcv(CANCEL(sid + 6))]
            sid += 8
    add("open-refused-100th-is-a-stream-error",
        "99 refused OPENs among OFFSET STORED, OFFSET CONFIRM, an ERROR after OFFSET START and cancelled OPENs, which are "
        "not refusals; the 100th refusal within the second is still its own stream error (§4.6, §12.1).",
        R, mixed, raw_frame(T("OPEN"), 0, sid, p_open(b"cam-7/../x")), "INVALID_KEY", "stream", sid)


# ---------------------------------------------------------------- setups (receiver's view)

def relay_hs(**welcome):
    return [rcv(HELLO(features=welcome.get("features", 0))), snd(WELCOME(**welcome))]


def agent_hs(hello_features=0, hello_mfs=1114112, **welcome):
    return [snd(HELLO(features=hello_features, max_frame_size=hello_mfs)), rcv(WELCOME(**welcome))]


def relay_streams(*sids, sizes=None, **welcome):
    """Relay after handshake with each stream opened and OFFSET START sent (RECEIVING)."""
    s = relay_hs(**welcome)
    for i, sid in enumerate(sids):
        size = sizes[i] if sizes else None
        s += [rcv(OPEN(sid, key=f"cam-7/s{sid}.bin", size=size)), snd(OFFSET(sid, "START"))]
    return s


def agent_streams(*sids, sizes=None, **welcome):
    """Agent after handshake with each stream opened and OFFSET START received (SENDING)."""
    s = agent_hs(**welcome)
    for i, sid in enumerate(sids):
        size = sizes[i] if sizes else None
        s += [snd(OPEN(sid, key=f"cam-7/s{sid}.bin", size=size)), rcv(OFFSET(sid, "START"))]
    return s


SMALL = dict(connection_window=65536, stream_window=65536)
TINY = dict(connection_window=24, stream_window=16)


# ---------------------------------------------------------------- valid vectors

def valid_vectors():
    v = {}

    def add(name, desc, frame):
        v[name] = {"description": desc, "hex": H(frame), "frame": frame}

    add("hello", "HELLO: version 1..1, default max frame size, no features, bearer token (§3.1).",
        HELLO())
    add("hello-deflate", "HELLO offering DEFLATE (features bit 0) and a range of versions (§3.1, §9).",
        HELLO(features=1, min_version=1, max_version=3, max_frame_size=16384))
    add("hello-client-cert", "HELLO with auth method 2 (TLS client certificate) and an empty credential (§3.1).",
        HELLO(auth_method=2, credential="", agent_name=""))
    add("welcome", "WELCOME with 16 MiB connection and 4 MiB stream windows (§3.2; the defaults of §12.1 are 32 MiB and 8 MiB).", WELCOME())
    add("welcome-deflate", "WELCOME putting DEFLATE in force, small windows, no idle timeout (§3.2).",
        WELCOME(features=1, connection_window=65536, stream_window=65536, max_streams=1, idle=0,
                account="caméra-7"))
    add("open-unknown-size", "OPEN without any flag: unknown size, size 0, sha1 all zero (§3.3, §10).",
        OPEN(1, key="cam-7/2024/05/clip.mp4"))
    add("open-size-known", "OPEN with SIZE_KNOWN (§3.3).", OPEN(3, size=1048576))
    add("open-sha1-known", "OPEN with SHA1_KNOWN only (§3.3).",
        OPEN(5, sha1=sha1hex(b"hello\n")))
    add("open-dedup-overwrite", "OPEN with SIZE_KNOWN|SHA1_KNOWN|OVERWRITE (§3.3, §7).",
        OPEN(7, key="k", size=6, sha1=sha1hex(b"hello\n"), overwrite=True))
    add("open-overwrite-only", "OPEN with OVERWRITE only (§3.3).", OPEN(9, overwrite=True))
    add("open-resume", "OPEN with a fingerprint and a resume token (§3.3, §6).",
        OPEN(11, key="logs/app.log", size=10000, fingerprint="00112233445566778899aabbccddeeff",
             resume_token="000102030405060708090a0b0c0d0e0f"))
    add("open-max-stream-id", "OPEN on the largest stream id 2^31-1 (§1.5).",
        OPEN(0x7FFFFFFF, key="a"))
    add("offset-start", "OFFSET START with a resume token (§3.4).",
        OFFSET(1, "START", 0, "000102030405060708090a0b0c0d0e0f"))
    add("offset-start-no-token", "OFFSET START without a resume token (§3.4).", OFFSET(3, "START"))
    add("offset-resume", "OFFSET RESUME at the durable offset 65536 (§3.4, §6).",
        OFFSET(1, "RESUME", 65536, "000102030405060708090a0b0c0d0e0f"))
    add("offset-stored", "OFFSET STORED: already stored, offset = size, empty token (§3.4, §7).",
        OFFSET(7, "STORED", 6))
    add("open-probe", "OPEN with SIZE_KNOWN|PROBE: sha1 is the SHA-1 of the first 262144 bytes (§3.3, §7.1).",
        OPEN(13, key="clips/big.mp4", size=3 * 1048576, probe=sha1hex(bytes(262144))))
    add("offset-confirm", "OFFSET CONFIRM: the relay may hold the bytes; offset 0, empty token (§3.4, §7.1).",
        OFFSET(13, "CONFIRM"))
    add("open-striped", "OPEN with SIZE_KNOWN|STRIPED: a 100 MiB blob of 7 stripes of 16 MiB; this stream carries stripe 0 "
        "(§3.3, §6.7).", OPEN(15, key="clips/long.mp4", size=100 << 20, fingerprint="0a0b", striped=True))
    add("open-part", "OPEN with SIZE_KNOWN|PART: stripe 6, the last (4 MiB) of the 100 MiB blob named by the resume token "
        "(§3.3, §6.7).", OPEN(17, key="clips/long.mp4", size=100 << 20, resume_token="000102030405060708090a0b0c0d0e0f",
                              part=6))
    add("chunk", "CHUNK, plain; crc32 is zlib crc32 of the data (§3.5, §8).",
        CHUNK(1, 0, b"hello\n"))
    add("chunk-at-offset", "CHUNK at a non-zero offset (§3.5).", CHUNK(3, 1048570, b"\x00\xff" * 3))
    raw = b"0123456789abcdef" * 16
    add("chunk-deflated", "CHUNK with DEFLATED: zlib stream of 256 raw bytes; crc32 over the RAW bytes (§3.5, §9).",
        DCHUNK(1, 4096, raw))
    add("ack", "ACK of durable offset 65536 (§3.6).", ACK(1, 65536))
    add("ack-max", "ACK at the largest allowed offset 2^62 (§1.1).", ACK(1, 1 << 62))
    add("credit-stream", "CREDIT for stream 1 (§3.7).", CREDIT(1, 2097152))
    add("credit-connection", "CREDIT on stream 0 (connection window) (§3.7).", CREDIT(0, 8388608))
    add("credit-max", "CREDIT with the largest increment 2^31-1 (§3.7).", CREDIT(0, 0x7FFFFFFF))
    add("hash", "HASH of a 6-byte blob (§3.8).", HASH(1, 6, sha1hex(b"hello\n")))
    add("hash-empty-blob", "HASH of the zero-length blob (§3.8, §10).", HASH(1, 0, EMPTY_SHA1))
    add("result-stored", "RESULT STORED (§3.9).",
        RESULT(1, "STORED", 6, sha1hex(b"hello\n"), "cam-7/clips/a.mp4"))
    add("result-unchanged", "RESULT UNCHANGED (§3.9).",
        RESULT(3, "UNCHANGED", 0, EMPTY_SHA1, "empty"))
    add("error-stream", "ERROR on a stream: CRC_MISMATCH with a message (§3.10, §8).",
        ERROR(1, "CRC_MISMATCH", "crc mismatch at offset 0: expected 0x363a3020, actual 0x00000000"))
    add("error-connection", "ERROR on stream 0: the sender closes the connection (§3.10).",
        ERROR(0, "UNAUTHENTICATED", "unknown token"))
    add("error-unknown-code", "ERROR with an unknown code: decoded as its number (§11).",
        ERROR(5, 0x0100, ""))
    add("cancel", "CANCEL with code CANCELLED (§3.11).", CANCEL(1, "CANCELLED", "source deleted"))
    add("ping", "PING with 8 opaque bytes (§3.12).", PING())
    add("pong", "PONG echoing the PING bytes (§3.13).", PONG())
    add("goaway", "GOAWAY NO_ERROR (graceful shutdown) (§3.14, §6.5).",
        GOAWAY(7, "NO_ERROR", "relay restarting"))
    add("plan", "PLAN of two blobs, the second replacing what its key holds only with OVERWRITE (not set here) (§3.15, §7.2).",
        PLAN(7, [("cam-7/2026/a.jpg", 3145728), ("cam-7/2026/clip.mp4", 1073741824)]))
    add("plan-overwrite", "PLAN with OVERWRITE and no entry: asks only for the quota and its use (§3.15).",
        PLAN(8, [], overwrite=True))
    add("plan-key-not-utf8", "PLAN whose second key is not UTF-8: PLAN does not check it (the relay answers it as a new key), and the vector gives its bytes as key_hex (§3.15, Appendix A.1).",
        PLAN(9, [("a.jpg", 10), (b"bad\xff.jpg", 20)]))
    add("room", "ROOM answering the PLAN of vector plan: 10 GiB quota, 9 GiB used; the photo needs 3 MiB, the clip 1 GiB less the 512 MiB its unfinished upload holds (§3.16, §7.2).",
        ROOM(7, 10737418240, 9663676416, [3145728, 536870912]))
    add("room-no-quota", "ROOM for an account without a quota: quota 0xFFFFFFFFFFFFFFFF (§3.16).",
        ROOM(8, "none", 123456789, []))
    add("extension-0x80", "Extension frame type 0x80: not a known type, >= 0x80, so it is discarded (§1.7).",
        {"type": "EXTENSION", "stream": 0, "flags": 0, "extension_type": 0x80, "data": "cafe"})
    add("extension-0xff-any-header", "Extension frame 0xFF with all flags set on stream 3: flags and stream id value are not checked (§1.7).",
        {"type": "EXTENSION", "stream": 3, "flags": 0xFF, "extension_type": 0xFF, "data": ""})
    return v


# ---------------------------------------------------------------- invalid vectors

def invalid_vectors():
    v = {}

    def add(name, desc, receiver, setup, inp, code, scope="connection", stream=0):
        inp = inp if isinstance(inp, str) else H(inp)
        v[name] = {"description": desc, "receiver": receiver, "setup": setup, "input": inp,
                   "error": {"code": code, "scope": scope, "stream": stream if scope == "stream" else 0}}

    R, A = "relay", "agent"
    hs = relay_hs()
    ahs = agent_hs()

    # ---- §1 framing
    add("length-over-max-header-only",
        "Header announces length 1114113, one more than the relay's max frame size; the 10 header bytes alone must trigger the error (§1.3).",
        R, hs, header(1114113, T("CHUNK"), 0, 1), "FRAME_SIZE_ERROR")
    add("length-over-max-length-bytes-only",
        "Only the 4 length bytes (0x01000001 = 16777217) arrive; they already exceed the max frame size (§1.3).",
        R, hs, struct.pack(">I", 16777217), "FRAME_SIZE_ERROR")
    add("length-over-initial-max-before-welcome",
        "Before the relay has sent WELCOME it accepts at most 65536 bytes; length 65537 is too long (§1.3).",
        R, [], struct.pack(">I", 65537), "FRAME_SIZE_ERROR")
    add("length-over-agent-announced-max",
        "The agent announced max frame size 16384 in HELLO; a 16385-byte frame from the relay is too long (§1.3).",
        A, agent_hs(hello_mfs=16384), header(16385, T("ACK"), 0, 1), "FRAME_SIZE_ERROR")
    add("length-below-header",
        "Length 9 is smaller than the 10-byte header (§1.3).",
        R, hs, struct.pack(">I", 9), "FRAME_SIZE_ERROR")
    add("length-zero", "Length 0 is smaller than the 10-byte header (§1.3).",
        R, hs, struct.pack(">I", 0), "FRAME_SIZE_ERROR")
    add("unknown-type-0x11", "Frame type 0x11 is unknown and below 0x80 (§1.7).",
        R, hs, raw_frame(0x11, 0, 0, b""), "PROTOCOL_ERROR")
    add("unknown-type-0x7f", "Frame type 0x7F is unknown and below 0x80 (§1.7).",
        R, hs, raw_frame(0x7F, 0, 0, b"\x00"), "PROTOCOL_ERROR")
    add("unknown-type-0x00", "Frame type 0x00 is unknown and below 0x80 (§1.7).",
        A, ahs, raw_frame(0x00, 0, 0, b""), "PROTOCOL_ERROR")
    add("reserved-flag-ack", "ACK with flag bit 0x01 set; ACK defines no flags (§1.6, §3.6).",
        A, agent_streams(1, 3) + [snd(CHUNK(1, 0, b"abcd"))],
        raw_frame(T("ACK"), 0x01, 1, struct.pack(">Q", 4)), "PROTOCOL_ERROR")
    add("reserved-flag-chunk", "CHUNK with flag bit 0x02 set; CHUNK defines only DEFLATED 0x01 (§1.6, §3.5).",
        R, relay_streams(1), raw_frame(T("CHUNK"), 0x02, 1, struct.pack(">QI", 0, zlib.crc32(b"ab")) + b"ab"),
        "PROTOCOL_ERROR")
    add("reserved-flag-open", "OPEN with flag bit 0x40 set; OPEN defines only 0x01 to 0x20 (§1.6, §3.3).",
        R, hs, raw_frame(T("OPEN"), 0x40, 1, p_open(b"a")), "PROTOCOL_ERROR")
    stripes(add, R, A, hs)
    probe = bytes.fromhex(EMPTY_SHA1)
    phs = relay_hs(features=2)
    add("open-probe-not-negotiated", "OPEN with PROBE while DEDUP_PROBE is not in force (§3.3, §4.6, §7.1).",
        R, hs, raw_frame(T("OPEN"), 0x09, 1, p_open(b"a", size=2 << 20, sha1=probe)), "PROTOCOL_ERROR")
    add("open-probe-and-sha1-known", "OPEN with both PROBE and SHA1_KNOWN (§3.3, §7.1).",
        R, phs, raw_frame(T("OPEN"), 0x0B, 1, p_open(b"a", size=2 << 20, sha1=probe)), "PROTOCOL_ERROR")
    add("open-probe-small", "OPEN with PROBE and size 262144: a probe needs a blob above 262144 bytes (§3.3, §7.1).",
        R, phs, raw_frame(T("OPEN"), 0x09, 1, p_open(b"a", size=1 << 18, sha1=probe)), "PROTOCOL_ERROR")
    add("open-probe-without-size-known", "OPEN with PROBE but without SIZE_KNOWN (§3.3, §7.1).",
        R, phs, raw_frame(T("OPEN"), 0x08, 1, p_open(b"a", sha1=probe)), "PROTOCOL_ERROR")
    add("offset-confirm-with-offset", "OFFSET CONFIRM with offset 5; CONFIRM carries offset 0 (§3.4).",
        A, agent_hs(hello_features=2, features=2) + [snd(OPEN(1, size=2 << 20, probe=EMPTY_SHA1))],
        raw_frame(T("OFFSET"), 0, 1, struct.pack(">BQ", 3, 5) + b"\x00"), "PROTOCOL_ERROR")
    add("offset-confirm-without-probe", "OFFSET CONFIRM for an OPEN that had no PROBE (§3.4, §4.6).",
        A, agent_hs() + [snd(OPEN(1, size=2 << 20))], OFFSET(1, "CONFIRM"), "PROTOCOL_ERROR")
    # OFFSET CONFIRM finishes the stream, as OFFSET STORED does (§3.4, §4.4, §4.7).
    probe_digest = sha1hex(bytes(262144))
    confirmed = phs + [rcv(OPEN(1, size=2 << 20, probe=probe_digest)), snd(OFFSET(1, "CONFIRM"))]
    add("chunk-after-offset-confirm",
        "CHUNK on stream 1 after the relay answered its PROBE with OFFSET CONFIRM, which finishes the stream (§3.4, §4.4, §4.7).",
        R, confirmed, CHUNK(1, 0, b"ab"), "STREAM_CLOSED")
    add("cancel-crossing-offset-confirm-discarded",
        "CANCEL and ERROR on stream 1 after OFFSET CONFIRM are discarded (they crossed it), but a HASH there is STREAM_CLOSED (§4.4, §4.7).",
        R, confirmed + [rcv(CANCEL(1)), rcv(ERROR(1, "CANCELLED"))], HASH(1, 0, EMPTY_SHA1), "STREAM_CLOSED")
    add("offset-after-offset-confirm", "A second OFFSET on stream 1 after OFFSET CONFIRM closed it normally (§4.5, §4.7).",
        A, agent_hs(hello_features=2, features=2) + [snd(OPEN(1, size=2 << 20, probe=probe_digest)), rcv(OFFSET(1, "CONFIRM"))],
        OFFSET(1, "START"), "STREAM_CLOSED")
    # An undefined disposition is a field-value error (§1.9 step 8), whatever the stream's state (§3.4).
    add("offset-disposition-unknown",
        "OFFSET with disposition 4, which version 1 does not define (0 START to 3 CONFIRM), offset 0 and no token, "
        "in answer to an OPEN with PROBE (§3.4).",
        A, agent_hs(hello_features=2, features=2) + [snd(OPEN(1, size=2 << 20, probe=probe_digest))],
        raw_frame(T("OFFSET"), 0, 1, struct.pack(">BQB", 4, 0, 0)), "PROTOCOL_ERROR")
    add("offset-disposition-unknown-on-cancelled-stream",
        "OFFSET with disposition 255 on stream 1, which the agent cancelled: a valid OFFSET there would be discarded, "
        "but a bad field value is a connection error before any stream state (§1.9, §3.4, §4.7).",
        A, agent_hs() + [snd(OPEN(1)), snd(CANCEL(1))], raw_frame(T("OFFSET"), 0, 1, struct.pack(">BQB", 0xFF, 0, 0)),
        "PROTOCOL_ERROR")
    refusals(add, R)
    add("stream-frame-on-stream-0", "CHUNK on stream 0; stream frames need a non-zero stream id (§1.5).",
        R, relay_streams(1), raw_frame(T("CHUNK"), 0, 0, struct.pack(">QI", 0, zlib.crc32(b"ab")) + b"ab"),
        "PROTOCOL_ERROR")
    add("open-on-stream-0", "OPEN on stream 0; stream frames need a non-zero stream id (§1.5).",
        R, hs, raw_frame(T("OPEN"), 0, 0, p_open(b"a")), "PROTOCOL_ERROR")
    add("connection-frame-on-stream", "PING on stream 1; connection frames must use stream 0 (§1.5).",
        R, relay_streams(1), raw_frame(T("PING"), 0, 1, bytes(8)), "PROTOCOL_ERROR")
    add("stream-id-top-bit", "CHUNK whose stream id has the reserved top bit set (0x80000001) (§1.5).",
        R, relay_streams(1), raw_frame(T("CHUNK"), 0, 0x80000001, struct.pack(">QI", 0, zlib.crc32(b"ab")) + b"ab"),
        "PROTOCOL_ERROR")
    add("stream-id-top-bit-connection-frame", "PING with stream id 0x80000000 (reserved bit set) (§1.5).",
        R, hs, raw_frame(T("PING"), 0, 0x80000000, bytes(8)), "PROTOCOL_ERROR")
    add("payload-trailing-bytes", "ACK payload of 9 bytes: one byte after the u64 offset (§1.8).",
        A, agent_streams(1) + [snd(CHUNK(1, 0, b"abcd"))],
        raw_frame(T("ACK"), 0, 1, struct.pack(">Q", 4) + b"\x00"), "FRAME_SIZE_ERROR")
    add("payload-too-short", "HASH payload of 27 bytes; it needs 28 (§1.8, §3.8).",
        R, relay_streams(1), raw_frame(T("HASH"), 0, 1, struct.pack(">Q", 0) + bytes.fromhex(EMPTY_SHA1)[:19]),
        "FRAME_SIZE_ERROR")
    add("payload-str16-overruns", "ERROR whose message length (10) runs past the end of the payload (§1.8).",
        R, hs, raw_frame(T("ERROR"), 0, 0, struct.pack(">HH", 1, 10) + b"short"), "FRAME_SIZE_ERROR")
    add("ping-short", "PING with 7 opaque bytes instead of 8 (§1.8, §3.12).",
        R, hs, raw_frame(T("PING"), 0, 0, bytes(7)), "FRAME_SIZE_ERROR")
    add("ack-offset-above-2-62", "ACK offset 2^62+1 is above the u64 limit 2^62 (§1.1).",
        A, agent_streams(1) + [snd(CHUNK(1, 0, b"abcd"))], ACK(1, (1 << 62) + 1), "PROTOCOL_ERROR")
    add("error-message-invalid-utf8", "ERROR on stream 0 whose message is not valid UTF-8 (§1.1, §3.10).",
        R, hs, raw_frame(T("ERROR"), 0, 0, struct.pack(">H", 1) + p_str16(b"bad \xc3\x28")), "PROTOCOL_ERROR")
    add("error-stream-message-invalid-utf8",
        "ERROR on stream 1 with invalid UTF-8 in its message: still a connection error, not a stream error (§1.1, §3.10).",
        R, relay_streams(1, 3), raw_frame(T("ERROR"), 0, 1, struct.pack(">H", 0x12) + p_str16(b"\xff")), "PROTOCOL_ERROR")
    add("error-message-too-long", "CANCEL whose message is 1025 bytes, above the 1024 limit (§3.11, §12).",
        R, relay_streams(1), raw_frame(T("CANCEL"), 0, 1, struct.pack(">H", 0x12) + p_str16(b"m" * 1025)),
        "PROTOCOL_ERROR")

    # ---- §2 connection start
    add("hello-wrong-magic", "HELLO whose magic is \"UPLX\" instead of \"UPLD\" (§3.1).",
        R, [], raw_frame(T("HELLO"), 0, 0, p_hello(magic=b"UPLX")), "PROTOCOL_ERROR")
    add("hello-min-above-max", "HELLO with minVersion 2 > maxVersion 1 (§3.1).",
        R, [], raw_frame(T("HELLO"), 0, 0, p_hello(minv=2, maxv=1)), "PROTOCOL_ERROR")
    add("hello-max-frame-size-too-small", "HELLO maxFrameSize 16383 is below 16384 (§1.3, §3.1).",
        R, [], raw_frame(T("HELLO"), 0, 0, p_hello(mfs=16383)), "PROTOCOL_ERROR")
    add("hello-max-frame-size-too-large", "HELLO maxFrameSize 16777217 is above 16777216 (§1.3, §3.1).",
        R, [], raw_frame(T("HELLO"), 0, 0, p_hello(mfs=16777217)), "PROTOCOL_ERROR")
    add("hello-credential-too-long", "HELLO credential of 1025 bytes, above the 1024 limit (§3.1, §12).",
        R, [], raw_frame(T("HELLO"), 0, 0, p_hello(cred=b"t" * 1025)), "PROTOCOL_ERROR")
    add("hello-agent-name-too-long", "HELLO agentName of 256 bytes, above the 255 limit (§3.1, §12).",
        R, [], raw_frame(T("HELLO"), 0, 0, p_hello(name=b"n" * 256)), "PROTOCOL_ERROR")
    add("hello-agent-name-control", "HELLO agentName holding a newline, which would forge a line of a text log (§1.1, §3.1).",
        R, [], raw_frame(T("HELLO"), 0, 0, p_hello(name="agent\n... notice token rotated".encode())), "PROTOCOL_ERROR")
    add("hello-agent-name-bidi", "HELLO agentName holding U+202E RIGHT-TO-LEFT OVERRIDE (§1.1, §3.1).",
        R, [], raw_frame(T("HELLO"), 0, 0, p_hello(name="cam\u202egpj.exe".encode())), "PROTOCOL_ERROR")
    add("hello-agent-name-c1", "HELLO agentName holding U+009B, the C1 control sequence introducer (§1.1, §3.1).",
        R, [], raw_frame(T("HELLO"), 0, 0, p_hello(name="cam\u009b2J".encode())), "PROTOCOL_ERROR")
    add("hello-unsupported-version", "HELLO offering versions 2..3 only; the relay speaks version 1 (§2.2).",
        R, [], HELLO(min_version=2, max_version=3), "UNSUPPORTED_VERSION")
    add("hello-unknown-auth-method", "HELLO with auth method 9, which is not defined (§2.2, §3.1).",
        R, [], HELLO(auth_method=9), "UNAUTHENTICATED")
    add("hello-empty-token", "HELLO with auth method 1 (bearer token) and an empty token (§3.1).",
        R, [], HELLO(credential=""), "UNAUTHENTICATED")
    add("extension-reserved-stream-bit", "Extension frame 0x80 whose stream id has the reserved top bit set: the R bit is checked for every frame (§1.5, §1.7).",
        R, hs, raw_frame(0x80, 0, 0x80000001, b"x"), "PROTOCOL_ERROR")
    add("frame-before-hello", "The relay's first frame is a PING instead of HELLO (§2.1).",
        R, [], PING(), "PROTOCOL_ERROR")
    add("extension-before-hello", "The relay's first frame is an extension frame (0x80) instead of HELLO (§1.7, §2.1).",
        R, [], raw_frame(0x80, 0, 0, b""), "PROTOCOL_ERROR")
    add("frame-while-authenticating", "The agent sends OPEN after HELLO before WELCOME arrived (§2.1, §4.1).",
        R, [rcv(HELLO())], OPEN(1), "PROTOCOL_ERROR")
    add("second-hello", "A second HELLO after the handshake (§2.1).",
        R, hs, HELLO(), "PROTOCOL_ERROR")
    add("agent-frame-before-welcome", "The agent receives PING before WELCOME (§2.1, §4.2).",
        A, [snd(HELLO())], PING(), "PROTOCOL_ERROR")
    add("second-welcome", "A second WELCOME (§2.1).", A, ahs, WELCOME(), "PROTOCOL_ERROR")
    add("welcome-version-not-offered", "WELCOME selects version 2 although the agent offered 1..1 (§3.2).",
        A, [snd(HELLO())], WELCOME(version=2), "PROTOCOL_ERROR")
    add("welcome-feature-not-offered", "WELCOME puts DEFLATE in force although the agent did not offer it (§3.2, §9).",
        A, [snd(HELLO(features=0))], WELCOME(features=1), "PROTOCOL_ERROR")
    add("welcome-max-streams-zero", "WELCOME with maxStreams 0 (§3.2).",
        A, [snd(HELLO())], raw_frame(T("WELCOME"), 0, 0, p_welcome(max_streams=0)), "PROTOCOL_ERROR")
    add("welcome-window-zero", "WELCOME with streamWindow 0; windows are 1..2^31-1 (§3.2).",
        A, [snd(HELLO())], raw_frame(T("WELCOME"), 0, 0, p_welcome(sw=0)), "PROTOCOL_ERROR")
    add("welcome-account-too-long", "WELCOME whose account is 256 bytes, above the 255 limit (§3.2, §12.1).",
        A, [snd(HELLO())], raw_frame(T("WELCOME"), 0, 0, p_welcome(account=b"a" * 256)), "PROTOCOL_ERROR")
    add("welcome-account-control", "WELCOME whose account holds ESC [2J, which would clear the agent's terminal (§1.1, §3.2).",
        A, [snd(HELLO())], raw_frame(T("WELCOME"), 0, 0, p_welcome(account="cam\u001b[2J".encode())), "PROTOCOL_ERROR")
    add("welcome-max-frame-size-out-of-range", "WELCOME maxFrameSize 16777217 is above 16777216 (§1.3, §3.2).",
        A, [snd(HELLO())], raw_frame(T("WELCOME"), 0, 0, p_welcome(mfs=16777217)), "PROTOCOL_ERROR")

    # ---- §1.4 direction
    add("offset-received-by-relay", "The relay receives OFFSET, a relay->agent frame (§1.4).",
        R, relay_streams(1), OFFSET(1, "START"), "PROTOCOL_ERROR")
    add("credit-received-by-relay", "The relay receives CREDIT, a relay->agent frame (§1.4).",
        R, hs, CREDIT(0, 1000), "PROTOCOL_ERROR")
    add("chunk-received-by-agent", "The agent receives CHUNK, an agent->relay frame (§1.4).",
        A, agent_streams(1), CHUNK(1, 0, b"ab"), "PROTOCOL_ERROR")

    # ---- OPEN (§3.3, §4.4, §12)
    two = relay_streams(1)  # stream 1 stays untouched by stream errors on stream 3
    add("open-stream-id-not-increasing", "OPEN on stream 1 after stream 3 was opened: ids must increase (§4.3).",
        R, relay_hs() + [rcv(OPEN(3)), snd(OFFSET(3, "START"))], OPEN(1), "PROTOCOL_ERROR")
    add("open-stream-id-reused", "A second OPEN on stream 1 while it is open (§4.3).",
        R, relay_streams(1), OPEN(1), "PROTOCOL_ERROR")
    add("open-size-above-2-62", "OPEN with SIZE_KNOWN and size 2^62+1, above the u64 limit (§1.1, §3.3).",
        R, two, raw_frame(T("OPEN"), 0x01, 3, p_open(b"a/b", size=(1 << 62) + 1)), "PROTOCOL_ERROR")
    add("open-size-without-size-known", "OPEN with size 100 but without SIZE_KNOWN (§3.3).",
        R, two, raw_frame(T("OPEN"), 0, 3, p_open(b"a/b", size=100)), "PROTOCOL_ERROR")
    add("open-sha1-without-sha1-known", "OPEN with a non-zero sha1 but without SHA1_KNOWN (§3.3).",
        R, two, raw_frame(T("OPEN"), 0, 3, p_open(b"a/b", sha1=bytes.fromhex(EMPTY_SHA1))), "PROTOCOL_ERROR")
    add("open-fingerprint-too-long", "OPEN with a 65-byte fingerprint, above the 64 limit (§3.3, §12).",
        R, two, raw_frame(T("OPEN"), 0, 3, p_open(b"a/b", fp=b"f" * 65)), "PROTOCOL_ERROR")
    add("open-invalid-key-and-bad-id", "OPEN whose key is not UTF-8 on a non-increasing id: the connection check wins (§4.6).",
        R, two, raw_frame(T("OPEN"), 0, 1, p_open(b"\xff")), "PROTOCOL_ERROR")
    keys = [
        ("key-dotdot", b"cam-7/../etc/passwd", "has a \"..\" segment"),
        ("key-dot", b"cam-7/./a", "has a \".\" segment"),
        ("key-nul", b"cam-7/a\x00b", "contains byte 0x00"),
        ("key-control", b"cam-7/a\x1fb", "contains control byte 0x1F"),
        ("key-del", b"cam-7/a\x7fb", "contains byte 0x7F"),
        ("key-backslash", b"cam-7\\a", "contains a backslash"),
        ("key-leading-slash", b"/cam-7/a", "starts with \"/\" (empty first segment)"),
        ("key-trailing-slash", b"cam-7/a/", "ends with \"/\" (empty last segment)"),
        ("key-empty-segment", b"cam-7//a", "has an empty segment \"//\""),
        ("key-empty", b"", "is empty"),
        ("key-too-long", (b"a" * 200 + b"/") * 5 + b"a" * 20, "is 1025 bytes, above maxKeyLength 1024"),
        ("key-segment-too-long", b"cam-7/" + b"s" * 256, "has a 256-byte segment, above 255"),
        ("key-invalid-utf8", b"cam-7/\xff\xfe", "is not valid UTF-8"),
        ("key-overlong-utf8", b"cam-7\xc0\xafetc", "is not valid UTF-8 (overlong encoding of \"/\")"),
        ("key-surrogate-utf8", b"cam-7/\xed\xa0\x80", "is not valid UTF-8 (encoded surrogate U+D800)"),
    ]
    for name, key, why in keys:
        add(name, f"OPEN on stream 3 whose key {why}: stream error, stream 1 is untouched (§12.2).",
            R, two, raw_frame(T("OPEN"), 0, 3, p_open(key)), "INVALID_KEY", "stream", 3)
    add("open-refused-max-streams", "OPEN of a second stream when maxStreams is 1 (§4.3).",
        R, relay_streams(1, max_streams=1), OPEN(3), "REFUSED_STREAM", "stream", 3)
    add("open-refused-after-goaway", "OPEN of stream 3 after the relay sent GOAWAY with lastStreamID 1 (§4.3, §6.5).",
        R, relay_streams(1) + [snd(GOAWAY(1))], OPEN(3), "REFUSED_STREAM", "stream", 3)

    # ---- relay stream states (§4.4)
    add("chunk-on-never-opened-stream", "CHUNK on stream 5, higher than any opened stream (§4.7).",
        R, relay_streams(1), CHUNK(5, 0, b"ab"), "PROTOCOL_ERROR")
    add("chunk-before-offset", "CHUNK on stream 1 in OPENING: the relay has not sent OFFSET yet (§4.4).",
        R, relay_hs() + [rcv(OPEN(1))], CHUNK(1, 0, b"ab"), "PROTOCOL_ERROR")
    add("chunk-after-hash", "CHUNK after HASH, stream 1 is VERIFYING (§4.4).",
        R, relay_streams(1) + [rcv(CHUNK(1, 0, b"ab")), rcv(HASH(1, 2, sha1hex(b"ab")))],
        CHUNK(1, 2, b"cd"), "PROTOCOL_ERROR")
    add("hash-before-offset", "HASH on stream 1 in OPENING (§4.4).",
        R, relay_hs() + [rcv(OPEN(1))], HASH(1, 0, EMPTY_SHA1), "PROTOCOL_ERROR")
    add("chunk-after-offset-stored", "CHUNK on stream 1 which was closed normally by OFFSET STORED (§4.7).",
        R, relay_hs() + [rcv(OPEN(1, size=6, sha1=sha1hex(b"hello\n"))), snd(OFFSET(1, "STORED", 6))],
        CHUNK(1, 0, b"hello\n"), "STREAM_CLOSED")
    add("chunk-after-cancel", "CHUNK on stream 1 after the agent cancelled it (closed normally) (§4.7).",
        R, relay_streams(1, 3) + [rcv(CANCEL(1))], CHUNK(1, 0, b"ab"), "STREAM_CLOSED")
    add("hash-after-result", "HASH on stream 1 after the relay sent RESULT (closed normally) (§4.7).",
        R, relay_streams(1) + [rcv(HASH(1, 0, EMPTY_SHA1)), snd(RESULT(1, "STORED", 0, EMPTY_SHA1, "cam-7/s1.bin"))],
        HASH(1, 0, EMPTY_SHA1), "STREAM_CLOSED")
    add("cancel-crossing-result-discarded",
        "CANCEL and ERROR on stream 1 after the relay sent RESULT are discarded (they crossed it), but a CHUNK there is STREAM_CLOSED (§4.7).",
        R, relay_streams(1, 3) + [rcv(HASH(1, 0, EMPTY_SHA1)), snd(RESULT(1, "STORED", 0, EMPTY_SHA1, "cam-7/s1.bin")),
                                  rcv(CANCEL(1)), rcv(ERROR(1, "CANCELLED"))],
        CHUNK(1, 0, b"ab"), "STREAM_CLOSED")
    add("cancel-after-cancel", "A second CANCEL on stream 1: the relay closed it on receiving the first, so nothing can have crossed (§4.7).",
        R, relay_streams(1, 3) + [rcv(CANCEL(1))], CANCEL(1), "STREAM_CLOSED")
    add("open-after-agent-goaway", "OPEN after the agent itself sent GOAWAY (§4.3).",
        R, relay_streams(1) + [rcv(GOAWAY(1))], OPEN(3), "PROTOCOL_ERROR")
    add("chunk-over-connection-window-on-closed-stream",
        "25-byte CHUNK on stream 1 (closed normally by CANCEL) with a 24-byte connection window: the connection window is checked before the stream state (§4.6).",
        R, relay_streams(1, 3, **TINY) + [rcv(CANCEL(1))], CHUNK(1, 0, b"c" * 25), "FLOW_CONTROL_ERROR")
    add("chunk-wrong-offset-and-over-stream-window",
        "17-byte CHUNK at offset 5 on a fresh stream with a 16-byte window: the offset is checked before the stream window (§4.6).",
        R, relay_streams(1, 3, **TINY), CHUNK(1, 5, b"w" * 17), "INVALID_OFFSET", "stream", 1)
    add("chunk-wrong-offset", "CHUNK at offset 3 when 2 bytes were received: stream error, stream 3 untouched (§4.6).",
        R, relay_streams(1, 3) + [rcv(CHUNK(1, 0, b"ab"))], CHUNK(1, 3, b"cd"), "INVALID_OFFSET", "stream", 1)
    add("chunk-exceeds-stream-credit", "17-byte CHUNK on a stream with a 16-byte window (§5.2).",
        R, relay_streams(1, 3, **TINY), CHUNK(1, 0, b"x" * 17), "FLOW_CONTROL_ERROR", "stream", 1)
    add("chunk-exceeds-stream-credit-after-use", "Stream window 16: 10 bytes then 7 bytes exceed it (§5.2).",
        R, relay_streams(1, 3, **TINY) + [rcv(CHUNK(1, 0, b"y" * 10))], CHUNK(1, 10, b"z" * 7),
        "FLOW_CONTROL_ERROR", "stream", 1)
    add("chunk-exceeds-connection-credit",
        "Connection window 24: 16 bytes on stream 1 then 9 on stream 3 exceed it; connection check first (§5.2).",
        R, relay_streams(1, 3, **TINY) + [rcv(CHUNK(1, 0, b"a" * 16))], CHUNK(3, 0, b"b" * 9),
        "FLOW_CONTROL_ERROR")
    add("chunk-discarded-counts-against-connection",
        "A CHUNK on a stream reset by the relay is discarded but still checked against the connection window: 30 bytes overrun the 24-byte window (§4.7, §5.2).",
        R, relay_streams(1, 3, **TINY) + [snd(ERROR(1, "STORAGE_ERROR", "disk full")),
                                          rcv(CHUNK(1, 0, b"d" * 10))],
        CHUNK(1, 10, b"e" * 30), "FLOW_CONTROL_ERROR")
    add("chunk-exceeds-size", "CHUNK of 5 bytes on a stream opened with SIZE_KNOWN size 4 (§4.6).",
        R, relay_streams(1, 3, sizes=[4, None]), CHUNK(1, 0, b"12345"), "SIZE_MISMATCH", "stream", 1)
    add("chunk-crc-mismatch", "CHUNK whose crc32 field does not match its data (§8).",
        R, relay_streams(1, 3), CHUNK(1, 0, b"hello\n", crc=0x12345678), "CRC_MISMATCH", "stream", 1)
    add("chunk-empty-data", "CHUNK with no data bytes (§3.5).",
        R, relay_streams(1), raw_frame(T("CHUNK"), 0, 1, struct.pack(">QI", 0, 0)), "PROTOCOL_ERROR")
    add("chunk-offset-plus-length-above-2-62", "CHUNK at offset 2^62-1 with 2 bytes ends above 2^62 (§1.1, §3.5).",
        R, relay_streams(1), CHUNK(1, (1 << 62) - 1, b"ab"), "PROTOCOL_ERROR")
    comp = deflate(b"A" * 64)
    add("chunk-deflated-not-negotiated", "DEFLATED CHUNK although DEFLATE is not in force (§9).",
        R, relay_streams(1), DCHUNK(1, 0, b"A" * 64), "PROTOCOL_ERROR")
    add("chunk-deflated-wrong-raw-length", "DEFLATED CHUNK whose data inflates to 64 bytes but rawLength says 65 (§9).",
        R, relay_streams(1, 3, features=1), DCHUNK(1, 0, b"A" * 64, raw_length=65, crc=zlib.crc32(b"A" * 65)),
        "DECOMPRESSION_ERROR", "stream", 1)
    add("chunk-deflated-garbage", "DEFLATED CHUNK whose data is not a zlib stream (§9).",
        R, relay_streams(1, 3, features=1), DCHUNK(1, 0, b"A" * 64, compressed=b"not zlib at all"),
        "DECOMPRESSION_ERROR", "stream", 1)
    add("chunk-deflated-trailing-garbage", "DEFLATED CHUNK with bytes after the end of the zlib stream (§9).",
        R, relay_streams(1, 3, features=1), DCHUNK(1, 0, b"A" * 64, compressed=comp + b"\x00"),
        "DECOMPRESSION_ERROR", "stream", 1)
    add("chunk-deflated-raw-length-zero", "DEFLATED CHUNK with rawLength 0 (§3.5).",
        R, relay_streams(1, features=1), DCHUNK(1, 0, b"A" * 64, raw_length=0), "PROTOCOL_ERROR")
    add("chunk-deflated-raw-length-over-max", "DEFLATED CHUNK with rawLength 1114113, above the relay's max frame size (§3.5).",
        R, relay_streams(1, features=1), DCHUNK(1, 0, b"A" * 64, raw_length=1114113), "PROTOCOL_ERROR")
    add("hash-size-mismatch", "HASH size 3 but 2 bytes were received (§4.6).",
        R, relay_streams(1, 3) + [rcv(CHUNK(1, 0, b"ab"))], HASH(1, 3, sha1hex(b"abc")), "SIZE_MISMATCH", "stream", 1)
    add("hash-short-of-open-size", "HASH size 2 = bytes received, but OPEN said size 4 (§4.6).",
        R, relay_streams(1, 3, sizes=[4, None]) + [rcv(CHUNK(1, 0, b"ab"))], HASH(1, 2, sha1hex(b"ab")),
        "SIZE_MISMATCH", "stream", 1)
    add("hash-sha1-mismatch", "HASH sha1 differs from the SHA-1 of the received bytes (§8).",
        R, relay_streams(1, 3) + [rcv(CHUNK(1, 0, b"ab"))], HASH(1, 2, sha1hex(b"ba")), "HASH_MISMATCH", "stream", 1)
    add("hash-vs-open-sha1", "HASH sha1 matches the data but not the sha1 given in OPEN (SHA1_KNOWN) (§4.6).",
        R, relay_hs() + [rcv(OPEN(1, sha1=sha1hex(b"xy"))), snd(OFFSET(1, "START")), rcv(CHUNK(1, 0, b"ab"))],
        HASH(1, 2, sha1hex(b"ab")), "HASH_MISMATCH", "stream", 1)
    add("chunk-in-flight-after-reset-then-bad-id",
        "CHUNK and CANCEL on a stream reset by the relay are discarded; a CHUNK on never-opened stream 9 is then an error (§4.7).",
        R, relay_streams(1, 3) + [snd(ERROR(1, "QUOTA_EXCEEDED")), rcv(CHUNK(1, 0, b"ab")), rcv(CANCEL(1))],
        CHUNK(9, 0, b"ab"), "PROTOCOL_ERROR")

    # ---- agent stream states (§4.5)
    asent = agent_streams(1, 3, **SMALL) + [snd(CHUNK(1, 0, b"abcd"))]
    add("credit-stream-overflow",
        "CREDIT that would raise stream 1's window (65532 left) above 2^31-1: stream error, stream 3 untouched (§5.3).",
        A, asent, CREDIT(1, 0x7FFFFFFF - 65532 + 1), "FLOW_CONTROL_ERROR", "stream", 1)
    add("credit-connection-overflow", "CREDIT on stream 0 that would raise the connection window above 2^31-1 (§5.3).",
        A, asent, CREDIT(0, 0x7FFFFFFF - 65532 + 1), "FLOW_CONTROL_ERROR")
    add("credit-increment-zero", "CREDIT with increment 0 (§3.7).",
        A, asent, CREDIT(1, 0), "PROTOCOL_ERROR")
    add("credit-increment-2-31", "CREDIT with increment 2^31 (§3.7).",
        A, asent, CREDIT(0, 1 << 31), "PROTOCOL_ERROR")
    add("credit-in-opening", "CREDIT for stream 1 before OFFSET was received (OPENING) (§4.5).",
        A, ahs + [snd(OPEN(1))], CREDIT(1, 1000), "PROTOCOL_ERROR")
    add("ack-in-opening", "ACK for stream 1 before OFFSET was received (OPENING) (§4.5).",
        A, ahs + [snd(OPEN(1))], ACK(1, 1), "PROTOCOL_ERROR")
    add("ack-beyond-sent", "ACK offset 5 when the agent sent only 4 bytes (§4.5).",
        A, asent, ACK(1, 5), "PROTOCOL_ERROR")
    add("ack-not-increasing", "A second ACK with the same offset 4 (ACK offsets strictly increase) (§4.5, §6.1).",
        A, asent + [rcv(ACK(1, 4))], ACK(1, 4), "PROTOCOL_ERROR")
    add("ack-decreasing", "ACK offset 2 after ACK 4 (§4.5).",
        A, asent + [rcv(ACK(1, 4))], ACK(1, 2), "PROTOCOL_ERROR")
    add("ack-zero-after-start", "ACK offset 0 after OFFSET START: not above the starting durable offset (§4.5).",
        A, asent, ACK(1, 0), "PROTOCOL_ERROR")
    add("ack-not-above-resume-offset", "ACK offset 100 after OFFSET RESUME at 100 (§4.5, §6.1).",
        A, ahs + [snd(OPEN(1)), rcv(OFFSET(1, "RESUME", 100, "0a0b")), snd(CHUNK(1, 100, b"abcd"))],
        ACK(1, 100), "PROTOCOL_ERROR")
    add("ack-on-never-opened-stream", "ACK on stream 5, which the agent never opened (§4.7).",
        A, asent, ACK(5, 1), "PROTOCOL_ERROR")
    add("result-before-hash", "RESULT on stream 1 while the agent is still SENDING (no HASH sent) (§4.5).",
        A, asent, RESULT(1, "STORED", 4, sha1hex(b"abcd"), "cam-7/s1.bin"), "PROTOCOL_ERROR")
    add("result-mismatches-hash", "RESULT whose sha1 differs from the agent's HASH (§3.9).",
        A, asent + [snd(HASH(1, 4, sha1hex(b"abcd")))], RESULT(1, "STORED", 4, sha1hex(b"abce"), "cam-7/s1.bin"),
        "PROTOCOL_ERROR")
    add("result-key-mismatch", "RESULT whose key differs from the OPEN's key (§3.9).",
        A, asent + [snd(HASH(1, 4, sha1hex(b"abcd")))], RESULT(1, "STORED", 4, sha1hex(b"abcd"), "cam-7/other.bin"),
        "PROTOCOL_ERROR")
    add("error-after-result", "ERROR on stream 1 after RESULT closed it normally: the relay cannot have had it in flight (§4.7).",
        A, asent + [snd(HASH(1, 4, sha1hex(b"abcd"))), rcv(RESULT(1, "STORED", 4, sha1hex(b"abcd"), "cam-7/s1.bin"))],
        ERROR(1, "INTERNAL_ERROR"), "STREAM_CLOSED")
    add("result-status-unknown", "RESULT with status 2 (§3.9).",
        A, asent + [snd(HASH(1, 4, sha1hex(b"abcd")))],
        raw_frame(T("RESULT"), 0, 1, struct.pack(">BQ", 2, 4) + bytes.fromhex(sha1hex(b"abcd")) + p_str16(b"cam-7/s1.bin")),
        "PROTOCOL_ERROR")
    add("offset-after-result", "OFFSET on stream 1 after RESULT closed it normally (§4.7).",
        A, asent + [snd(HASH(1, 4, sha1hex(b"abcd"))), rcv(RESULT(1, "STORED", 4, sha1hex(b"abcd"), "cam-7/s1.bin"))],
        OFFSET(1, "START"), "STREAM_CLOSED")
    add("second-offset", "A second OFFSET on stream 1 while SENDING (§4.5).",
        A, agent_streams(1), OFFSET(1, "START"), "PROTOCOL_ERROR")
    add("offset-start-nonzero", "OFFSET START with offset 7; START requires 0 (§3.4).",
        A, ahs + [snd(OPEN(1))], raw_frame(T("OFFSET"), 0, 1, struct.pack(">BQB", 0, 7, 0)), "PROTOCOL_ERROR")
    add("offset-resume-zero", "OFFSET RESUME with offset 0; RESUME requires > 0 (§3.4).",
        A, ahs + [snd(OPEN(1))], raw_frame(T("OFFSET"), 0, 1, struct.pack(">BQB", 1, 0, 0)), "PROTOCOL_ERROR")
    add("offset-stored-with-token", "OFFSET STORED carrying a resume token; it must be empty (§3.4).",
        A, ahs + [snd(OPEN(1))], raw_frame(T("OFFSET"), 0, 1, struct.pack(">BQB", 2, 0, 2) + b"tk"), "PROTOCOL_ERROR")
    add("offset-resume-beyond-size", "OFFSET RESUME at 11 for a stream opened with SIZE_KNOWN size 10 (§4.5).",
        A, ahs + [snd(OPEN(1, size=10))], OFFSET(1, "RESUME", 11), "PROTOCOL_ERROR")
    add("offset-stored-wrong-size", "OFFSET STORED with offset 9 for a stream opened with SIZE_KNOWN size 10 (§4.5).",
        A, ahs + [snd(OPEN(1, size=10))], OFFSET(1, "STORED", 9), "PROTOCOL_ERROR")
    add("frames-after-cancel-discarded-then-result-early",
        "ACK and CREDIT on a stream the agent cancelled are discarded; then RESULT on SENDING stream 3 is an error (§4.5, §4.7).",
        A, agent_streams(1, 3, **SMALL) + [snd(CHUNK(1, 0, b"abcd")), snd(CANCEL(1)), rcv(ACK(1, 4)),
                                           rcv(CREDIT(1, 4)), rcv(ERROR(1, "CANCELLED"))],
        RESULT(3, "STORED", 0, EMPTY_SHA1, "cam-7/s3.bin"), "PROTOCOL_ERROR")
    add("goaway-last-stream-id-top-bit", "GOAWAY whose lastStreamID has the reserved top bit set (§3.14).",
        A, ahs, raw_frame(T("GOAWAY"), 0, 0, struct.pack(">IH", 0x80000001, 0) + p_str16(b"")), "PROTOCOL_ERROR")
    add("goaway-last-stream-id-increased", "A second GOAWAY with a larger lastStreamID than the first (§3.14).",
        A, agent_streams(1) + [rcv(GOAWAY(1))], GOAWAY(3), "PROTOCOL_ERROR")

    # ---- §3.15, §3.16, §7.2 quota plan
    qhs = relay_hs(features=wire.FEATURE_QUOTA_PLAN)
    aqhs = agent_hs(hello_features=wire.FEATURE_QUOTA_PLAN, features=wire.FEATURE_QUOTA_PLAN)
    one = [("cam-7/a.jpg", 1000)]
    add("plan-not-in-force", "PLAN on a connection whose WELCOME did not put QUOTA_PLAN in force (§3.15).",
        R, hs, PLAN(1, one), "PROTOCOL_ERROR")
    add("plan-while-unanswered", "A second PLAN before the relay answered the first: one PLAN at a time (§3.15).",
        R, qhs + [rcv(PLAN(1, one))], PLAN(2, one), "PROTOCOL_ERROR")
    add("plan-too-many-entries", "PLAN of 1001 entries, one more than §12.1 allows (§3.15).",
        R, qhs, raw_frame(T("PLAN"), 0, 0, p_plan(1, [(b"k", 1)] * 1001)), "PROTOCOL_ERROR")
    add("plan-count-beyond-payload", "PLAN whose count says 2 entries with only one in the payload (§1.8, §3.15).",
        R, qhs, raw_frame(T("PLAN"), 0, 0, struct.pack(">IH", 1, 2) + p_str16(b"k") + struct.pack(">Q", 1)),
        "FRAME_SIZE_ERROR")
    add("plan-size-above-2-62", "PLAN entry size 2^62+1 (§1.1, §3.15).",
        R, qhs, raw_frame(T("PLAN"), 0, 0, p_plan(1, [(b"k", (1 << 62) + 1)])), "PROTOCOL_ERROR")
    add("plan-on-stream", "PLAN on stream 1: a connection frame (§1.5).",
        R, qhs, raw_frame(T("PLAN"), 0, 1, p_plan(1, [])), "PROTOCOL_ERROR")
    add("plan-flag-not-overwrite", "PLAN with flag 0x01, which PLAN does not define (§1.6, §3.15).",
        R, qhs, raw_frame(T("PLAN"), 0x01, 0, p_plan(1, [])), "PROTOCOL_ERROR")
    add("plan-received-by-agent", "An agent receives PLAN, which only an agent sends (§1.4).",
        A, aqhs, PLAN(1, one), "PROTOCOL_ERROR")
    add("room-unasked", "ROOM with no PLAN unanswered (§3.16).",
        A, aqhs, ROOM(1, 1000, 0, [1000]), "PROTOCOL_ERROR")
    add("room-wrong-request", "ROOM whose request is not the unanswered PLAN's (§3.16).",
        A, aqhs + [snd(PLAN(5, one))], ROOM(6, 1000, 0, [1000]), "PROTOCOL_ERROR")
    add("room-wrong-count", "ROOM with two needs for a PLAN of one entry (§3.16).",
        A, aqhs + [snd(PLAN(5, one))], ROOM(5, 1000, 0, [1000, 0]), "PROTOCOL_ERROR")
    add("room-used-above-2-62", "ROOM whose used is 2^62+1 (§3.16).",
        A, aqhs + [snd(PLAN(5, []))], raw_frame(T("ROOM"), 0, 0, struct.pack(">IQQH", 5, 1 << 40, (1 << 62) + 1, 0)),
        "PROTOCOL_ERROR")
    add("room-received-by-relay", "A relay receives ROOM, which only a relay sends (§1.4).",
        R, qhs, ROOM(1, 1000, 0, []), "PROTOCOL_ERROR")
    return v


# ---------------------------------------------------------------- self-checks


def check_valid(name, vec, errors):
    data = bytes.fromhex(vec["hex"])
    if vec["hex"] != vec["hex"].lower():
        errors.append(f"valid/{name}: hex not lowercase")
    try:
        frame, n = wire.decode(data, wire.DEFAULT_MAX_FRAME_SIZE)
    except wire.WireError as e:
        errors.append(f"valid/{name}: decode raised {e}")
        return
    if frame != vec["frame"] or n != len(data):
        errors.append(f"valid/{name}: decoded {frame} ({n} bytes) != {vec['frame']}")
    if wire.encode(vec["frame"]) != data:
        errors.append(f"valid/{name}: encode(frame) != hex")
    # every proper prefix is "need more bytes", never an error (§1.9)
    for cut in sorted({0, 1, 3, 4, 9, 10, len(data) - 1}):
        if 0 <= cut < len(data):
            if wire.decode(data[:cut])[0] is not None:
                errors.append(f"valid/{name}: prefix {cut} decoded")


def check_invalid(name, vec, errors):
    try:
        e = wire.run_invalid_vector(vec)
    except (AssertionError, wire.WireError) as x:
        errors.append(f"invalid/{name}: setup failed: {x!r}")
        return
    if e is None:
        errors.append(f"invalid/{name}: input produced no error")
    elif e.as_json() != vec["error"]:
        errors.append(f"invalid/{name}: got {e.as_json()} ({e.why}), want {vec['error']}")
    if not re.search(r"§\d", vec["description"]):
        errors.append(f"invalid/{name}: description cites no section")


def check_spec_example(errors):
    """Appendix B of SPEC.md: every frame decodes and the exchange is legal for both roles."""
    if not os.path.exists(SPEC):
        return 0
    text = open(SPEC, encoding="utf-8").read()
    m = re.search(r"<!-- example:begin -->(.*?)<!-- example:end -->", text, re.S)
    if not m:
        errors.append("SPEC.md: worked example markers not found")
        return 0
    frames, cur = [], None
    for line in m.group(1).splitlines():
        line = line.strip()
        if line.startswith("# ") and ("agent -> relay" in line or "relay -> agent" in line):
            cur = ["agent" if "agent -> relay" in line else "relay", ""]
            frames.append(cur)
        elif cur is not None and line and not line.startswith("#") and not line.startswith("`"):
            cur[1] += line.split("#")[0].replace(" ", "")
    relay, agent = wire.Peer("relay"), wire.Peer("agent")
    try:
        for sender, hx in frames:
            data = bytes.fromhex(hx)
            f, n = wire.decode(data)
            if n != len(data):
                raise ValueError(f"example frame {hx[:24]}... is not exactly one frame")
            if sender == "agent":
                agent.send(data)
                relay.receive(data)
            else:
                relay.send(data)
                agent.receive(data)
    except Exception as x:  # noqa: BLE001
        errors.append(f"SPEC.md worked example: {x!r}")
    return len(frames)


def self_tests(errors):
    # truncated header/frame is not an error (§1.9)
    f = encode(HELLO())
    for cut in range(len(f)):
        if wire.decode(f[:cut], wire.INITIAL_MAX_FRAME_SIZE) != (None, 0):
            errors.append(f"self-test: truncated HELLO at {cut} not 'need more'")
    # two frames back to back: decode consumes exactly one
    two = encode(PING()) + encode(PONG())
    fr, n = wire.decode(two)
    if fr["type"] != "PING" or n != 18:
        errors.append("self-test: back-to-back frames")
    # standalone decode of an OPEN with a non-UTF-8 key gives INVALID_KEY on its stream
    try:
        wire.decode(raw_frame(T("OPEN"), 0, 3, p_open(b"\xff")))
        errors.append("self-test: OPEN non-UTF-8 key decoded")
    except wire.WireError as e:
        if e.as_json() != {"code": "INVALID_KEY", "scope": "stream", "stream": 3}:
            errors.append(f"self-test: OPEN non-UTF-8 key gave {e.as_json()}")
    # a DEFLATED chunk is accepted when DEFLATE is in force (§9)
    for raw in (b"A" * 64, b"0123456789abcdef" * 16, bytes(range(256)) * 3, b"x"):
        p = wire.Peer("relay")
        try:
            for st in relay_streams(1, features=1):
                (p.send if "send" in st else p.receive)(bytes.fromhex(st.get("send") or st.get("receive")))
            p.receive(encode(DCHUNK(1, 0, raw)))
        except Exception as x:  # noqa: BLE001
            errors.append(f"self-test: DEFLATED chunk of {len(raw)} bytes: {x!r}")
    # zero-length blob exchange (§10) is legal end to end
    relay = wire.Peer("relay")
    try:
        for who, fr in [("a", HELLO()), ("r", WELCOME()), ("a", OPEN(1)), ("r", OFFSET(1, "START")),
                        ("a", HASH(1, 0, EMPTY_SHA1)), ("r", RESULT(1, "STORED", 0, EMPTY_SHA1, OPEN(1)["key"]))]:
            (relay.receive if who == "a" else relay.send)(encode(fr))
    except Exception as x:  # noqa: BLE001
        errors.append(f"self-test: zero-length blob exchange: {x!r}")


def write_dir(d, vectors):
    os.makedirs(d, exist_ok=True)
    for fn in os.listdir(d):
        if fn.endswith(".json"):
            os.remove(os.path.join(d, fn))
    for name, vec in sorted(vectors.items()):
        with open(os.path.join(d, name + ".json"), "w", encoding="utf-8") as fh:
            json.dump(vec, fh, indent=2, ensure_ascii=False)
            fh.write("\n")


def load_dir(d):
    out = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".json"):
            with open(os.path.join(d, fn), encoding="utf-8") as fh:
                out[fn[:-5]] = json.load(fh)
    return out


def main(argv):
    check_only = "--check" in argv
    vdir, idir = os.path.join(VEC, "valid"), os.path.join(VEC, "invalid")
    if not check_only:
        write_dir(vdir, valid_vectors())
        write_dir(idir, invalid_vectors())
    errors: list[str] = []
    valid, invalid = load_dir(vdir), load_dir(idir)
    if check_only:
        # files on disk must also be exactly what this generator produces
        if valid != json.loads(json.dumps(valid_vectors())) or \
                invalid != json.loads(json.dumps(invalid_vectors())):
            errors.append("vectors on disk differ from gen_vectors.py output (run without --check)")
    for name, vec in valid.items():
        check_valid(name, vec, errors)
    for name, vec in invalid.items():
        check_invalid(name, vec, errors)
    self_tests(errors)
    nex = check_spec_example(errors)
    for e in errors:
        print("FAIL", e)
    print(f"{len(valid)} valid, {len(invalid)} invalid vectors, {nex} example frames: "
          f"{'FAILED' if errors else 'all OK'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
