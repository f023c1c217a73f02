/// The 20 bytes of a SHA-1 digest as they travel in OPEN, HASH and RESULT.
public struct SHA1Digest: Hashable, Sendable, CustomStringConvertible {
    /// Always 20 bytes.
    public let bytes: [UInt8]

    /// Bytes in a digest.
    public static let size = 20

    /// The digest of zero bytes: da39a3ee5e6b4b0d3255bfef95601890afd80709.
    public static let empty = SHA1Digest(hex: "da39a3ee5e6b4b0d3255bfef95601890afd80709")!

    /// Nil unless `bytes` holds exactly 20 bytes.
    public init?<Bytes: Collection>(bytes: Bytes) where Bytes.Element == UInt8 {
        guard bytes.count == Self.size else { return nil }
        self.bytes = Array(bytes)
    }

    /// Nil unless `hex` is 40 hexadecimal digits.
    public init?(hex: String) {
        guard let bytes = [UInt8](hexString: hex) else { return nil }
        self.init(bytes: bytes)
    }

    /// Lowercase hexadecimal, as `sha1sum` prints it.
    public var hex: String { self.bytes.hexString }

    public var description: String { self.hex }
}

extension Array where Element == UInt8 {
    /// Parses hexadecimal digits (either case, whitespace ignored); nil on anything else or an odd count.
    public init?(hexString: String) {
        var result: [UInt8] = []
        result.reserveCapacity(hexString.utf8.count / 2)
        var high: UInt8? = nil
        for c in hexString.utf8 {
            let value: UInt8
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): value = c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): value = c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): value = c - UInt8(ascii: "A") + 10
            case UInt8(ascii: " "), UInt8(ascii: "\n"), UInt8(ascii: "\t"), UInt8(ascii: "\r"): continue
            default: return nil
            }
            if let h = high {
                result.append(h << 4 | value)
                high = nil
            } else {
                high = value
            }
        }
        guard high == nil else { return nil }
        self = result
    }

    /// Lowercase hexadecimal.
    public var hexString: String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(self.count * 2)
        for b in self {
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}
