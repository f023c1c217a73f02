/// A key that obeys SPEC §12.2: the name an object is stored under.
///
/// Keys are relative paths of UTF-8 segments joined by "/". A relay maps a key to a file
/// under its store, so every rule here is what keeps a hostile name inside that directory.
public struct ObjectKey: Hashable, Sendable, CustomStringConvertible {
    /// The key, valid by construction.
    public let value: String

    /// Keys are equal when their bytes are (SPEC §12.2), not by Swift's canonical equivalence: "café" in NFC and in
    /// NFD are two keys.
    public static func == (lhs: ObjectKey, rhs: ObjectKey) -> Bool {
        lhs.value.utf8.elementsEqual(rhs.value.utf8)
    }

    public func hash(into hasher: inout Hasher) {
        for byte in self.value.utf8 { hasher.combine(byte) }
    }

    /// Why a key was refused.
    public struct Invalid: Error, Hashable, Sendable, CustomStringConvertible {
        /// The rule of SPEC §12.2 that the key breaks, in words.
        public var reason: String
        public var description: String { self.reason }
    }

    /// Checks `raw` against every rule of SPEC §12.2.
    public init(validating raw: [UInt8], maxLength: Int = 1024, maxSegmentLength: Int = 255) throws(Invalid) {
        guard !raw.isEmpty else {
            throw Invalid(reason: "key is empty")
        }
        guard raw.count <= maxLength else {
            throw Invalid(reason: "key is \(raw.count) bytes; the limit is \(maxLength)")
        }
        guard let string = String(validating: raw, as: UTF8.self) else {
            throw Invalid(reason: "key is not valid UTF-8")
        }
        for byte in raw {
            if byte < 0x20 || byte == 0x7F {
                throw Invalid(reason: "key contains the control byte 0x\(String(byte, radix: 16))")
            }
            if byte == UInt8(ascii: "\\") {
                throw Invalid(reason: "key contains a backslash")
            }
        }
        if raw.first == UInt8(ascii: "/") {
            throw Invalid(reason: "key is an absolute path (starts with \"/\")")
        }
        for segment in raw.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false) {
            if segment.isEmpty {
                throw Invalid(reason: "key has an empty segment (\"//\" or a trailing \"/\")")
            }
            if segment.elementsEqual([UInt8(ascii: ".")]) || segment.elementsEqual([UInt8(ascii: "."), UInt8(ascii: ".")]) {
                throw Invalid(reason: "key has a \".\" or \"..\" segment")
            }
            if segment.count > maxSegmentLength {
                throw Invalid(reason: "key has a segment of \(segment.count) bytes; the limit is \(maxSegmentLength)")
            }
        }
        self.value = string
    }

    /// Checks `string` against every rule of SPEC §12.2.
    public init(validating string: String, maxLength: Int = 1024, maxSegmentLength: Int = 255) throws(Invalid) {
        try self.init(validating: Array(string.utf8), maxLength: maxLength, maxSegmentLength: maxSegmentLength)
    }

    /// The key's segments, split on the byte "/" as the rules of SPEC §12.2 are checked (never on characters:
    /// "a/\u{301}x" is the two segments "a" and "\u{301}x", although "/\u{301}" is one `Character`).
    public var segments: [String] {
        self.value.utf8.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false).map { String(decoding: $0, as: UTF8.self) }
    }

    public var description: String { self.value }
}
