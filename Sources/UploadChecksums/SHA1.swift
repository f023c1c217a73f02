import CUploadCrypto

/// SHA-1 (FIPS 180-4) from the system's libcrypto, whose running state can be exported to
/// bytes and imported again: the relay persists it at every durable offset so a resumed
/// upload never re-reads its prefix (SPEC §6.3).
public struct SHA1: StreamingDigest, Sendable {
    private var context = SHA_CTX()
    /// Bytes hashed so far.
    public private(set) var byteCount: UInt64 = 0

    /// Bytes in a digest.
    public static let digestSize = 20

    public init() {
        SHA1_Init(&self.context)
    }

    /// Hashes `bytes`.
    public mutating func update(_ bytes: UnsafeRawBufferPointer) {
        guard bytes.count > 0 else { return }
        SHA1_Update(&self.context, bytes.baseAddress, bytes.count)
        self.byteCount += UInt64(bytes.count)
    }

    /// The digest of everything hashed so far. The value itself may go on hashing.
    public func finalize() -> [UInt8] {
        var copy = self.context
        var digest = [UInt8](repeating: 0, count: Self.digestSize)
        digest.withUnsafeMutableBufferPointer { _ = SHA1_Final($0.baseAddress, &copy) }
        return digest
    }

    // MARK: Exported state

    /// The version byte of ``exportState()``'s format.
    public static let stateFormatVersion: UInt8 = 1

    /// The running state as bytes:
    /// version (1) · h0…h4 (5 × u32 BE) · bytes hashed (u64 BE) · the partial block (bytes hashed mod 64 bytes).
    /// The format depends on SHA-1 alone, not on libcrypto, so any SHA-1 with an open state can read it.
    public func exportState() -> [UInt8] {
        var out: [UInt8] = [Self.stateFormatVersion]
        out.reserveCapacity(1 + 20 + 8 + 64)
        for word in [self.context.h0, self.context.h1, self.context.h2, self.context.h3, self.context.h4] {
            out.append(contentsOf: Self.bigEndianBytes(UInt32(word)))
        }
        out.append(contentsOf: Self.bigEndianBytes(UInt32(truncatingIfNeeded: self.byteCount >> 32)))
        out.append(contentsOf: Self.bigEndianBytes(UInt32(truncatingIfNeeded: self.byteCount)))
        let partial = Int(self.byteCount % 64)
        var data = self.context.data
        withUnsafeBytes(of: &data) { out.append(contentsOf: $0.prefix(partial)) }
        return out
    }

    /// Why exported state could not be imported.
    public struct StateError: Error, Hashable, Sendable, CustomStringConvertible {
        public var description: String
    }

    /// Continues a hash from ``exportState()``'s bytes.
    public init(importing state: [UInt8]) throws {
        guard state.count >= 29, state[0] == Self.stateFormatVersion else {
            throw StateError(description: "SHA-1 state is not in format \(Self.stateFormatVersion) (\(state.count) bytes)")
        }
        func word(_ at: Int) -> UInt32 {
            state[at..<at + 4].reduce(0) { $0 << 8 | UInt32($1) }
        }
        let count = UInt64(word(21)) << 32 | UInt64(word(25))
        let partial = Int(count % 64)
        guard state.count == 29 + partial, count < UInt64(1) << 61 else {
            throw StateError(description: "SHA-1 state of \(state.count) bytes does not hold the \(partial) bytes of its partial block")
        }
        self.init()
        self.context.h0 = word(1)
        self.context.h1 = word(5)
        self.context.h2 = word(9)
        self.context.h3 = word(13)
        self.context.h4 = word(17)
        let bits = count &* 8
        self.context.Nl = UInt32(truncatingIfNeeded: bits)
        self.context.Nh = UInt32(truncatingIfNeeded: bits >> 32)
        self.context.num = UInt32(partial)
        withUnsafeMutableBytes(of: &self.context.data) { block in
            for i in 0..<partial {
                block[i] = state[29 + i]
            }
        }
        self.byteCount = count
    }

    private static func bigEndianBytes(_ value: UInt32) -> [UInt8] {
        [UInt8(value >> 24), UInt8(truncatingIfNeeded: value >> 16), UInt8(truncatingIfNeeded: value >> 8), UInt8(truncatingIfNeeded: value)]
    }
}
