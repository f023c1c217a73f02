import CUploadCrypto

/// SHA-256 from the system's libcrypto: S3's payload hashes and request signatures, and the digests of tokens.
public struct SHA256: StreamingDigest, Sendable {
    private var context = SHA256_CTX()

    /// Bytes in a digest.
    public static let digestSize = 32

    public init() {
        SHA256_Init(&self.context)
    }

    /// Hashes `bytes`.
    public mutating func update(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count > 0 else { return }
        SHA256_Update(&self.context, bytes.baseAddress, bytes.count)
    }

    /// The digest of everything hashed so far. The value itself may go on hashing.
    public func finalize() -> [UInt8] {
        var copy = self.context
        var digest = [UInt8](repeating: 0, count: Self.digestSize)
        digest.withUnsafeMutableBufferPointer { _ = SHA256_Final($0.baseAddress, &copy) }
        return digest
    }
}

/// HMAC-SHA-256 (RFC 2104) from the system's libcrypto: AWS SigV4's signing keys and signatures.
public enum HMACSHA256 {
    /// The 32-byte authentication code of `message` under `key`.
    public static func authenticationCode(for message: [UInt8], key: [UInt8]) -> [UInt8] {
        var code = [UInt8](repeating: 0, count: SHA256.digestSize)
        var length: UInt32 = 0
        // Never a null pointer, even for no bytes: a null key means "the previous key" to some of libcrypto's calls.
        let keyBytes = key.isEmpty ? [UInt8(0)] : key
        let messageBytes = message.isEmpty ? [UInt8(0)] : message
        keyBytes.withUnsafeBytes { keyPointer in
            messageBytes.withUnsafeBytes { messagePointer in
                code.withUnsafeMutableBufferPointer { out in
                    _ = HMAC(
                        EVP_sha256(), keyPointer.baseAddress, Int32(key.count), messagePointer.baseAddress?.assumingMemoryBound(to: UInt8.self),
                        message.count, out.baseAddress, &length
                    )
                }
            }
        }
        return code
    }
}
