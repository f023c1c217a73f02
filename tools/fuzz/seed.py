#!/usr/bin/env python3
"""Writes a seed corpus for FuzzRelayInput: every valid vector, and a few whole sessions.

Usage: seed.py DIR
Each file is one byte that picks the read size, then frames as the relay would receive them.
"""
import json
import os
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
VALID = os.path.join(HERE, "..", "..", "protocol", "vectors", "valid")
sys.path.insert(0, os.path.join(HERE, "..", "spec-check"))
import wire  # noqa: E402  (the spec's independent Python codec)


def vector(name):
    with open(os.path.join(VALID, name + ".json")) as f:
        return json.load(f)["frame"]


def opened(stream, key, size=None, flags=None):
    return {"type": "OPEN", "stream": stream, "flags": 1 if size is not None else 0, "key": key,
            "size": size or 0, "sha1": "00" * 20, "fingerprint": "", "resume_token": ""}


def chunk(stream, offset, data, deflate=False):
    frame = {"type": "CHUNK", "stream": stream, "flags": 0, "offset": offset, "crc32": zlib.crc32(data)}
    if deflate:
        frame.update(flags=1, raw_length=len(data), data=zlib.compress(data).hex())
    else:
        frame["data"] = data.hex()
    return frame


def hashed(stream, data):
    import hashlib
    return {"type": "HASH", "stream": stream, "flags": 0, "size": len(data), "sha1": hashlib.sha1(data).hexdigest()}


A, B = b"hello, relay", b"x" * 300
# Whole sessions whose stream ids and offsets agree, so mutations start from frames the relay accepts.
SESSIONS = [
    [vector("hello"), opened(1, "a/b.txt", len(A)), chunk(1, 0, A[:6]), chunk(1, 6, A[6:]), hashed(1, A)],
    [vector("hello-deflate"), opened(1, "z.bin"), chunk(1, 0, B[:200], deflate=True), chunk(1, 200, B[200:], deflate=True),
     hashed(1, B), vector("ping")],
    [vector("hello"), opened(1, "one"), opened(3, "two", len(A)), chunk(3, 0, A), chunk(1, 0, B[:10]),
     {"type": "CANCEL", "stream": 1, "flags": 0, "code": 0, "message": "stop"}, hashed(3, A), vector("goaway")],
]


def frame(name):
    with open(os.path.join(VALID, name)) as f:
        return bytes.fromhex(json.load(f)["hex"].replace(" ", ""))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: seed.py DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    names = sorted(n for n in os.listdir(VALID) if n.endswith(".json"))
    for name in names:
        with open(os.path.join(out, "vector-" + name[:-5]), "wb") as f:
            f.write(bytes([0]) + frame(name))
    for i, session in enumerate(SESSIONS):
        with open(os.path.join(out, "session-%d" % i), "wb") as f:
            f.write(bytes([3]) + b"".join(wire.encode(frame) for frame in session))
    print("%d seeds in %s" % (len(names) + len(SESSIONS), out))


if __name__ == "__main__":
    main()
