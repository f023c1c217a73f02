import NIOCore

// Field encodings of SPEC §3.0: big-endian integers, str16, bytes16, bytes8 and sha1.
// Readers throw FRAME_SIZE_ERROR when the payload ends inside a field: the frame's length
// is already known, so a short payload is malformed, never "need more bytes".

extension ByteBuffer {
    @inlinable
    mutating func readField<T: FixedWidthInteger>(_: T.Type, _ field: StaticString, of type: FrameType) throws -> T {
        guard let value = self.readInteger(as: T.self) else {
            throw ProtocolError.connection(.frameSizeError, "\(type.name) payload ends inside \(field)")
        }
        return value
    }

    mutating func readBytes(lengthPrefix: Int, _ field: StaticString, of type: FrameType) throws -> [UInt8] {
        let length: Int
        if lengthPrefix == 1 {
            length = Int(try self.readField(UInt8.self, field, of: type))
        } else {
            length = Int(try self.readField(UInt16.self, field, of: type))
        }
        guard let bytes = self.readBytes(length: length) else {
            throw ProtocolError.connection(.frameSizeError, "\(type.name) payload ends inside \(field)")
        }
        return bytes
    }

    mutating func readDigestBytes(_ field: StaticString, of type: FrameType) throws -> [UInt8] {
        guard let bytes = self.readBytes(length: SHA1Digest.size) else {
            throw ProtocolError.connection(.frameSizeError, "\(type.name) payload ends inside \(field)")
        }
        return bytes
    }

    @discardableResult
    mutating func writeString16(_ string: String) -> Int {
        let count = string.utf8.count
        precondition(count <= Int(UInt16.max), "string of \(count) bytes does not fit a str16")
        return self.writeInteger(UInt16(count)) + self.writeString(string)
    }

    @discardableResult
    mutating func writeBytes16(_ bytes: [UInt8]) -> Int {
        precondition(bytes.count <= Int(UInt16.max), "\(bytes.count) bytes do not fit a bytes16")
        return self.writeInteger(UInt16(bytes.count)) + self.writeBytes(bytes)
    }

    @discardableResult
    mutating func writeBytes8(_ bytes: [UInt8]) -> Int {
        precondition(bytes.count <= Int(UInt8.max), "\(bytes.count) bytes do not fit a bytes8")
        return self.writeInteger(UInt8(bytes.count)) + self.writeBytes(bytes)
    }
}

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
}
