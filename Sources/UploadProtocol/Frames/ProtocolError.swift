/// A violation of the protocol, detected by the codec or a state machine.
///
/// Stream errors close one stream and leave the others alone; connection errors close the
/// connection (SPEC §4, §11). The message names what was wrong for a person reading a log.
public struct ProtocolError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What the error closes.
    public enum Scope: Hashable, Sendable {
        /// The whole connection: ERROR on stream 0, then close.
        case connection
        /// One stream: ERROR on that stream; the connection goes on.
        case stream(StreamID)
    }

    /// The code sent in the ERROR frame.
    public var code: WireErrorCode
    /// What the error closes.
    public var scope: Scope
    /// What was wrong, for people.
    public var message: String

    public init(_ code: WireErrorCode, _ scope: Scope, _ message: String) {
        self.code = code
        self.scope = scope
        self.message = message
    }

    /// A connection error.
    public static func connection(_ code: WireErrorCode, _ message: String) -> ProtocolError {
        ProtocolError(code, .connection, message)
    }

    /// A stream error.
    public static func stream(_ id: StreamID, _ code: WireErrorCode, _ message: String) -> ProtocolError {
        ProtocolError(code, .stream(id), message)
    }

    public var description: String {
        switch self.scope {
        case .connection:
            return "\(self.code.name) (connection): \(self.message)"
        case .stream(let id):
            return "\(self.code.name) (stream \(id)): \(self.message)"
        }
    }
}
