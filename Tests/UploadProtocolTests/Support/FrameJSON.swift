import NIOCore
import UploadProtocol

/// The decoded form of a frame as protocol/vectors/ writes it: every field as a string, so a
/// frame decoded by the Swift codec compares with the JSON written from the spec.
enum FrameJSON {
    static func hex(_ buffer: ByteBuffer) -> String { Array(buffer.readableBytesView).hexString }

    static func fields(_ frame: Frame, flags: UInt8) -> [String: String] {
        var f: [String: String] = ["type": frame.type.name, "stream": "\(frame.streamID.rawValue)", "flags": "\(flags)"]
        switch frame {
        case .hello(let h):
            f["magic"] = "UPLD"
            f["min_version"] = "\(h.minVersion)"
            f["max_version"] = "\(h.maxVersion)"
            f["max_frame_size"] = "\(h.maxFrameSize)"
            f["features"] = "\(h.features.rawValue)"
            f["auth_method"] = "\(h.authMethod.rawValue)"
            f["credential"] = h.credential.hexString
            f["agent_name"] = h.agentName
        case .welcome(let w):
            f["version"] = "\(w.version)"
            f["max_frame_size"] = "\(w.maxFrameSize)"
            f["features"] = "\(w.features.rawValue)"
            f["max_streams"] = "\(w.maxStreams)"
            f["connection_window"] = "\(w.connectionWindow)"
            f["stream_window"] = "\(w.streamWindow)"
            f["max_key_length"] = "\(w.maxKeyLength)"
            f["idle_timeout_millis"] = "\(w.idleTimeoutMillis)"
            f["account"] = w.account
        case .open(let o):
            f["key"] = o.key ?? "<invalid UTF-8>"
            f["size"] = "\(o.size ?? 0)"
            f["sha1"] = o.sha1?.hex ?? o.probe?.hex ?? String(repeating: "0", count: 40)
            f["fingerprint"] = o.fingerprint.hexString
            f["resume_token"] = o.resumeToken.hexString
            if let part = o.part { f["part"] = "\(part)" }
        case .offset(let o):
            f["disposition"] = ["START", "RESUME", "STORED", "CONFIRM"][Int(o.disposition.rawValue)]
            f["offset"] = "\(o.offset)"
            f["resume_token"] = o.resumeToken.hexString
        case .chunk(let c):
            f["offset"] = "\(c.offset)"
            f["crc32"] = "\(c.crc32)"
            if let raw = c.rawLength { f["raw_length"] = "\(raw)" }
            f["data"] = hex(c.data)
        case .ack(let a):
            f["offset"] = "\(a.offset)"
        case .credit(let c):
            f["increment"] = "\(c.increment)"
        case .hash(let h):
            f["size"] = "\(h.size)"
            f["sha1"] = h.sha1.hex
        case .result(let r):
            f["status"] = r.status == .stored ? "STORED" : "UNCHANGED"
            f["size"] = "\(r.size)"
            f["sha1"] = r.sha1.hex
            f["key"] = r.key
        case .error(let e):
            f["code"] = Self.code(e.code)
            f["message"] = e.message
        case .cancel(let c):
            f["code"] = Self.code(c.code)
            f["message"] = c.message
        case .ping(let p):
            f["data"] = Self.hex(ByteBuffer(integer: p.data))
        case .pong(let p):
            f["data"] = Self.hex(ByteBuffer(integer: p.data))
        case .goAway(let g):
            f["last_stream_id"] = "\(g.lastStreamID.rawValue)"
            f["code"] = Self.code(g.code)
            f["message"] = g.message
        case .plan(let p):
            f["request"] = "\(p.request)"
            f["entries"] = Self.list(
                p.entries.map { entry in
                    String(validating: entry.rawKey, as: UTF8.self).map { ["key": $0, "size": entry.size] }
                        ?? ["key_hex": entry.rawKey.hexString, "size": entry.size]
                })
        case .room(let r):
            f["request"] = "\(r.request)"
            f["quota"] = r.quota.map { "\($0)" } ?? "none"
            f["used"] = "\(r.used)"
            f["needs"] = Self.list(r.needs)
        case .extension(let e):
            f["extension_type"] = "\(e.type.rawValue)"
            f["data"] = hex(e.data)
        }
        return f
    }

    /// Defined codes by name, others by number (SPEC appendix A).
    static func code(_ code: WireErrorCode) -> String {
        code.isDefined ? code.name : "\(code.rawValue)"
    }

    /// A list in one string: each element as ``stringify(_:)`` turns a value, objects as their fields sorted by name.
    static func list(_ values: [Any]) -> String {
        values.map { value -> String in
            if let object = value as? [String: Any] {
                return Self.stringify(object).sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ",")
            }
            return Self.stringify(["v": value])["v"]!
        }.joined(separator: "; ")
    }

    /// A JSON object (from JSONSerialization) with every value turned into a string.
    static func stringify(_ object: [String: Any]) -> [String: String] {
        var out: [String: String] = [:]
        for (key, value) in object {
            switch value {
            case let s as String: out[key] = s
            case let n as Int: out[key] = "\(n)"
            case let n as UInt64: out[key] = "\(n)"
            case let n as Double: out[key] = "\(UInt64(n))"
            case let list as [Any]: out[key] = Self.list(list)
            default: out[key] = "\(value)"
            }
        }
        return out
    }
}
