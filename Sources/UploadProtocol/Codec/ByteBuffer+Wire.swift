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
