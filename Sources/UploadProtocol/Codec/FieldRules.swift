/// Value rules, judged only once the whole payload has been read (SPEC §1.9: layout first, then values).
enum FieldRules {
    /// A u64 size or offset, at most 2^62 (SPEC §1.1).
    static func size(_ value: UInt64, _ field: StaticString, of type: FrameType) throws -> UInt64 {
        guard value <= ProtocolLimits.maxBlobSize else {
            throw ProtocolError.connection(.protocolError, "\(type.name) \(field) \(value) is above 2^62")
        }
        return value
    }

    static func length(_ bytes: [UInt8], max: Int, _ field: StaticString, of type: FrameType) throws -> [UInt8] {
        guard bytes.count <= max else {
            throw ProtocolError.connection(.protocolError, "\(type.name) \(field) is \(bytes.count) bytes; the limit is \(max)")
        }
        return bytes
    }

    /// A str16 that must be valid UTF-8 (SPEC §1.1).
    static func string(_ bytes: [UInt8], max: Int, _ field: StaticString, of type: FrameType) throws -> String {
        let bytes = try Self.length(bytes, max: max, field, of: type)
        guard let string = String(validating: bytes, as: UTF8.self) else {
            throw ProtocolError.connection(.protocolError, "\(type.name) \(field) is not valid UTF-8")
        }
        return string
    }

    /// A display string (SPEC §1.1): valid UTF-8 with no control character a log or terminal would act on.
    static func display(_ bytes: [UInt8], max: Int, _ field: StaticString, of type: FrameType) throws -> String {
        let string = try Self.string(bytes, max: max, field, of: type)
        guard !Printable.hasControl(string) else {
            throw ProtocolError.connection(.protocolError, "\(type.name) \(field) holds a control character")
        }
        return string
    }
}
