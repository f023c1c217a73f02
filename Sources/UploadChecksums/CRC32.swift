import CUploadDeflate

/// CRC-32 as zlib computes it (reflected polynomial 0xEDB88320): the checksum of every CHUNK (SPEC §8.1). Computed by
/// libdeflate when it is installed (it folds with the CPU's carry-less multiply where there is one), else by zlib.
public struct CRC32: Hashable, Sendable {
    /// The checksum of everything added so far.
    public private(set) var value: UInt32 = 0

    public init() {}

    /// Adds `bytes`.
    public mutating func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        self.value = upload_crc32(self.value, base, bytes.count)
    }

    /// Adds `bytes`.
    public mutating func update<Bytes: Sequence>(_ bytes: Bytes) where Bytes.Element == UInt8 {
        let done: Void? = bytes.withContiguousStorageIfAvailable { self.update(UnsafeRawBufferPointer($0)) }
        if done == nil {
            Array(bytes).withUnsafeBytes { self.update($0) }
        }
    }

    /// The checksum of `bytes`.
    public static func checksum(_ bytes: UnsafeRawBufferPointer) -> UInt32 {
        var crc = CRC32()
        crc.update(bytes)
        return crc.value
    }

    /// The checksum of `bytes`.
    public static func checksum<Bytes: Sequence>(_ bytes: Bytes) -> UInt32 where Bytes.Element == UInt8 {
        var crc = CRC32()
        crc.update(bytes)
        return crc.value
    }
}
