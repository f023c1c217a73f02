import NIOCore
import UploadChecksums
import UploadProtocol

/// A CHUNK's payload, sealed by the agent and opened by the relay (SPEC §8.1, §9): the CRC-32 of the raw bytes, and
/// per-chunk zlib kept only when it makes the chunk smaller. One type below both roles, so what one side makes is
/// what the other checks.
public enum ChunkPayload {
    /// A CHUNK carrying `raw` at `offset` of stream `streamID`, deflated when asked and when that shrinks it.
    public static func seal(
        _ raw: ByteBuffer, streamID: StreamID, offset: UInt64, deflate: Bool,
        allocator: ByteBufferAllocator = ByteBufferAllocator()
    ) -> Frame.Chunk {
        let crc = raw.withUnsafeReadableBytes { CRC32.checksum($0) }
        let chunk = Frame.Chunk(streamID: streamID, offset: offset, crc32: crc, data: raw)
        return deflate ? Self.deflated(chunk, allocator: allocator) : chunk
    }

    /// The chunk's raw bytes: inflated when deflated, and checked against the chunk's CRC-32; or the stream error
    /// the chunk deserves. Raw chunks are returned as they are (no copy).
    public static func open(
        _ chunk: Frame.Chunk, allocator: ByteBufferAllocator = ByteBufferAllocator()
    ) -> Result<ByteBuffer, ProtocolError> {
        var raw = chunk.data
        if let rawLength = chunk.rawLength {
            var inflated = allocator.buffer(capacity: Int(rawLength))
            do {
                try inflated.writeWithUnsafeMutableBytes(minimumWritableBytes: Int(rawLength)) { out in
                    try chunk.data.withUnsafeReadableBytes { input in
                        try Deflate.inflate(input, into: UnsafeMutableRawBufferPointer(rebasing: out.prefix(Int(rawLength))))
                    }
                    return Int(rawLength)
                }
            } catch {
                return .failure(.stream(chunk.streamID, .decompressionError, "chunk at offset \(chunk.offset): \(error)"))
            }
            raw = inflated
        }
        let crc = raw.withUnsafeReadableBytes { CRC32.checksum($0) }
        guard crc == chunk.crc32 else {
            return .failure(
                .stream(
                    chunk.streamID, .crcMismatch,
                    "chunk at offset \(chunk.offset): CRC32 of its \(raw.readableBytes) bytes is \(Self.hex(crc)), the chunk says \(Self.hex(chunk.crc32))"
                )
            )
        }
        return .success(raw)
    }

    /// Per-chunk zlib (SPEC §9), kept only when it shrinks the chunk.
    static func deflated(_ chunk: Frame.Chunk, allocator: ByteBufferAllocator) -> Frame.Chunk {
        let rawLength = chunk.data.readableBytes
        var packed = allocator.buffer(capacity: Deflate.bound(rawLength))
        let length = packed.writeWithUnsafeMutableBytes(minimumWritableBytes: Deflate.bound(rawLength)) { out in
            chunk.data.withUnsafeReadableBytes { Deflate.compress($0, into: out) } ?? 0
        }
        guard length > 0 else { return chunk }
        var result = chunk
        result.rawLength = UInt32(rawLength)
        result.data = packed
        return result
    }

    static func hex(_ value: UInt32) -> String {
        let digits = String(value, radix: 16)
        return "0x" + String(repeating: "0", count: 8 - digits.count) + digits
    }
}
