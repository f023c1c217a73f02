"""Independent Python codec and state checker for upload wire protocol v1.

Written from protocol/SPEC.md only (no Swift). Python 3.11 standard library.

    encode(frame_dict) -> bytes
    decode(buf, max_frame_size=1114112) -> (frame_dict, consumed)
        returns (None, 0) while `buf` does not yet hold enough bytes to decide
        (a truncated header or frame is not an error); raises WireError.
    Peer(role): a role-aware state checker ("relay" or "agent") with
        .send(bytes) and .receive(bytes) used to replay test vectors.

Section references (§) are to protocol/SPEC.md.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

HEADER_SIZE = 10
INITIAL_MAX_FRAME_SIZE = 65536
DEFAULT_MAX_FRAME_SIZE = 1114112
MIN_MAX_FRAME_SIZE = 16384
MAX_MAX_FRAME_SIZE = 16777216
MAX_U62 = 1 << 62
MAX_WINDOW = (1 << 31) - 1
STREAM_ID_MASK = 0x7FFFFFFF

MAX_CREDENTIAL = 1024
MAX_AGENT_NAME = 255
MAX_ACCOUNT = 255
MAX_MESSAGE = 1024
MAX_OPAQUE8 = 64  # fingerprint / resumeToken
MAX_SEGMENT = 255
MAX_REFUSALS_PER_SECOND = 100  # refused OPENs (§12.1)

FEATURE_DEFLATE = 0x00000001
FEATURE_DEDUP_PROBE = 0x00000002
FEATURE_STRIPES = 0x00000004
FEATURE_QUOTA_PLAN = 0x00000008
MAX_PLAN_ENTRIES = 1000  # §12.1
NO_QUOTA = 0xFFFFFFFFFFFFFFFF  # ROOM.quota of an account without one (§3.16)
PROBE_LENGTH = 262144
STRIPE_MIN = 16777216  # §6.7
STRIPE_MAX_COUNT = 256


def stripe_length(size):
    """§6.7: the smallest 16 MiB x 2^k with size <= 256 x it."""
    length = STRIPE_MIN
    while size > STRIPE_MAX_COUNT * length:
        length *= 2
    return length


def stripe_count(size):
    length = stripe_length(size)
    return (size + length - 1) // length


def stripe_size(size, index):
    """Bytes of stripe `index` of a blob of `size` bytes."""
    length = stripe_length(size)
    return max(0, min(length, size - index * length))
PROTOCOL_VERSION = 1

TYPES = {
    0x01: "HELLO", 0x02: "WELCOME", 0x03: "OPEN", 0x04: "OFFSET", 0x05: "CHUNK",
    0x06: "ACK", 0x07: "CREDIT", 0x08: "HASH", 0x09: "RESULT", 0x0A: "ERROR",
    0x0B: "CANCEL", 0x0C: "PING", 0x0D: "PONG", 0x0E: "GOAWAY",
    0x0F: "PLAN", 0x10: "ROOM",
}
TYPE_CODES = {v: k for k, v in TYPES.items()}

FLAG_SIZE_KNOWN = 0x01
FLAG_SHA1_KNOWN = 0x02
FLAG_OVERWRITE = 0x04
FLAG_PROBE = 0x08
FLAG_STRIPED = 0x10
FLAG_PART = 0x20
FLAG_DEFLATED = 0x01
ALLOWED_FLAGS = {name: 0 for name in TYPE_CODES}
ALLOWED_FLAGS["OPEN"] = FLAG_SIZE_KNOWN | FLAG_SHA1_KNOWN | FLAG_OVERWRITE | FLAG_PROBE | FLAG_STRIPED | FLAG_PART
ALLOWED_FLAGS["CHUNK"] = FLAG_DEFLATED
ALLOWED_FLAGS["PLAN"] = FLAG_OVERWRITE

# "zero": stream id MUST be 0; "nonzero": MUST be non-zero; "any": either (§1.5)
STREAM_RULE = {
    "HELLO": "zero", "WELCOME": "zero", "PING": "zero", "PONG": "zero", "GOAWAY": "zero",
    "PLAN": "zero", "ROOM": "zero",
    "OPEN": "nonzero", "OFFSET": "nonzero", "CHUNK": "nonzero", "ACK": "nonzero",
    "HASH": "nonzero", "RESULT": "nonzero", "CANCEL": "nonzero",
    "ERROR": "any", "CREDIT": "any",
}

# which role may send each type (None = both) (§1.4)
SENDER = {
    "HELLO": "agent", "WELCOME": "relay", "OPEN": "agent", "OFFSET": "relay",
    "CHUNK": "agent", "ACK": "relay", "CREDIT": "relay", "HASH": "agent",
    "RESULT": "relay", "ERROR": None, "CANCEL": "agent", "PING": None,
    "PONG": None, "GOAWAY": None, "PLAN": "agent", "ROOM": "relay",
}

ERROR_CODES = {
    0x0000: "NO_ERROR", 0x0001: "PROTOCOL_ERROR", 0x0002: "FRAME_SIZE_ERROR",
    0x0003: "UNSUPPORTED_VERSION", 0x0004: "UNAUTHENTICATED", 0x0005: "FLOW_CONTROL_ERROR",
    0x0006: "STREAM_CLOSED", 0x0007: "REFUSED_STREAM", 0x0008: "INVALID_KEY",
    0x0009: "INVALID_OFFSET", 0x000A: "CRC_MISMATCH", 0x000B: "HASH_MISMATCH",
    0x000C: "SIZE_MISMATCH", 0x000D: "QUOTA_EXCEEDED", 0x000E: "ALREADY_EXISTS",
    0x000F: "KEY_BUSY", 0x0010: "STORAGE_ERROR", 0x0011: "DECOMPRESSION_ERROR",
    0x0012: "CANCELLED", 0x0013: "TIMEOUT", 0x0014: "ENHANCE_YOUR_CALM",
    0x0015: "INTERNAL_ERROR", 0x0016: "TOO_LARGE",
}
ERROR_NUMBERS = {v: k for k, v in ERROR_CODES.items()}

DISPOSITIONS = {0: "START", 1: "RESUME", 2: "STORED", 3: "CONFIRM"}
DISPOSITION_NUMBERS = {v: k for k, v in DISPOSITIONS.items()}
RESULT_STATUS = {0: "STORED", 1: "UNCHANGED"}
RESULT_STATUS_NUMBERS = {v: k for k, v in RESULT_STATUS.items()}

ZERO_SHA1 = bytes(20)


class WireError(Exception):
    """A protocol error: code name, scope ("connection"|"stream"), stream id (0 for connection)."""

    def __init__(self, code: str, scope: str, stream: int = 0, why: str = ""):
        assert code in ERROR_NUMBERS, code
        assert scope in ("connection", "stream")
        if scope == "connection":
            stream = 0
        super().__init__(f"{code} ({scope}, stream {stream}): {why}")
        self.code = code
        self.scope = scope
        self.stream = stream
        self.why = why

    def as_json(self) -> dict:
        return {"code": self.code, "scope": self.scope, "stream": self.stream}


def _conn(code: str, why: str) -> WireError:
    return WireError(code, "connection", 0, why)


def _strm(code: str, stream: int, why: str) -> WireError:
    return WireError(code, "stream", stream, why)


def code_name(n: int):
    """Error code for JSON: the name if known, else the number (§11)."""
    return ERROR_CODES.get(n, n)


def code_number(c) -> int:
    return c if isinstance(c, int) else ERROR_NUMBERS[c]


# ---------------------------------------------------------------- payload reader


class _Layout(Exception):
    pass


class _Reader:
    def __init__(self, b: bytes):
        self.b = b
        self.i = 0

    def take(self, n: int) -> bytes:
        if self.i + n > len(self.b):
            raise _Layout("payload too short")
        v = self.b[self.i:self.i + n]
        self.i += n
        return v

    def u8(self): return self.take(1)[0]
    def u16(self): return struct.unpack(">H", self.take(2))[0]
    def u32(self): return struct.unpack(">I", self.take(4))[0]
    def u64(self): return struct.unpack(">Q", self.take(8))[0]
    def bytes8(self): return self.take(self.u8())
    def bytes16(self): return self.take(self.u16())

    def rest(self) -> bytes:
        v = self.b[self.i:]
        self.i = len(self.b)
        return v

    def end(self):
        if self.i != len(self.b):
            raise _Layout("trailing bytes after payload")


def _utf8(raw: bytes):
    try:
        return raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        return None


# ---------------------------------------------------------------- decode


def peek_header(buf: bytes, max_frame_size: int):
    """Return (length, type, flags, stream_raw) or None if fewer than 10 bytes.
    Checks the length bounds as soon as 4 bytes are present (§1.3)."""
    if len(buf) < 4:
        return None
    (length,) = struct.unpack(">I", buf[:4])
    if length < HEADER_SIZE:
        raise _conn("FRAME_SIZE_ERROR", f"frame length {length} < 10")
    if length > max_frame_size:
        raise _conn("FRAME_SIZE_ERROR", f"frame length {length} > max frame size {max_frame_size}")
    if len(buf) < HEADER_SIZE:
        return None
    t, f, s = struct.unpack(">BBI", buf[4:10])
    return length, t, f, s


def decode(buf: bytes, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, defer_key: bool = False):
    """Decode one frame from the start of `buf` following §1.9 steps 1-9 (role-agnostic:
    the direction check belongs to step 10, see Peer).

    defer_key: if True an OPEN key that is not valid UTF-8 is returned as
      frame["key"] = None, frame["key_raw"] = bytes instead of raising INVALID_KEY,
      so that a state machine can apply the connection-level OPEN checks first (§4.6).
    """
    buf = bytes(buf)
    hdr = peek_header(buf, max_frame_size)
    if hdr is None:
        return None, 0
    length, t, flags, sraw = hdr
    if len(buf) < length:
        return None, 0
    payload = buf[HEADER_SIZE:length]

    if sraw & 0x80000000:
        raise _conn("PROTOCOL_ERROR", "reserved stream id bit set")
    sid = sraw
    name = TYPES.get(t)
    if name is None:
        if t >= 0x80:
            # extension frame: discarded; flags and stream id value are not checked (§1.7)
            return ({"type": "EXTENSION", "stream": sid, "flags": flags,
                     "extension_type": t, "data": payload.hex()}, length)
        raise _conn("PROTOCOL_ERROR", f"unknown frame type 0x{t:02x}")
    rule = STREAM_RULE[name]
    if rule == "zero" and sid != 0:
        raise _conn("PROTOCOL_ERROR", f"{name} must use stream 0")
    if rule == "nonzero" and sid == 0:
        raise _conn("PROTOCOL_ERROR", f"{name} must use a non-zero stream id")
    if flags & ~ALLOWED_FLAGS[name] & 0xFF:
        raise _conn("PROTOCOL_ERROR", f"undefined flag bits 0x{flags & ~ALLOWED_FLAGS[name] & 0xFF:02x} on {name}")

    # layout (step 8) -> FRAME_SIZE_ERROR; then values (step 9)
    try:
        fr = _parse_layout(name, flags, payload)
    except _Layout as e:
        raise _conn("FRAME_SIZE_ERROR", f"{name}: {e}")
    frame = {"type": name, "stream": sid, "flags": flags}
    frame.update(_check_values(name, sid, flags, fr, max_frame_size, defer_key))
    return frame, length


def _other(role: str) -> str:
    return "agent" if role == "relay" else "relay"


def _parse_layout(name: str, flags: int, p: bytes) -> dict:
    r = _Reader(p)
    v: dict = {}
    if name == "HELLO":
        v["magic"] = r.take(4)
        v["min_version"] = r.u16()
        v["max_version"] = r.u16()
        v["max_frame_size"] = r.u32()
        v["features"] = r.u32()
        v["auth_method"] = r.u8()
        v["credential"] = r.bytes16()
        v["agent_name"] = r.bytes16()
    elif name == "WELCOME":
        v["version"] = r.u16()
        v["max_frame_size"] = r.u32()
        v["features"] = r.u32()
        v["max_streams"] = r.u32()
        v["connection_window"] = r.u32()
        v["stream_window"] = r.u32()
        v["max_key_length"] = r.u16()
        v["idle_timeout_millis"] = r.u32()
        v["account"] = r.bytes16()
    elif name == "OPEN":
        v["key"] = r.bytes16()
        v["size"] = r.u64()
        v["sha1"] = r.take(20)
        v["fingerprint"] = r.bytes8()
        v["resume_token"] = r.bytes8()
        if flags & FLAG_PART:
            v["part"] = r.u32()
    elif name == "OFFSET":
        v["disposition"] = r.u8()
        v["offset"] = r.u64()
        v["resume_token"] = r.bytes8()
    elif name == "CHUNK":
        v["offset"] = r.u64()
        v["crc32"] = r.u32()
        if flags & FLAG_DEFLATED:
            v["raw_length"] = r.u32()
        v["data"] = r.rest()
    elif name == "ACK":
        v["offset"] = r.u64()
    elif name == "CREDIT":
        v["increment"] = r.u32()
    elif name == "HASH":
        v["size"] = r.u64()
        v["sha1"] = r.take(20)
    elif name == "RESULT":
        v["status"] = r.u8()
        v["size"] = r.u64()
        v["sha1"] = r.take(20)
        v["key"] = r.bytes16()
    elif name in ("ERROR", "CANCEL"):
        v["code"] = r.u16()
        v["message"] = r.bytes16()
    elif name in ("PING", "PONG"):
        v["data"] = r.take(8)
    elif name == "GOAWAY":
        v["last_stream_id"] = r.u32()
        v["code"] = r.u16()
        v["message"] = r.bytes16()
    elif name == "PLAN":
        v["request"] = r.u32()
        count = r.u16()
        v["entries"] = [(r.bytes16(), r.u64()) for _ in range(count)]
    elif name == "ROOM":
        v["request"] = r.u32()
        v["quota"] = r.u64()
        v["used"] = r.u64()
        count = r.u16()
        v["needs"] = [r.u64() for _ in range(count)]
    r.end()
    return v


def _pe(name: str, why: str) -> WireError:
    return _conn("PROTOCOL_ERROR", f"{name}: {why}")


def _u62(name: str, field: str, x: int):
    if x > MAX_U62:
        raise _pe(name, f"{field} {x} > 2^62")


def _str(name: str, field: str, raw: bytes, limit: int | None) -> str:
    if limit is not None and len(raw) > limit:
        raise _pe(name, f"{field} longer than {limit} bytes")
    s = _utf8(raw)
    if s is None:
        raise _pe(name, f"{field} is not valid UTF-8")
    return s


def _has_control(s: str) -> bool:
    """C0, DEL, C1, bidirectional controls and the line separators (§1.1's "display strings")."""
    for ch in s:
        c = ord(ch)
        if c <= 0x1F or 0x7F <= c <= 0x9F or c in (0x061C, 0x200E, 0x200F, 0x2028, 0x2029) \
                or 0x202A <= c <= 0x202E or 0x2066 <= c <= 0x2069:
            return True
    return False


def _display(name: str, field: str, raw: bytes, limit: int | None) -> str:
    s = _str(name, field, raw, limit)
    if _has_control(s):
        raise _pe(name, f"{field} holds a control character")
    return s


def _check_values(name, sid, flags, v, max_frame_size, defer_key) -> dict:
    out: dict = {}
    if name == "HELLO":
        if v["magic"] != b"UPLD":
            raise _pe(name, "bad magic")
        if v["min_version"] > v["max_version"]:
            raise _pe(name, "min_version > max_version")
        if not MIN_MAX_FRAME_SIZE <= v["max_frame_size"] <= MAX_MAX_FRAME_SIZE:
            raise _pe(name, "max_frame_size out of range")
        if len(v["credential"]) > MAX_CREDENTIAL:
            raise _pe(name, "credential longer than 1024 bytes")
        agent_name = _display(name, "agent_name", v["agent_name"], MAX_AGENT_NAME)
        out = {"magic": "UPLD", "min_version": v["min_version"], "max_version": v["max_version"],
               "max_frame_size": v["max_frame_size"], "features": v["features"],
               "auth_method": v["auth_method"], "credential": v["credential"].hex(),
               "agent_name": agent_name}
    elif name == "WELCOME":
        if not MIN_MAX_FRAME_SIZE <= v["max_frame_size"] <= MAX_MAX_FRAME_SIZE:
            raise _pe(name, "max_frame_size out of range")
        if v["max_streams"] < 1:
            raise _pe(name, "max_streams is 0")
        for w in ("connection_window", "stream_window"):
            if not 1 <= v[w] <= MAX_WINDOW:
                raise _pe(name, f"{w} not in 1..2^31-1")
        if v["max_key_length"] < 1:
            raise _pe(name, "max_key_length is 0")
        account = _display(name, "account", v["account"], MAX_ACCOUNT)
        out = dict(v)
        out["account"] = account
    elif name == "OPEN":
        _u62(name, "size", v["size"])
        if not flags & FLAG_SIZE_KNOWN and v["size"] != 0:
            raise _pe(name, "size non-zero without SIZE_KNOWN")
        if not flags & (FLAG_SHA1_KNOWN | FLAG_PROBE) and v["sha1"] != ZERO_SHA1:
            raise _pe(name, "sha1 non-zero without SHA1_KNOWN or PROBE")
        if flags & FLAG_PROBE:
            if flags & FLAG_SHA1_KNOWN:
                raise _pe(name, "PROBE with SHA1_KNOWN")
            if not flags & FLAG_SIZE_KNOWN or v["size"] <= PROBE_LENGTH:
                raise _pe(name, "PROBE without SIZE_KNOWN and a size above 262144")
        if flags & FLAG_STRIPED:
            if flags & FLAG_PART:
                raise _pe(name, "STRIPED with PART")
            if not flags & FLAG_SIZE_KNOWN or v["size"] <= stripe_length(v["size"]):
                raise _pe(name, "STRIPED without SIZE_KNOWN and at least 2 stripes")
        if flags & FLAG_PART:
            if flags & (FLAG_SHA1_KNOWN | FLAG_PROBE | FLAG_OVERWRITE):
                raise _pe(name, "PART with SHA1_KNOWN, PROBE or OVERWRITE")
            if not flags & FLAG_SIZE_KNOWN or not v["resume_token"]:
                raise _pe(name, "PART without SIZE_KNOWN or a resume token")
            if not 1 <= v["part"] < stripe_count(v["size"]):
                raise _pe(name, "part not a stripe after the first")
        if len(v["fingerprint"]) > MAX_OPAQUE8:
            raise _pe(name, "fingerprint longer than 64 bytes")
        if len(v["resume_token"]) > MAX_OPAQUE8:
            raise _pe(name, "resume_token longer than 64 bytes")
        key = _utf8(v["key"])
        if key is None and not defer_key:
            raise _strm("INVALID_KEY", sid, "key is not valid UTF-8")
        out = {"key": key, "size": v["size"], "sha1": v["sha1"].hex(),
               "fingerprint": v["fingerprint"].hex(), "resume_token": v["resume_token"].hex()}
        if "part" in v:
            out["part"] = v["part"]
        if key is None:
            out["key_raw"] = v["key"]
    elif name == "OFFSET":
        d = v["disposition"]
        if d not in DISPOSITIONS:
            raise _pe(name, f"unknown disposition {d}")
        _u62(name, "offset", v["offset"])
        if d == 0 and v["offset"] != 0:
            raise _pe(name, "START with non-zero offset")
        if d == 1 and v["offset"] == 0:
            raise _pe(name, "RESUME with offset 0")
        if len(v["resume_token"]) > MAX_OPAQUE8:
            raise _pe(name, "resume_token longer than 64 bytes")
        if d == 2 and v["resume_token"]:
            raise _pe(name, "STORED with a resume_token")
        if d == 3 and (v["offset"] != 0 or v["resume_token"]):
            raise _pe(name, "CONFIRM with an offset or a resume_token")
        out = {"disposition": DISPOSITIONS[d], "offset": v["offset"],
               "resume_token": v["resume_token"].hex()}
    elif name == "CHUNK":
        _u62(name, "offset", v["offset"])
        if flags & FLAG_DEFLATED:
            if not 1 <= v["raw_length"] <= max_frame_size:
                raise _pe(name, "raw_length not in 1..max frame size")
        if len(v["data"]) == 0:
            raise _pe(name, "empty data")
        raw_len = v["raw_length"] if flags & FLAG_DEFLATED else len(v["data"])
        if v["offset"] + raw_len > MAX_U62:
            raise _pe(name, "offset + raw length > 2^62")
        out = {"offset": v["offset"], "crc32": v["crc32"]}
        if flags & FLAG_DEFLATED:
            out["raw_length"] = v["raw_length"]
        out["data"] = v["data"].hex()
    elif name == "ACK":
        _u62(name, "offset", v["offset"])
        out = {"offset": v["offset"]}
    elif name == "CREDIT":
        if not 1 <= v["increment"] <= MAX_WINDOW:
            raise _pe(name, "increment not in 1..2^31-1")
        out = {"increment": v["increment"]}
    elif name == "HASH":
        _u62(name, "size", v["size"])
        out = {"size": v["size"], "sha1": v["sha1"].hex()}
    elif name == "RESULT":
        if v["status"] not in RESULT_STATUS:
            raise _pe(name, f"unknown status {v['status']}")
        _u62(name, "size", v["size"])
        key = _str(name, "key", v["key"], None)
        out = {"status": RESULT_STATUS[v["status"]], "size": v["size"], "sha1": v["sha1"].hex(),
               "key": key}
    elif name in ("ERROR", "CANCEL"):
        msg = _str(name, "message", v["message"], MAX_MESSAGE)
        out = {"code": code_name(v["code"]), "message": msg}
    elif name in ("PING", "PONG"):
        out = {"data": v["data"].hex()}
    elif name == "GOAWAY":
        if v["last_stream_id"] & 0x80000000:
            raise _pe(name, "last_stream_id has the reserved bit set")
        msg = _str(name, "message", v["message"], MAX_MESSAGE)
        out = {"last_stream_id": v["last_stream_id"], "code": code_name(v["code"]), "message": msg}
    elif name == "PLAN":
        if len(v["entries"]) > MAX_PLAN_ENTRIES:
            raise _pe(name, f"{len(v['entries'])} entries, more than {MAX_PLAN_ENTRIES}")
        entries = []
        for raw, size in v["entries"]:
            _u62(name, "size", size)
            key = _utf8(raw)
            # A key that is not UTF-8 (PLAN does not check it) is given as its bytes, so that the vector round-trips.
            entries.append({"key": key, "size": size} if key is not None else {"key_hex": bytes(raw).hex(), "size": size})
        out = {"request": v["request"], "entries": entries}
    elif name == "ROOM":
        if v["quota"] != NO_QUOTA:
            _u62(name, "quota", v["quota"])
        _u62(name, "used", v["used"])
        for need in v["needs"]:
            _u62(name, "need", need)
        out = {"request": v["request"], "quota": "none" if v["quota"] == NO_QUOTA else v["quota"],
               "used": v["used"], "needs": list(v["needs"])}
    return out


# ---------------------------------------------------------------- encode


def _s16(x) -> bytes:
    b = x.encode("utf-8") if isinstance(x, str) else bytes(x)
    return struct.pack(">H", len(b)) + b


def _b16(h: str) -> bytes:
    b = bytes.fromhex(h)
    return struct.pack(">H", len(b)) + b


def _b8(h: str) -> bytes:
    b = bytes.fromhex(h)
    return struct.pack(">B", len(b)) + b


def header(length: int, type_: int, flags: int, stream: int) -> bytes:
    return struct.pack(">IBBI", length, type_, flags, stream)


def raw_frame(type_: int, flags: int, stream: int, payload: bytes) -> bytes:
    """Frame with an arbitrary header/payload (no checks); used to build invalid inputs."""
    return header(HEADER_SIZE + len(payload), type_, flags, stream) + payload


def encode(f: dict) -> bytes:
    """Encode a frame dict in the vectors' JSON form (Appendix A). No validation."""
    t = f["type"]
    flags = f.get("flags", 0)
    sid = f.get("stream", 0)
    if t == "EXTENSION":
        return raw_frame(f["extension_type"], flags, sid, bytes.fromhex(f["data"]))
    if t == "HELLO":
        magic = f.get("magic", "UPLD")
        p = (magic.encode() if isinstance(magic, str) else magic) + struct.pack(
            ">HHIIB", f["min_version"], f["max_version"], f["max_frame_size"], f["features"],
            f["auth_method"]) + _b16(f["credential"]) + _s16(f["agent_name"])
    elif t == "WELCOME":
        p = struct.pack(">HIIIIIHI", f["version"], f["max_frame_size"], f["features"],
                        f["max_streams"], f["connection_window"], f["stream_window"],
                        f["max_key_length"], f["idle_timeout_millis"]) + _s16(f["account"])
    elif t == "OPEN":
        p = _s16(f["key"]) + struct.pack(">Q", f["size"]) + bytes.fromhex(f["sha1"]) + \
            _b8(f["fingerprint"]) + _b8(f["resume_token"])
        if "part" in f:
            p += struct.pack(">I", f["part"])
    elif t == "OFFSET":
        d = f["disposition"]
        d = DISPOSITION_NUMBERS[d] if isinstance(d, str) else d
        p = struct.pack(">BQ", d, f["offset"]) + _b8(f["resume_token"])
    elif t == "CHUNK":
        p = struct.pack(">QI", f["offset"], f["crc32"])
        if "raw_length" in f:
            p += struct.pack(">I", f["raw_length"])
        p += bytes.fromhex(f["data"])
    elif t == "ACK":
        p = struct.pack(">Q", f["offset"])
    elif t == "CREDIT":
        p = struct.pack(">I", f["increment"])
    elif t == "HASH":
        p = struct.pack(">Q", f["size"]) + bytes.fromhex(f["sha1"])
    elif t == "RESULT":
        s = f["status"]
        s = RESULT_STATUS_NUMBERS[s] if isinstance(s, str) else s
        p = struct.pack(">BQ", s, f["size"]) + bytes.fromhex(f["sha1"]) + _s16(f["key"])
    elif t in ("ERROR", "CANCEL"):
        p = struct.pack(">H", code_number(f["code"])) + _s16(f["message"])
    elif t in ("PING", "PONG"):
        p = bytes.fromhex(f["data"])
    elif t == "GOAWAY":
        p = struct.pack(">IH", f["last_stream_id"], code_number(f["code"])) + _s16(f["message"])
    elif t == "PLAN":
        p = struct.pack(">IH", f["request"], len(f["entries"]))
        for e in f["entries"]:
            p += (_b16(e["key_hex"]) if "key_hex" in e else _s16(e["key"])) + struct.pack(">Q", e["size"])
    elif t == "ROOM":
        quota = NO_QUOTA if f["quota"] == "none" else f["quota"]
        p = struct.pack(">IQQH", f["request"], quota, f["used"], len(f["needs"]))
        p += b"".join(struct.pack(">Q", n) for n in f["needs"])
    else:
        raise ValueError(t)
    return raw_frame(TYPE_CODES[t], flags, sid, p)


# ---------------------------------------------------------------- key rules (§12.2)


def key_problem(raw: bytes, max_key_length: int):
    """Return None if `raw` is a valid key, else a short name of the broken rule."""
    if _utf8(raw) is None:
        return "not valid UTF-8"
    if len(raw) == 0:
        return "empty"
    if len(raw) > max_key_length:
        return "longer than maxKeyLength"
    for b in raw:
        if b < 0x20 or b == 0x7F:
            return "control byte"
        if b == 0x5C:
            return "backslash"
    for seg in raw.split(b"/"):
        if seg == b"":
            return "empty segment"
        if seg in (b".", b".."):
            return "dot segment"
        if len(seg) > MAX_SEGMENT:
            return "segment longer than 255 bytes"
    return None


# ---------------------------------------------------------------- state checker (§2, §4, §5)


class _Stream:
    def __init__(self, sid: int, open_frame: dict):
        self.sid = sid
        self.state = "OPENING"
        self.key = open_frame.get("key")
        fl = open_frame["flags"]
        self.size_known = bool(fl & FLAG_SIZE_KNOWN)
        self.size = open_frame["size"]
        self.sha1_known = bool(fl & FLAG_SHA1_KNOWN)
        self.probe = bool(fl & FLAG_PROBE)
        self.striped = bool(fl & FLAG_STRIPED)
        self.part = open_frame.get("part")
        # The bytes this stream carries (§6.7): the size, the first stripe, or stripe `part`.
        self.length = self.size
        if self.size_known and self.striped:
            self.length = stripe_size(self.size, 0)
        elif self.size_known and self.part is not None:
            self.length = stripe_size(self.size, self.part)
        self.sha1 = bytes.fromhex(open_frame["sha1"])
        self.window = 0
        self.offset = 0       # relay: next expected offset; agent: bytes sent (next offset)
        self.acked = 0        # agent: last acknowledged durable offset
        self.sha = hashlib.sha1()   # relay: SHA-1 of received bytes (None after RESUME)
        self.reset_by_self = False
        self.final_sent = False   # relay: closed by its own RESULT or OFFSET STORED
        self.hash = None      # agent: the HASH frame it sent


class Peer:
    """Role-aware checker. `receive` raises WireError exactly as a conforming
    receiver would report it; `send` applies our own sent frames to the state
    and asserts they are legal (so vector setups are themselves conformant)."""

    def __init__(self, role: str):
        assert role in ("relay", "agent")
        self.role = role
        self.conn = "AWAITING_HELLO" if role == "relay" else "START"
        self.max_recv = INITIAL_MAX_FRAME_SIZE
        self.hello = None
        self.welcome = None
        self.deflate = False
        self.conn_window = 0
        self.streams: dict[int, _Stream] = {}
        self.highest = 0
        self.goaway_sent = None      # lastStreamID of the GOAWAY we sent
        self.goaway_received = None  # lastStreamID of the GOAWAY we received
        self.refusals = 0            # relay: refused OPENs; a vector lasts under a second (Appendix A.2)
        self.plan = None             # the unanswered PLAN (sent by an agent, received by a relay), §3.15
        self.buf = b""

    # ---- helpers
    def _open_count(self) -> int:
        return sum(1 for s in self.streams.values() if s.state != "CLOSED")

    def _refuse(self, code: str, sid: int, why: str) -> WireError:
        """The relay refuses OPEN(sid) (§4.6 items 4-6): the stream error, or, for the 101st refusal within a
        second, ENHANCE_YOUR_CALM on the connection instead (§12.1)."""
        self.refusals += 1
        if self.refusals > MAX_REFUSALS_PER_SECOND:
            return _conn("ENHANCE_YOUR_CALM", f"refused OPEN number {self.refusals} within one second")
        return _strm(code, sid, why)

    # ---- sending (our own frames)
    def send(self, data: bytes):
        frame, n = decode(data, MAX_MAX_FRAME_SIZE)
        assert frame is not None and n == len(data), "setup send must be exactly one whole frame"
        t, sid = frame["type"], frame["stream"]
        assert t == "EXTENSION" or SENDER[t] in (None, self.role), f"{self.role} may not send {t}"
        ln = len(data)
        if self.role == "agent":
            peer_max = self.welcome["max_frame_size"] if self.welcome else INITIAL_MAX_FRAME_SIZE
        else:
            peer_max = self.hello["max_frame_size"] if self.hello else INITIAL_MAX_FRAME_SIZE
        assert ln <= peer_max, "frame longer than the peer accepts"
        getattr(self, f"_send_{self.role}")(frame, t, sid)

    def _send_agent(self, f, t, sid):
        if t == "HELLO":
            assert self.conn == "START"
            self.conn = "HELLO_SENT"
            self.hello = f
            self.max_recv = f["max_frame_size"]
            return
        assert self.conn in ("READY", "GOING_AWAY"), f"agent sends {t} in {self.conn}"
        if t == "OPEN":
            assert sid > self.highest and self.goaway_received is None and self.goaway_sent is None
            assert self._open_count() < self.welcome["max_streams"]
            self.highest = sid
            self.streams[sid] = _Stream(sid, f)
        elif t == "CHUNK":
            st = self.streams[sid]
            assert st.state == "SENDING" and f["offset"] == st.offset
            n = f.get("raw_length", len(f["data"]) // 2)
            assert f["flags"] & FLAG_DEFLATED == 0 or self.deflate
            assert n <= st.window and n <= self.conn_window, "agent overruns credit"
            st.window -= n
            self.conn_window -= n
            st.offset += n
        elif t == "HASH":
            st = self.streams[sid]
            assert st.state == "SENDING"
            st.state = "AWAITING_RESULT"
            st.hash = f
        elif t in ("CANCEL", "ERROR") and sid != 0:
            st = self.streams[sid]
            assert st.state != "CLOSED"
            st.state = "CLOSED"
            st.reset_by_self = True
        elif t == "ERROR":
            self.conn = "CLOSED"
        elif t == "GOAWAY":
            self.goaway_sent = f["last_stream_id"]
        elif t in ("PING", "PONG"):
            pass
        elif t == "PLAN":
            assert self.welcome["features"] & FEATURE_QUOTA_PLAN and self.plan is None
            self.plan = f
        else:
            raise AssertionError(t)

    def _send_relay(self, f, t, sid):
        if t == "ERROR" and sid == 0:
            self.conn = "CLOSED"
            return
        if t == "WELCOME":
            assert self.conn == "AUTHENTICATING"
            self.conn = "READY"
            self.welcome = f
            self.max_recv = f["max_frame_size"]
            self.conn_window = f["connection_window"]
            self.deflate = bool(f["features"] & FEATURE_DEFLATE)
            return
        assert self.conn in ("READY", "GOING_AWAY"), f"relay sends {t} in {self.conn}"
        if t == "GOAWAY":
            self.conn = "GOING_AWAY"
            self.goaway_sent = f["last_stream_id"]
            return
        if t in ("PING", "PONG"):
            return
        if t == "ROOM":
            assert self.plan is not None and f["request"] == self.plan["request"]
            assert len(f["needs"]) == len(self.plan["entries"])
            self.plan = None
            return
        if t == "CREDIT" and sid == 0:
            self.conn_window += f["increment"]
            assert self.conn_window <= MAX_WINDOW
            return
        st = self.streams[sid]
        if t == "OFFSET":
            assert st.state == "OPENING"
            if f["disposition"] in ("STORED", "CONFIRM"):
                assert f["disposition"] == "STORED" or st.probe
                st.state = "CLOSED"
                st.final_sent = True
            else:
                st.state = "RECEIVING"
                st.window = self.welcome["stream_window"]
                st.offset = f["offset"]
                if f["offset"] != 0:
                    st.sha = None  # prefix not known to the checker
        elif t == "CREDIT":
            assert st.state in ("RECEIVING", "VERIFYING")
            st.window += f["increment"]
            assert st.window <= MAX_WINDOW
        elif t == "ACK":
            assert st.state in ("RECEIVING", "VERIFYING") and f["offset"] <= st.offset
        elif t == "RESULT":
            assert st.state == "VERIFYING"
            st.state = "CLOSED"
            st.final_sent = True
        elif t == "ERROR":
            assert st.state != "CLOSED"
            if st.state == "OPENING":
                # a refused OPEN (§12.1); past the limit a relay sends ERROR(0, ENHANCE_YOUR_CALM) instead
                self.refusals += 1
                assert self.refusals <= MAX_REFUSALS_PER_SECOND, "the 101st refusal is ENHANCE_YOUR_CALM, not ERROR(N)"
            st.state = "CLOSED"
            st.reset_by_self = True
        else:
            raise AssertionError(t)

    # ---- receiving
    def receive(self, data: bytes) -> list:
        """Feed bytes; process every complete frame. Returns the frames processed.
        Raises WireError on the first error."""
        self.buf += bytes(data)
        done = []
        while True:
            if self.conn == "CLOSED":
                self.buf = b""
                return done
            frame, n = decode(self.buf, self.max_recv, defer_key=True)
            if frame is None:
                return done
            self.buf = self.buf[n:]
            t = frame["type"]
            # §1.9 step 10 starts with the direction check
            if t != "EXTENSION" and SENDER[t] not in (None, _other(self.role)):
                raise _conn("PROTOCOL_ERROR", f"{t} received by the {self.role} (wrong direction)")
            getattr(self, f"_recv_{self.role}")(frame)
            done.append(frame)

    # relay side ---------------------------------------------------------
    def _recv_relay(self, f):
        t, sid = f["type"], f["stream"]
        if t == "ERROR" and sid == 0:
            self.conn = "CLOSED"  # in any state: close, no reply (§2.4)
            return
        if self.conn == "AWAITING_HELLO":
            if t != "HELLO":
                raise _conn("PROTOCOL_ERROR", f"first frame is {t}, not HELLO")
            if not f["min_version"] <= PROTOCOL_VERSION <= f["max_version"]:
                raise _conn("UNSUPPORTED_VERSION", "no common version")
            if f["auth_method"] != 1 or not f["credential"]:
                raise _conn("UNAUTHENTICATED", "unsupported auth method or empty token")
            self.hello = f
            self.conn = "AUTHENTICATING"
            return
        if self.conn == "AUTHENTICATING":
            raise _conn("PROTOCOL_ERROR", f"{t} received before WELCOME was sent")
        if t == "EXTENSION" or t in ("PING", "PONG"):
            return
        if t == "HELLO":
            raise _conn("PROTOCOL_ERROR", "second HELLO")
        if t == "GOAWAY":
            if self.goaway_received is not None and f["last_stream_id"] > self.goaway_received:
                raise _conn("PROTOCOL_ERROR", "GOAWAY last_stream_id increased")
            self.goaway_received = f["last_stream_id"]
            return
        if t == "PLAN":
            if not self.welcome["features"] & FEATURE_QUOTA_PLAN:
                raise _conn("PROTOCOL_ERROR", "PLAN but QUOTA_PLAN is not in force")
            if self.plan is not None:
                raise _conn("PROTOCOL_ERROR", "PLAN while an earlier PLAN is unanswered")
            self.plan = f
            return
        if t == "OPEN":
            return self._relay_open(f)
        if t == "CHUNK":
            return self._relay_chunk(f)
        # HASH, CANCEL, ERROR(N)
        if sid > self.highest:
            raise _conn("PROTOCOL_ERROR", f"{t} on stream {sid} never opened")
        st = self.streams.get(sid)
        if st is None or st.state == "CLOSED":
            if st is None or st.reset_by_self or (t in ("CANCEL", "ERROR") and st.final_sent):
                return  # discarded (§4.7)
            raise _conn("STREAM_CLOSED", f"{t} on stream {sid} closed normally")
        if t in ("CANCEL", "ERROR"):
            st.state = "CLOSED"
            return
        # HASH
        if st.state != "RECEIVING":
            raise _conn("PROTOCOL_ERROR", f"HASH in {st.state}")
        st.state = "VERIFYING"
        if st.striped:
            if f["size"] != st.size or st.offset != st.length:
                raise _strm("SIZE_MISMATCH", sid, "HASH size of a striped upload")
        elif f["size"] != st.offset or (st.size_known and f["size"] != st.length):
            raise _strm("SIZE_MISMATCH", sid, "HASH size")
        h = bytes.fromhex(f["sha1"])
        if st.sha1_known and h != st.sha1:
            raise _strm("HASH_MISMATCH", sid, "HASH sha1 != OPEN sha1")
        if st.sha is not None and h != st.sha.digest():
            raise _strm("HASH_MISMATCH", sid, "HASH sha1 != SHA-1 of received bytes")

    def _relay_open(self, f):
        sid = f["stream"]
        if sid <= self.highest:
            raise _conn("PROTOCOL_ERROR", f"OPEN stream id {sid} not greater than {self.highest}")
        if f["flags"] & FLAG_PROBE and not self.welcome["features"] & FEATURE_DEDUP_PROBE:
            raise _conn("PROTOCOL_ERROR", "PROBE but the dedup probe is not in force")
        if f["flags"] & (FLAG_STRIPED | FLAG_PART) and not self.welcome["features"] & FEATURE_STRIPES:
            raise _conn("PROTOCOL_ERROR", "STRIPED or PART but stripes are not in force")
        if self.goaway_received is not None:
            raise _conn("PROTOCOL_ERROR", "OPEN after the agent sent GOAWAY")
        self.highest = sid
        st = _Stream(sid, f)
        st.state = "CLOSED"
        st.reset_by_self = True  # until accepted below
        self.streams[sid] = st
        if self.goaway_sent is not None and sid > self.goaway_sent:
            raise self._refuse("REFUSED_STREAM", sid, "after GOAWAY")
        if self._open_count() >= self.welcome["max_streams"]:
            raise self._refuse("REFUSED_STREAM", sid, "too many open streams")
        raw = f["key_raw"] if f["key"] is None else f["key"].encode("utf-8")
        why = key_problem(raw, self.welcome["max_key_length"])
        if why:
            raise self._refuse("INVALID_KEY", sid, why)
        st.state = "OPENING"
        st.reset_by_self = False

    def _relay_chunk(self, f):
        sid = f["stream"]
        deflated = bool(f["flags"] & FLAG_DEFLATED)
        if deflated and not self.deflate:
            raise _conn("PROTOCOL_ERROR", "DEFLATED chunk but deflate not negotiated")
        data = bytes.fromhex(f["data"])
        n = f["raw_length"] if deflated else len(data)
        if n > self.conn_window:
            raise _conn("FLOW_CONTROL_ERROR", "CHUNK exceeds the connection window")
        self.conn_window -= n
        if sid > self.highest:
            raise _conn("PROTOCOL_ERROR", f"CHUNK on stream {sid} never opened")
        st = self.streams.get(sid)
        if st is not None and st.state == "CLOSED" and not st.reset_by_self:
            raise _conn("STREAM_CLOSED", f"CHUNK on stream {sid} closed normally")
        if st is None or st.state == "CLOSED":
            self.conn_window += n  # discarded; the relay returns CREDIT(0, n) at once (§4.7)
            return
        if st.state in ("OPENING", "VERIFYING"):
            raise _conn("PROTOCOL_ERROR", f"CHUNK in {st.state}")
        if f["offset"] != st.offset:
            raise _strm("INVALID_OFFSET", sid, f"offset {f['offset']} != {st.offset}")
        if st.size_known and f["offset"] + n > st.length:
            raise _strm("SIZE_MISMATCH", sid, "beyond the stream's length")
        if n > st.window:
            raise _strm("FLOW_CONTROL_ERROR", sid, "CHUNK exceeds the stream window")
        st.window -= n
        if deflated:
            try:
                d = zlib.decompressobj()
                raw = d.decompress(data, n + 1)  # never inflate more than rawLength + 1 (§9)
                if len(raw) != n or not d.eof or d.unused_data or d.unconsumed_tail:
                    raise _strm("DECOMPRESSION_ERROR", sid, "bad zlib stream or wrong length")
            except zlib.error as e:
                raise _strm("DECOMPRESSION_ERROR", sid, str(e))
        else:
            raw = data
        if zlib.crc32(raw) != f["crc32"]:
            raise _strm("CRC_MISMATCH", sid, "crc32")
        st.offset += n
        if st.sha is not None:
            st.sha.update(raw)

    # agent side ---------------------------------------------------------
    def _recv_agent(self, f):
        t, sid = f["type"], f["stream"]
        if t == "ERROR" and sid == 0:
            self.conn = "CLOSED"  # in any state: close, no reply (§2.4)
            return
        if self.conn == "START":
            raise _conn("PROTOCOL_ERROR", f"{t} received before HELLO was sent")
        if self.conn == "HELLO_SENT":
            if t != "WELCOME":
                raise _conn("PROTOCOL_ERROR", f"first frame is {t}, not WELCOME")
            h = self.hello
            if not h["min_version"] <= f["version"] <= h["max_version"]:
                raise _conn("PROTOCOL_ERROR", "WELCOME version not offered")
            if f["features"] & ~h["features"]:
                raise _conn("PROTOCOL_ERROR", "WELCOME features not offered")
            self.welcome = f
            self.conn = "READY"
            self.conn_window = f["connection_window"]
            self.deflate = bool(f["features"] & FEATURE_DEFLATE)
            return
        if t == "EXTENSION" or t in ("PING", "PONG"):
            return
        if t == "WELCOME":
            raise _conn("PROTOCOL_ERROR", "second WELCOME")
        if t == "ROOM":
            if self.plan is None:
                raise _conn("PROTOCOL_ERROR", "ROOM with no PLAN unanswered")
            if f["request"] != self.plan["request"] or len(f["needs"]) != len(self.plan["entries"]):
                raise _conn("PROTOCOL_ERROR", "ROOM request or count is not the PLAN's")
            self.plan = None
            return
        if t == "GOAWAY":
            if self.goaway_received is not None and f["last_stream_id"] > self.goaway_received:
                raise _conn("PROTOCOL_ERROR", "GOAWAY last_stream_id increased")
            self.goaway_received = f["last_stream_id"]
            self.conn = "GOING_AWAY"
            for s in self.streams.values():
                if s.sid > f["last_stream_id"] and s.state != "CLOSED":
                    s.state = "CLOSED"
                    s.reset_by_self = True  # refused: later frames discarded
            return
        if sid == 0:  # CREDIT(0)
            if self.conn_window + f["increment"] > MAX_WINDOW:
                raise _conn("FLOW_CONTROL_ERROR", "connection window above 2^31-1")
            self.conn_window += f["increment"]
            return
        if sid > self.highest:
            raise _conn("PROTOCOL_ERROR", f"{t} on stream {sid} never opened")
        st = self.streams.get(sid)
        if st is None or st.state == "CLOSED":
            if st is None or st.reset_by_self:
                return  # discarded (§4.7)
            raise _conn("STREAM_CLOSED", f"{t} on stream {sid} closed normally")
        if t == "ERROR":
            st.state = "CLOSED"
            return
        if t == "OFFSET":
            if st.state != "OPENING":
                raise _conn("PROTOCOL_ERROR", f"OFFSET in {st.state}")
            d, off = f["disposition"], f["offset"]
            if d == "RESUME" and st.size_known and off > st.length:
                raise _conn("PROTOCOL_ERROR", "RESUME offset beyond the stream's length")
            if d == "STORED":
                stored = st.length if st.part is not None else st.size
                if st.size_known and off != stored:
                    raise _conn("PROTOCOL_ERROR", "STORED offset != OPEN size")
                st.state = "CLOSED"
                return
            if d == "CONFIRM":
                if not st.probe:
                    raise _conn("PROTOCOL_ERROR", "CONFIRM for an OPEN without PROBE")
                st.state = "CLOSED"
                return
            st.state = "SENDING"
            st.window = self.welcome["stream_window"]
            st.offset = off
            st.acked = off
            return
        if st.state == "OPENING":
            raise _conn("PROTOCOL_ERROR", f"{t} in OPENING")
        if t == "ACK":
            if f["offset"] > st.offset:
                raise _conn("PROTOCOL_ERROR", "ACK beyond bytes sent")
            if f["offset"] <= st.acked:
                raise _conn("PROTOCOL_ERROR", "ACK not increasing")
            st.acked = f["offset"]
        elif t == "CREDIT":
            if st.window + f["increment"] > MAX_WINDOW:
                raise _strm("FLOW_CONTROL_ERROR", sid, "stream window above 2^31-1")
            st.window += f["increment"]
        elif t == "RESULT":
            if st.state != "AWAITING_RESULT":
                raise _conn("PROTOCOL_ERROR", "RESULT before HASH")
            h = st.hash
            if f["size"] != h["size"] or f["sha1"] != h["sha1"] or f["key"] != st.key:
                raise _conn("PROTOCOL_ERROR", "RESULT does not match HASH/OPEN")
            st.state = "CLOSED"
        else:
            raise AssertionError(t)


def run_invalid_vector(vec: dict):
    """Replay an invalid vector; return the WireError raised by its input (or None)."""
    p = Peer(vec["receiver"])
    for step in vec["setup"]:
        if "send" in step:
            p.send(bytes.fromhex(step["send"]))
        else:
            data = bytes.fromhex(step["receive"])
            done = p.receive(data)
            assert len(done) == 1 and p.buf == b"", "setup receive must be exactly one frame"
    try:
        p.receive(bytes.fromhex(vec["input"]))
    except WireError as e:
        return e
    return None
