/// An error code as carried by ERROR, CANCEL and GOAWAY frames (SPEC §11).
///
/// Wire codes are their own type, separate from Swift errors: a ``ProtocolError`` carries one,
/// together with its scope and a message for people.
public struct WireErrorCode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt16

    public init(rawValue: UInt16) {
        self.rawValue = rawValue
    }

    /// Graceful: used by GOAWAY when nothing went wrong.
    public static let noError = WireErrorCode(rawValue: 0x0000)
    /// A frame illegal in this state, or a field with an illegal value.
    public static let protocolError = WireErrorCode(rawValue: 0x0001)
    /// A frame length out of bounds, or a payload that does not match its layout.
    public static let frameSizeError = WireErrorCode(rawValue: 0x0002)
    /// No protocol version in common.
    public static let unsupportedVersion = WireErrorCode(rawValue: 0x0003)
    /// Unknown or revoked token, or an authentication method the relay does not support.
    public static let unauthenticated = WireErrorCode(rawValue: 0x0004)
    /// A credit window was overrun or would overflow.
    public static let flowControlError = WireErrorCode(rawValue: 0x0005)
    /// A frame on a stream that was closed normally.
    public static let streamClosed = WireErrorCode(rawValue: 0x0006)
    /// Too many streams, or a stream opened after GOAWAY: safe to retry.
    public static let refusedStream = WireErrorCode(rawValue: 0x0007)
    /// The key breaks the rules of SPEC §12.2.
    public static let invalidKey = WireErrorCode(rawValue: 0x0008)
    /// A chunk that does not start at the next expected offset.
    public static let invalidOffset = WireErrorCode(rawValue: 0x0009)
    /// A chunk whose CRC32 does not match its bytes.
    public static let crcMismatch = WireErrorCode(rawValue: 0x000A)
    /// The SHA-1 of the blob is not the one announced.
    public static let hashMismatch = WireErrorCode(rawValue: 0x000B)
    /// More or fewer bytes than the announced size.
    public static let sizeMismatch = WireErrorCode(rawValue: 0x000C)
    /// The account's quota would be exceeded.
    public static let quotaExceeded = WireErrorCode(rawValue: 0x000D)
    /// The key holds other content and the agent did not ask to overwrite.
    public static let alreadyExists = WireErrorCode(rawValue: 0x000E)
    /// Another upload of this key is in progress.
    public static let keyBusy = WireErrorCode(rawValue: 0x000F)
    /// The relay could not store the bytes (disk full, I/O error).
    public static let storageError = WireErrorCode(rawValue: 0x0010)
    /// A deflated chunk that does not inflate to its raw length.
    public static let decompressionError = WireErrorCode(rawValue: 0x0011)
    /// The upload was abandoned.
    public static let cancelled = WireErrorCode(rawValue: 0x0012)
    /// A handshake or idle timeout expired.
    public static let timeout = WireErrorCode(rawValue: 0x0013)
    /// The peer floods (pings, opens, resets).
    public static let enhanceYourCalm = WireErrorCode(rawValue: 0x0014)
    /// A bug or an unexpected failure.
    public static let internalError = WireErrorCode(rawValue: 0x0015)
    /// The blob is larger than the relay accepts.
    public static let tooLarge = WireErrorCode(rawValue: 0x0016)

    /// Every code this version defines, in wire order.
    public static let allDefined: [WireErrorCode] = [
        .noError, .protocolError, .frameSizeError, .unsupportedVersion, .unauthenticated,
        .flowControlError, .streamClosed, .refusedStream, .invalidKey, .invalidOffset,
        .crcMismatch, .hashMismatch, .sizeMismatch, .quotaExceeded, .alreadyExists, .keyBusy,
        .storageError, .decompressionError, .cancelled, .timeout, .enhanceYourCalm,
        .internalError, .tooLarge,
    ]

    private static let names: [String] = [
        "NO_ERROR", "PROTOCOL_ERROR", "FRAME_SIZE_ERROR", "UNSUPPORTED_VERSION", "UNAUTHENTICATED",
        "FLOW_CONTROL_ERROR", "STREAM_CLOSED", "REFUSED_STREAM", "INVALID_KEY", "INVALID_OFFSET",
        "CRC_MISMATCH", "HASH_MISMATCH", "SIZE_MISMATCH", "QUOTA_EXCEEDED", "ALREADY_EXISTS", "KEY_BUSY",
        "STORAGE_ERROR", "DECOMPRESSION_ERROR", "CANCELLED", "TIMEOUT", "ENHANCE_YOUR_CALM",
        "INTERNAL_ERROR", "TOO_LARGE",
    ]

    /// The name SPEC §11 gives this code, such as `CRC_MISMATCH`; unknown codes read `UNKNOWN_0x002A`.
    public var name: String {
        if Int(self.rawValue) < Self.names.count {
            return Self.names[Int(self.rawValue)]
        }
        let hex = String(self.rawValue, radix: 16)
        return "UNKNOWN_0x" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
    }

    /// The code SPEC §11 calls `name`, or nil when there is none.
    public init?(name: String) {
        guard let index = Self.names.firstIndex(of: name) else { return nil }
        self.init(rawValue: UInt16(index))
    }

    /// Whether this version of the protocol defines the code. Unknown codes act as `INTERNAL_ERROR`.
    public var isDefined: Bool { Int(self.rawValue) < Self.names.count }

    /// Whether an agent may retry the same upload later and expect a different outcome.
    public var isRetryable: Bool {
        switch self {
        case .refusedStream, .keyBusy, .storageError, .timeout, .internalError, .noError, .crcMismatch:
            return true
        default:
            return !self.isDefined
        }
    }

    public var description: String { self.name }
}
