/// One blob to upload: where its bytes come from and the key it is stored under.
public struct UploadItem: Sendable {
    /// The key on the relay (SPEC §12.2).
    public var key: String
    /// What the user named: a path, or "-" for stdin.
    public var displayPath: String
    public var source: any BlobSource
    /// Replace different content stored under the key; nil follows ``AgentConfiguration/overwrite``.
    public var overwrite: Bool?
    /// Hash before OPEN so the relay can answer from its dedup; nil follows ``AgentConfiguration/dedup``.
    public var dedup: Bool?
    /// The fingerprint the source had when the item was planned or queued: a source that opens with another one (a
    /// different file now at the path, or the file changed since) is refused, never uploaded in its place. Nil or empty:
    /// not checked.
    public var expectedFingerprint: [UInt8]?

    /// ``expectedFingerprint`` when there is one to check.
    var checkedFingerprint: [UInt8]? {
        self.expectedFingerprint.flatMap { $0.isEmpty ? nil : $0 }
    }

    public init(
        key: String, displayPath: String, source: any BlobSource, overwrite: Bool? = nil, dedup: Bool? = nil, expectedFingerprint: [UInt8]? = nil
    ) {
        self.key = key
        self.displayPath = displayPath
        self.source = source
        self.overwrite = overwrite
        self.dedup = dedup
        self.expectedFingerprint = expectedFingerprint
    }
}

/// How one item ended.
public struct UploadResult: Hashable, Sendable {
    public enum Status: String, Hashable, Sendable {
        /// The relay committed it now (or already held exactly these bytes under the key).
        case stored
        /// The relay held these bytes already: nothing was sent.
        case deduplicated
        case failed
        /// Not uploaded, by the agent's rules, and said why: a symbolic link (unless followed), a directory that cannot
        /// be read, a name that is not UTF-8, something that is not a regular file.
        case skipped
    }

    public var key: String
    public var path: String
    /// The blob's size (bytes read, for a failed stream upload).
    public var bytes: UInt64
    /// Lowercase hex; empty when it failed before the hash was known.
    public var sha1: String
    public var status: Status
    /// Payload bytes this run actually transmitted for it, over every connection.
    public var sentBytes: UInt64
    /// Bytes this run read only to hash them (dedup before OPEN, a prefix before a resume): 0 when the hash cache or
    /// the state database already knew them.
    public var hashedBytes: UInt64
    /// What ``sentBytes`` took on the wire: CHUNK data after deflate (frame headers and TLS not counted). Equal to
    /// ``sentBytes`` without deflate, and for an item recorded by an earlier run.
    public var wireBytes: UInt64
    /// The streams its bytes went on: more than 1 when it was striped over the agent's connections (SPEC §6.7).
    public var stripes: Int = 1
    public var error: String?
    /// What went wrong, for scripts: the relay's wire code (`QUOTA_EXCEEDED`, `STORAGE_ERROR`, ...) or one of the
    /// agent's own (``ErrorCode``). Set with ``error`` on failed and skipped results.
    public var errorCode: String?

    /// The agent's own error codes (beside the wire's, SPEC §8), as `--json` results carry them in `error_code`.
    public enum ErrorCode {
        /// No connection to the relay worked within `--retry-for` (refused, no route, name unknown, no answer).
        public static let relayUnreachable = "RELAY_UNREACHABLE"
        /// The relay was reached, but nothing went forward within `--retry-for`.
        public static let noProgress = "NO_PROGRESS"
        /// The relay's certificate does not verify against the CA given.
        public static let tlsUntrusted = "TLS_UNTRUSTED"
        /// The relay's certificate does not name the host connected to.
        public static let tlsNameMismatch = "TLS_NAME_MISMATCH"
        /// The TLS handshake failed otherwise (not an upload-relay, or no TLS).
        public static let tlsHandshake = "TLS_HANDSHAKE"
        /// The file could not be read, or changed or was replaced while it was read.
        public static let sourceError = "SOURCE_ERROR"
        /// The name cannot be a key (SPEC §12.2), or two names make one key.
        public static let invalidKey = "INVALID_KEY"
        /// Not uploaded by the agent's rules (a symbolic link, not a regular file, a name that is not UTF-8, a
        /// directory that cannot be read).
        public static let skipped = "SKIPPED"
        /// Anything else.
        public static let failed = "FAILED"

        /// Codes that mean the relay could not be reached or did not take the account: nothing of the run went up
        /// (`send` exits 3 when every failure has one of them and nothing was stored).
        public static let relayRefused: Set<String> = [
            relayUnreachable, tlsUntrusted, tlsNameMismatch, tlsHandshake, "UNAUTHENTICATED", "UNSUPPORTED_VERSION",
        ]
    }

    public init(
        key: String, path: String, bytes: UInt64, sha1: String, status: Status, sentBytes: UInt64, hashedBytes: UInt64 = 0,
        wireBytes: UInt64? = nil, error: String? = nil
    ) {
        self.wireBytes = wireBytes ?? sentBytes
        self.key = key
        self.path = path
        self.bytes = bytes
        self.sha1 = sha1
        self.status = status
        self.sentBytes = sentBytes
        self.hashedBytes = hashedBytes
        self.error = error
    }

    /// An item that ended before anything of it was read or sent.
    public static func failed(key: String, path: String = "", error: String, code: String = ErrorCode.failed) -> UploadResult {
        var result = UploadResult(key: key, path: path, bytes: 0, sha1: "", status: .failed, sentBytes: 0, error: error)
        result.errorCode = code
        return result
    }

    /// A path not uploaded by the agent's rules, and why.
    public static func skipped(key: String = "", path: String, reason: String) -> UploadResult {
        var result = UploadResult(key: key, path: path, bytes: 0, sha1: "", status: .skipped, sentBytes: 0, error: reason)
        result.errorCode = ErrorCode.skipped
        return result
    }
}

/// What an upload run reports as it goes, for progress displays.
public enum UploadEvent: Sendable {
    /// A connection to the relay is up.
    case connected(relay: String, account: String)
    /// The connection broke; the agent tries again after `delay`.
    case reconnecting(reason: String, delay: Duration)
    /// An item's upload starts (or resumes) at `offset` of `size`.
    case started(key: String, size: UInt64?, offset: UInt64)
    /// Payload bytes went out for an item.
    case sent(key: String, bytes: Int)
    /// The relay holds the first `offset` bytes of an item durably (an ACK).
    case acknowledged(key: String, offset: UInt64)
    /// An item ended.
    case finished(UploadResult)
    /// An adaptive run opened another connection, `count` in all, and why (the link's round trip).
    case connections(count: Int, reason: String)
    /// The relay had no room for an item (QUOTA_EXCEEDED, or its storage full): it waits `retryIn`, then is tried again;
    /// the other items go on meanwhile.
    case waiting(key: String, reason: String, retryIn: Duration)
}
