import NIOCore
import UploadChecksums
import UploadProtocol

/// Turns a received CHUNK into the raw bytes it stands for, or the stream error it deserves (SPEC §8.1, §9).
public enum ChunkVerifier {
    /// The chunk's raw bytes: inflated when deflated, and checked against the chunk's CRC32.
    /// Raw chunks are returned as they are (no copy).
    public static func rawBytes(
        of chunk: Frame.Chunk, allocator: ByteBufferAllocator = ByteBufferAllocator()
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
                return .failure(
                    .stream(chunk.streamID, .decompressionError, "chunk at offset \(chunk.offset): \(error)")
                )
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

    static func hex(_ value: UInt32) -> String {
        let digits = String(value, radix: 16)
        return "0x" + String(repeating: "0", count: 8 - digits.count) + digits
    }
}
