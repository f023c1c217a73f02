/// A hash fed in pieces from the system's libcrypto (``SHA1``, ``SHA256``): what each adds is its raw-buffer update and
/// its digest; sequences of bytes and one-shot digests are the same for both.
public protocol StreamingDigest {
    init()
    /// Hashes `bytes`.
    mutating func update(_ bytes: UnsafeRawBufferPointer)
    /// The digest of everything hashed so far. The value itself may go on hashing.
    func finalize() -> [UInt8]
}

extension StreamingDigest {
    /// Hashes `bytes`.
    public mutating func update<Bytes: Sequence>(_ bytes: Bytes) where Bytes.Element == UInt8 {
        let done: Void? = bytes.withContiguousStorageIfAvailable { self.update(UnsafeRawBufferPointer($0)) }
        if done == nil {
            Array(bytes).withUnsafeBytes { self.update($0) }
        }
    }

    /// One-shot digest of `bytes`.
    public static func hash<Bytes: Sequence>(_ bytes: Bytes) -> [UInt8] where Bytes.Element == UInt8 {
        var digest = Self()
        digest.update(bytes)
        return digest.finalize()
    }
}
