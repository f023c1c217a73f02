import NIOCore

/// Writes frames (SPEC §1, §3).
///
/// CHUNK and extension frames are written as header and fields only; their data is returned
/// for the caller to write next, as its own buffer, so payload bytes are never copied.
public enum FrameEncoder {
    /// Writes `frame` into `buffer` and returns the payload bytes that must follow it on the wire
    /// (CHUNK and extension data), or nil when the frame is complete in `buffer`.
    @discardableResult
    public static func encode(_ frame: Frame, into buffer: inout ByteBuffer) -> ByteBuffer? {
        switch frame {
        case .chunk(let chunk):
            let fields = Frame.Chunk.fieldsSize(deflated: chunk.isDeflated)
            Self.writeHeader(
                into: &buffer, length: FrameHeader.size + fields + chunk.data.readableBytes, type: .chunk,
                flags: chunk.isDeflated ? Frame.Chunk.deflatedFlag : 0, stream: chunk.streamID
            )
            buffer.writeMultipleIntegers(chunk.offset, chunk.crc32)
            if let raw = chunk.rawLength {
                buffer.writeInteger(raw)
            }
            return chunk.data
        case .extension(let ext):
            Self.writeHeader(
                into: &buffer, length: FrameHeader.size + ext.data.readableBytes, type: ext.type, flags: ext.flags,
                stream: ext.streamID
            )
            return ext.data
        default:
            Self.encodeControl(frame, into: &buffer)
            return nil
        }
    }

    /// The whole frame in one buffer, data copied in: for tests, vectors and small frames.
    public static func encodeToBuffer(_ frame: Frame, allocator: ByteBufferAllocator = ByteBufferAllocator()) -> ByteBuffer {
        var buffer = allocator.buffer(capacity: 64)
        if var data = Self.encode(frame, into: &buffer) {
            buffer.writeBuffer(&data)
        }
        return buffer
    }

    private static func writeHeader(into buffer: inout ByteBuffer, length: Int, type: FrameType, flags: UInt8, stream: StreamID) {
        precondition(length <= Int(UInt32.max), "frame of \(length) bytes is too long to encode")
        buffer.writeMultipleIntegers(UInt32(length), type.rawValue, flags, stream.rawValue)
    }

    /// Frames whose payload is all fields: written after a header whose length is patched in at the end.
    private static func encodeControl(_ frame: Frame, into buffer: inout ByteBuffer) {
        let start = buffer.writerIndex
        var flags: UInt8 = 0
        if case .open(let open) = frame {
            flags = open.flags
        } else if case .plan(let plan) = frame, plan.overwrite {
            flags = Frame.Plan.overwriteFlag
        }
        Self.writeHeader(into: &buffer, length: 0, type: frame.type, flags: flags, stream: frame.streamID)
        switch frame {
        case .hello(let f):
            buffer.writeBytes(Frame.magic)
            buffer.writeMultipleIntegers(f.minVersion, f.maxVersion, f.maxFrameSize, f.features.rawValue, f.authMethod.rawValue)
            buffer.writeBytes16(f.credential)
            buffer.writeString16(f.agentName)
        case .welcome(let f):
            buffer.writeMultipleIntegers(
                f.version, f.maxFrameSize, f.features.rawValue, f.maxStreams, f.connectionWindow, f.streamWindow,
                f.maxKeyLength, f.idleTimeoutMillis
            )
            buffer.writeString16(f.account)
        case .open(let f):
            buffer.writeBytes16(f.rawKey)
            buffer.writeInteger(f.size ?? 0)
            buffer.writeBytes(f.sha1?.bytes ?? f.probe?.bytes ?? Self.zeroDigest)
            buffer.writeBytes8(f.fingerprint)
            buffer.writeBytes8(f.resumeToken)
            if let part = f.part { buffer.writeInteger(part) }
        case .offset(let f):
            buffer.writeMultipleIntegers(f.disposition.rawValue, f.offset)
            buffer.writeBytes8(f.resumeToken)
        case .ack(let f):
            buffer.writeInteger(f.offset)
        case .credit(let f):
            buffer.writeInteger(f.increment)
        case .hash(let f):
            buffer.writeInteger(f.size)
            buffer.writeBytes(f.sha1.bytes)
        case .result(let f):
            buffer.writeMultipleIntegers(f.status.rawValue, f.size)
            buffer.writeBytes(f.sha1.bytes)
            buffer.writeString16(f.key)
        case .error(let f):
            buffer.writeInteger(f.code.rawValue)
            buffer.writeString16(f.message)
        case .cancel(let f):
            buffer.writeInteger(f.code.rawValue)
            buffer.writeString16(f.message)
        case .ping(let f):
            buffer.writeInteger(f.data)
        case .pong(let f):
            buffer.writeInteger(f.data)
        case .goAway(let f):
            buffer.writeMultipleIntegers(f.lastStreamID.rawValue, f.code.rawValue)
            buffer.writeString16(f.message)
        case .plan(let f):
            buffer.writeMultipleIntegers(f.request, UInt16(truncatingIfNeeded: f.entries.count))
            for entry in f.entries {
                buffer.writeBytes16(entry.rawKey)
                buffer.writeInteger(entry.size)
            }
        case .room(let f):
            buffer.writeMultipleIntegers(f.request, f.quota ?? Frame.Room.noQuota, f.used, UInt16(truncatingIfNeeded: f.needs.count))
            for need in f.needs { buffer.writeInteger(need) }
        case .chunk, .extension:
            preconditionFailure("frames with data are written by encode(_:into:)")
        }
        buffer.setInteger(UInt32(buffer.writerIndex - start), at: start)
    }

    private static let zeroDigest = [UInt8](repeating: 0, count: SHA1Digest.size)
}

extension Frame {
    /// This frame as bytes, data included (copies CHUNK data: for tests and vectors).
    public func encoded() -> ByteBuffer {
        FrameEncoder.encodeToBuffer(self)
    }
}
