/// The number of a stream on one connection (SPEC §1.4).
///
/// Stream 0 is the connection itself. The agent chooses the id of every stream it opens,
/// each greater than the last; the top bit is reserved and always zero on the wire.
public struct StreamID: RawRepresentable, Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The wire value, 0 through 2^31-1.
    public let rawValue: UInt32

    /// The largest id a stream may have: the top bit is reserved.
    public static let maxID = StreamID(UInt32(Int32.max))

    /// The connection itself (stream 0): HELLO, WELCOME, PING, PONG, GOAWAY and connection-level ERROR and CREDIT.
    public static let connection = StreamID(0)

    public init(rawValue: UInt32) {
        precondition(rawValue <= UInt32(Int32.max), "stream id \(rawValue) has the reserved top bit set")
        self.rawValue = rawValue
    }

    public init(_ value: UInt32) {
        self.init(rawValue: value)
    }

    /// Whether this is stream 0.
    public var isConnection: Bool { self.rawValue == 0 }

    public static func < (lhs: StreamID, rhs: StreamID) -> Bool { lhs.rawValue < rhs.rawValue }

    public var description: String { String(self.rawValue) }
}

extension StreamID: ExpressibleByIntegerLiteral {
    public init(integerLiteral value: UInt32) {
        self.init(rawValue: value)
    }
}
