#!/usr/bin/env python3
"""The integrity work our protocol asks of any implementation, without the rest of it (issue 9's floor).

Reads every file under PATH (or PATH itself) once, in 1 MiB pieces, and computes over each piece what an agent and a
relay each must: the SHA-1 of the whole blob (libcrypto, through hashlib's OpenSSL backend) and a CRC-32 per chunk
(libdeflate's, as ours, through ctypes) -- twice, once for each side. tools/bench-upload.sh runs it beside curl -Z 8 -> nginx on the same cores: the
pair's speed is the most any implementation of this protocol could reach on this machine with curl's and nginx's own
transport and file costs, so "ours / floor" says how much of the gap to curl is ours and how much is the design's.

Usage: checksums.py PATH   (prints the bytes and files it covered)
"""
import ctypes
import ctypes.util
import hashlib
import os
import sys

PIECE = 1 << 20


def files(path):
    if os.path.isdir(path):
        for name in sorted(os.listdir(path)):
            yield os.path.join(path, name)
    else:
        yield path


def crc32_function():
    """libdeflate_crc32(crc, buffer, length), which our agent and relay call."""
    name = ctypes.util.find_library("deflate")
    if name is None:
        sys.exit("libdeflate is not installed (apt-get install libdeflate0): the floor would not use our CRC-32")
    crc32 = ctypes.CDLL(name).libdeflate_crc32
    crc32.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
    crc32.restype = ctypes.c_uint32
    return crc32


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    if type(hashlib.sha1()).__module__ != "_hashlib":
        sys.exit("hashlib's SHA-1 is not OpenSSL's here: the floor would not be libcrypto's")
    total = count = 0
    # One buffer for every read (as the agent reuses its blocks): a new 1 MiB object per read would be a fresh mapping
    # faulted in page by page, a cost of Python's, not of the checksums.
    buffer = bytearray(PIECE)
    view = memoryview(buffer)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    crc32 = crc32_function()
    for path in files(sys.argv[1]):
        agent_sha1, relay_sha1 = hashlib.sha1(), hashlib.sha1()
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                piece = view[:n]
                agent_sha1.update(piece)
                crc32(0, address, n)
                relay_sha1.update(piece)
                crc32(0, address, n)
                total += n
        if agent_sha1.digest() != relay_sha1.digest():
            sys.exit(f"{path}: the two SHA-1s differ")
        count += 1
    print(f"checksummed {total} bytes in {count} files, twice", file=sys.stderr)


if __name__ == "__main__":
    main()
