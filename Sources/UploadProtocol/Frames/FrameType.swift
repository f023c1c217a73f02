/// The type byte of a frame header (SPEC §1.5).
public struct FrameType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let hello = FrameType(rawValue: 0x01)
    public static let welcome = FrameType(rawValue: 0x02)
    public static let open = FrameType(rawValue: 0x03)
    public static let offset = FrameType(rawValue: 0x04)
    public static let chunk = FrameType(rawValue: 0x05)
    public static let ack = FrameType(rawValue: 0x06)
    public static let credit = FrameType(rawValue: 0x07)
    public static let hash = FrameType(rawValue: 0x08)
    public static let result = FrameType(rawValue: 0x09)
    public static let error = FrameType(rawValue: 0x0A)
    public static let cancel = FrameType(rawValue: 0x0B)
    public static let ping = FrameType(rawValue: 0x0C)
    public static let pong = FrameType(rawValue: 0x0D)
    public static let goAway = FrameType(rawValue: 0x0E)
    public static let plan = FrameType(rawValue: 0x0F)
    public static let room = FrameType(rawValue: 0x10)

    /// Types from 0x80 up are extensions: a receiver that does not know one skips it (SPEC §1.5).
    public var isExtension: Bool { self.rawValue >= 0x80 }

    private static let names = [
        "HELLO", "WELCOME", "OPEN", "OFFSET", "CHUNK", "ACK", "CREDIT", "HASH", "RESULT", "ERROR", "CANCEL",
        "PING", "PONG", "GOAWAY", "PLAN", "ROOM",
    ]

    /// The name SPEC §3 gives the type.
    public var name: String {
        if self.rawValue >= 1 && Int(self.rawValue) <= Self.names.count {
            return Self.names[Int(self.rawValue) - 1]
        }
        return self.isExtension ? "EXTENSION" : "UNKNOWN"
    }

    public var description: String { "\(self.name)(0x\(String(self.rawValue, radix: 16)))" }
}
