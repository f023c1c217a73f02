import NIOCore

/// Every frame of protocol v1 (SPEC §3), one nested struct per frame type.
///
/// Stream-scoped messages carry their ``StreamID``; connection messages travel on stream 0.
/// ERROR and CREDIT may be either, and say which with their `streamID`.
public enum Frame: Hashable, Sendable {
    case hello(Hello)
    case welcome(Welcome)
    case open(Open)
    case offset(Offset)
    case chunk(Chunk)
    case ack(Ack)
    case credit(Credit)
    case hash(Hash)
    case result(Result)
    case error(Error)
    case cancel(Cancel)
    case ping(Ping)
    case pong(Pong)
    case goAway(GoAway)
    case plan(Plan)
    case room(Room)
    /// A frame of an extension type (0x80 and up) that this version ignores (SPEC §1.5).
    case `extension`(Extension)

    /// The stream the frame travels on.
    public var streamID: StreamID {
        switch self {
        case .hello, .welcome, .ping, .pong, .goAway, .plan, .room:
            return .connection
        case .open(let f): return f.streamID
        case .offset(let f): return f.streamID
        case .chunk(let f): return f.streamID
        case .ack(let f): return f.streamID
        case .credit(let f): return f.streamID
        case .hash(let f): return f.streamID
        case .result(let f): return f.streamID
        case .error(let f): return f.streamID
        case .cancel(let f): return f.streamID
        case .extension(let f): return f.streamID
        }
    }

    /// The frame's type on the wire.
    public var type: FrameType {
        switch self {
        case .hello: return Hello.type
        case .welcome: return Welcome.type
        case .open: return Open.type
        case .offset: return Offset.type
        case .chunk: return Chunk.type
        case .ack: return Ack.type
        case .credit: return Credit.type
        case .hash: return Hash.type
        case .result: return Result.type
        case .error: return Error.type
        case .cancel: return Cancel.type
        case .ping: return Ping.type
        case .pong: return Pong.type
        case .goAway: return GoAway.type
        case .plan: return Plan.type
        case .room: return Room.type
        case .extension(let f): return f.type
        }
    }
}

extension Frame {
    /// The magic that opens HELLO: "UPLD" (SPEC §3.1).
    public static let magic: [UInt8] = Array("UPLD".utf8)

    /// HELLO, agent → relay, stream 0: the agent's first frame (SPEC §3.1).
    public struct Hello: Hashable, Sendable {
        public static let type = FrameType.hello
        /// The authentication methods of SPEC §2.3.
        public struct AuthMethod: RawRepresentable, Hashable, Sendable {
            public let rawValue: UInt8
            public init(rawValue: UInt8) { self.rawValue = rawValue }
            /// The credential is a bearer token.
            public static let bearerToken = AuthMethod(rawValue: 1)
            /// The TLS client certificate authenticates; the credential is empty. Reserved.
            public static let clientCertificate = AuthMethod(rawValue: 2)
        }

        public var minVersion: UInt16
        public var maxVersion: UInt16
        /// The largest frame the agent accepts.
        public var maxFrameSize: UInt32
        /// The features the agent offers (``Features``).
        public var features: Features
        public var authMethod: AuthMethod
        /// The token for ``AuthMethod/bearerToken``.
        public var credential: [UInt8]
        /// A name for logs, such as the host name. Informational.
        public var agentName: String

        public init(
            minVersion: UInt16 = 1, maxVersion: UInt16 = 1, maxFrameSize: UInt32, features: Features,
            authMethod: AuthMethod = .bearerToken, credential: [UInt8], agentName: String
        ) {
            self.minVersion = minVersion
            self.maxVersion = maxVersion
            self.maxFrameSize = maxFrameSize
            self.features = features
            self.authMethod = authMethod
            self.credential = credential
            // Informational: a longer name (a library's own, a long host name) is cut, never a broken HELLO.
            self.agentName = Frame.fitting(agentName, maxBytes: Frame.maxNameBytes)
        }
    }

    /// Optional features negotiated in HELLO and WELCOME (SPEC §2.2).
    public struct Features: OptionSet, Hashable, Sendable {
        public let rawValue: UInt32
        public init(rawValue: UInt32) { self.rawValue = rawValue }
        /// Per-chunk zlib compression (SPEC §9).
        public static let deflate = Features(rawValue: 1 << 0)
        /// OPEN with a probe digest instead of the whole blob's SHA-1; OFFSET CONFIRM (SPEC §7.1).
        public static let dedupProbe = Features(rawValue: 1 << 1)
        /// One blob on several streams, OPEN with STRIPED and PART (SPEC §6.7).
        public static let stripes = Features(rawValue: 1 << 2)
        /// PLAN and ROOM: a selection checked against the account's quota before it is sent (SPEC §7.2).
        public static let quotaPlan = Features(rawValue: 1 << 3)
        /// Every feature this implementation knows.
        public static let known: Features = [.deflate, .dedupProbe, .stripes, .quotaPlan]
    }

    /// WELCOME, relay → agent, stream 0: the agent is authenticated; these are the relay's terms (SPEC §3.2).
    public struct Welcome: Hashable, Sendable {
        public static let type = FrameType.welcome
        public var version: UInt16
        /// The largest frame the relay accepts.
        public var maxFrameSize: UInt32
        /// The features in force on this connection.
        public var features: Features
        public var maxStreams: UInt32
        /// Initial connection credit in bytes.
        public var connectionWindow: UInt32
        /// Initial credit of each stream in bytes, granted with OFFSET START or RESUME.
        public var streamWindow: UInt32
        public var maxKeyLength: UInt16
        /// 0 means no idle timeout.
        public var idleTimeoutMillis: UInt32
        /// The account the credential belongs to.
        public var account: String

        public init(
            version: UInt16 = 1, maxFrameSize: UInt32, features: Features, maxStreams: UInt32,
            connectionWindow: UInt32, streamWindow: UInt32, maxKeyLength: UInt16, idleTimeoutMillis: UInt32,
            account: String
        ) {
            self.version = version
            self.maxFrameSize = maxFrameSize
            self.features = features
            self.maxStreams = maxStreams
            self.connectionWindow = connectionWindow
            self.streamWindow = streamWindow
            self.maxKeyLength = maxKeyLength
            self.idleTimeoutMillis = idleTimeoutMillis
            self.account = account
        }
    }

    /// OPEN, agent → relay: names an upload and opens its stream (SPEC §3.3).
    public struct Open: Hashable, Sendable {
        public static let type = FrameType.open
        /// Flag: the size field is meaningful.
        public static let sizeKnownFlag: UInt8 = 0x01
        /// Flag: the sha1 field is meaningful.
        public static let sha1KnownFlag: UInt8 = 0x02
        /// Flag: replace whatever the key holds.
        public static let overwriteFlag: UInt8 = 0x04
        /// Flag: the sha1 field is the probe digest (SPEC §7.1).
        public static let probeFlag: UInt8 = 0x08
        /// Flag: this stream carries the blob's first stripe only; PART streams carry the others (SPEC §6.7).
        public static let stripedFlag: UInt8 = 0x10
        /// Flag: this stream carries stripe ``part`` of the striped upload named by the resume token (SPEC §6.7).
        public static let partFlag: UInt8 = 0x20
        public static let allFlags: UInt8 = 0x3F
        /// The bytes a probe digest covers, and the size a blob opened with PROBE must exceed (SPEC §7.1).
        public static let probeLength: UInt64 = 1 << 18

        public var streamID: StreamID
        /// The key as sent. It may not be valid UTF-8: the relay checks it (``ObjectKey``) and answers INVALID_KEY.
        public var rawKey: [UInt8]
        /// The blob's size when known in advance.
        public var size: UInt64?
        /// The blob's SHA-1 when known in advance, for dedup.
        public var sha1: SHA1Digest?
        /// The SHA-1 of the blob's first ``probeLength`` bytes, for the dedup probe (PROBE, SPEC §7.1). Never with `sha1`.
        public var probe: SHA1Digest?
        /// Whether to replace different content stored under the key.
        public var overwrite: Bool
        /// Opaque bytes identifying this version of the source (SPEC §6.2).
        public var fingerprint: [UInt8]
        /// A token from an earlier OFFSET, to resume that upload (SPEC §6.2); with ``part``, the striped upload's.
        public var resumeToken: [UInt8]
        /// STRIPED: the stream carries stripe 0 only (SPEC §6.7).
        public var striped: Bool
        /// PART: the index of the stripe the stream carries, at least 1 (SPEC §6.7).
        public var part: UInt32?

        public init(
            streamID: StreamID, rawKey: [UInt8], size: UInt64? = nil, sha1: SHA1Digest? = nil,
            overwrite: Bool = false, fingerprint: [UInt8] = [], resumeToken: [UInt8] = [], probe: SHA1Digest? = nil,
            striped: Bool = false, part: UInt32? = nil
        ) {
            self.streamID = streamID
            self.rawKey = rawKey
            self.size = size
            self.sha1 = sha1
            self.probe = probe
            self.overwrite = overwrite
            self.fingerprint = fingerprint
            self.resumeToken = resumeToken
            self.striped = striped
            self.part = part
        }

        public init(
            streamID: StreamID, key: String, size: UInt64? = nil, sha1: SHA1Digest? = nil,
            overwrite: Bool = false, fingerprint: [UInt8] = [], resumeToken: [UInt8] = [], probe: SHA1Digest? = nil,
            striped: Bool = false, part: UInt32? = nil
        ) {
            self.init(
                streamID: streamID, rawKey: Array(key.utf8), size: size, sha1: sha1, overwrite: overwrite,
                fingerprint: fingerprint, resumeToken: resumeToken, probe: probe, striped: striped, part: part
            )
        }

        /// The bytes this stream carries (SPEC §6.7): the blob's size; with STRIPED the first stripe's length; with
        /// PART the stripe's length. Nil when the size is unknown.
        public var streamLength: UInt64? {
            guard let size = self.size else { return nil }
            if let part = self.part { return Stripes(size: size).length(of: Int(part)) }
            if self.striped { return Stripes(size: size).length(of: 0) }
            return size
        }

        /// The key as a string, or nil when it is not valid UTF-8.
        public var key: String? { String(validating: self.rawKey, as: UTF8.self) }

        var flags: UInt8 {
            (self.size != nil ? Self.sizeKnownFlag : 0) | (self.sha1 != nil ? Self.sha1KnownFlag : 0)
                | (self.overwrite ? Self.overwriteFlag : 0) | (self.probe != nil ? Self.probeFlag : 0)
                | (self.striped ? Self.stripedFlag : 0) | (self.part != nil ? Self.partFlag : 0)
        }
    }

    /// The stripes of a blob (SPEC §6.7): stripe i holds [i × length, min((i + 1) × length, size)), where the length is
    /// the smallest 16 MiB × 2^k for which 256 stripes hold the blob.
    public struct Stripes: Hashable, Sendable {
        /// The smallest stripe, and the size a blob must exceed to be striped.
        public static let minimumLength: UInt64 = 1 << 24
        /// The most stripes a blob has.
        public static let maximumCount: UInt64 = 256

        public let size: UInt64
        /// Every stripe's length but the last's.
        public let length: UInt64

        public init(size: UInt64) {
            self.size = size
            var length = Self.minimumLength
            // Sizes are at most 2^62 (SPEC §12.1): 2^54 holds any; the bound keeps the product from overflowing for others.
            while length < 1 << 55, size > Self.maximumCount * length { length <<= 1 }
            self.length = length
        }

        public var count: Int { Int(self.size / self.length + (self.size % self.length == 0 ? 0 : 1)) }

        /// The first byte of stripe `index`.
        public func start(of index: Int) -> UInt64 { UInt64(index) * self.length }

        /// The length of stripe `index` (0 past the last).
        public func length(of index: Int) -> UInt64 {
            let start = self.start(of: index)
            return start >= self.size ? 0 : min(self.length, self.size - start)
        }
    }

    /// OFFSET, relay → agent: where the upload starts (SPEC §3.4).
    public struct Offset: Hashable, Sendable {
        public static let type = FrameType.offset
        /// The relay's answer to OPEN.
        public enum Disposition: UInt8, Hashable, Sendable {
            /// Nothing is stored yet: send from 0.
            case start = 0
            /// The relay holds a durable prefix: send from `offset`.
            case resume = 1
            /// The key already holds these bytes: send nothing; the stream is finished.
            case stored = 2
            /// Answer to a PROBE: the relay may hold these bytes; open again with the whole SHA-1. The stream is finished.
            case confirm = 3
        }

        public var streamID: StreamID
        public var disposition: Disposition
        public var offset: UInt64
        /// Present this in a later OPEN to resume (SPEC §6.2). Empty with STORED.
        public var resumeToken: [UInt8]

        public init(streamID: StreamID, disposition: Disposition, offset: UInt64, resumeToken: [UInt8] = []) {
            self.streamID = streamID
            self.disposition = disposition
            self.offset = offset
            self.resumeToken = resumeToken
        }
    }

    /// CHUNK, agent → relay: bytes of the blob at an offset (SPEC §3.5).
    ///
    /// ```
    ///  0                   1                   2                   3
    /// +---------------------------------------------------------------+
    /// |                        offset (u64) ...                       |
    /// |                           ... offset                          |
    /// +---------------------------------------------------------------+
    /// |                 crc32 of the raw bytes (u32)                  |
    /// +---------------------------------------------------------------+
    /// |        raw length (u32), only with the DEFLATED flag          |
    /// +---------------------------------------------------------------+
    /// |                 data (the rest of the frame) ...              |
    /// +---------------------------------------------------------------+
    /// ```
    public struct Chunk: Hashable, Sendable {
        public static let type = FrameType.chunk
        /// Flag: `data` is a zlib stream inflating to `rawLength` bytes.
        public static let deflatedFlag: UInt8 = 0x01

        public var streamID: StreamID
        public var offset: UInt64
        /// CRC-32 (zlib's) of the raw, uncompressed bytes.
        public var crc32: UInt32
        /// The inflated length when `data` is deflated; nil when `data` is raw.
        public var rawLength: UInt32?
        /// The bytes on the wire: raw, or a zlib stream. Never copied by the codec.
        public var data: ByteBuffer

        public init(streamID: StreamID, offset: UInt64, crc32: UInt32, rawLength: UInt32? = nil, data: ByteBuffer) {
            self.streamID = streamID
            self.offset = offset
            self.crc32 = crc32
            self.rawLength = rawLength
            self.data = data
        }

        /// Whether `data` is deflated.
        public var isDeflated: Bool { self.rawLength != nil }

        /// The bytes this chunk adds to the blob, which is what it costs in credit (SPEC §5.2).
        public var payloadLength: Int { self.rawLength.map(Int.init) ?? self.data.readableBytes }

        /// The size of the fields before `data`.
        public static func fieldsSize(deflated: Bool) -> Int { deflated ? 16 : 12 }
    }

    /// ACK, relay → agent: every byte below `offset` is durable (SPEC §3.6, §6.1).
    public struct Ack: Hashable, Sendable {
        public static let type = FrameType.ack
        public var streamID: StreamID
        public var offset: UInt64
        public init(streamID: StreamID, offset: UInt64) {
            self.streamID = streamID
            self.offset = offset
        }
    }

    /// CREDIT, relay → agent: more bytes may be sent on a stream, or on the connection when on stream 0 (SPEC §3.7).
    public struct Credit: Hashable, Sendable {
        public static let type = FrameType.credit
        public var streamID: StreamID
        /// 1 through 2^31-1.
        public var increment: UInt32
        public init(streamID: StreamID, increment: UInt32) {
            self.streamID = streamID
            self.increment = increment
        }
    }

    /// HASH, agent → relay: the data is complete; here are its size and SHA-1 (SPEC §3.8).
    public struct Hash: Hashable, Sendable {
        public static let type = FrameType.hash
        public var streamID: StreamID
        public var size: UInt64
        public var sha1: SHA1Digest
        public init(streamID: StreamID, size: UInt64, sha1: SHA1Digest) {
            self.streamID = streamID
            self.size = size
            self.sha1 = sha1
        }
    }

    /// RESULT, relay → agent: the blob is committed, verified, under `key` (SPEC §3.9).
    public struct Result: Hashable, Sendable {
        public static let type = FrameType.result
        public enum Status: UInt8, Hashable, Sendable {
            /// The object was committed now.
            case stored = 0
            /// The key already held exactly these bytes.
            case unchanged = 1
        }

        public var streamID: StreamID
        public var status: Status
        public var size: UInt64
        public var sha1: SHA1Digest
        public var key: String

        public init(streamID: StreamID, status: Status, size: UInt64, sha1: SHA1Digest, key: String) {
            self.streamID = streamID
            self.status = status
            self.size = size
            self.sha1 = sha1
            self.key = key
        }
    }

    /// The longest message of ERROR, CANCEL and GOAWAY, in bytes (SPEC §12.1).
    public static let maxMessageBytes = 1024

    /// The longest agent name of HELLO, in bytes (SPEC §12.1).
    public static let maxNameBytes = 255

    /// `message` cut to `maxBytes` (``maxMessageBytes`` unless said) at a character boundary, ending in "…" when cut
    /// (SPEC §12.1: a sender never sends a longer one; a message that names a long key would otherwise break the
    /// protocol).
    public static func fitting(_ message: String, maxBytes: Int = Self.maxMessageBytes) -> String {
        guard message.utf8.count > maxBytes else { return message }
        let ellipsis = "…"
        var cut = ""
        var bytes = 0
        for character in message {
            let size = character.utf8.count
            guard bytes + size + ellipsis.utf8.count <= maxBytes else { break }
            cut.append(character)
            bytes += size
        }
        return cut + ellipsis
    }

    /// ERROR, both ways: closes a stream, or on stream 0 the connection (SPEC §3.10).
    public struct Error: Hashable, Sendable {
        public static let type = FrameType.error
        public var streamID: StreamID
        public var code: WireErrorCode
        public var message: String
        /// `message` is cut to ``Frame/maxMessageBytes``.
        public init(streamID: StreamID, code: WireErrorCode, message: String) {
            self.streamID = streamID
            self.code = code
            self.message = Frame.fitting(message)
        }
    }

    /// CANCEL, agent → relay: abandon this upload and forget its resume state (SPEC §3.11).
    public struct Cancel: Hashable, Sendable {
        public static let type = FrameType.cancel
        public var streamID: StreamID
        public var code: WireErrorCode
        public var message: String
        /// `message` is cut to ``Frame/maxMessageBytes``.
        public init(streamID: StreamID, code: WireErrorCode = .cancelled, message: String) {
            self.streamID = streamID
            self.code = code
            self.message = Frame.fitting(message)
        }
    }

    /// PING, both ways, stream 0: answered by PONG with the same 8 bytes (SPEC §3.12).
    public struct Ping: Hashable, Sendable {
        public static let type = FrameType.ping
        public var data: UInt64
        public init(data: UInt64) { self.data = data }
    }

    /// PONG, both ways, stream 0: the answer to PING (SPEC §3.12).
    public struct Pong: Hashable, Sendable {
        public static let type = FrameType.pong
        public var data: UInt64
        public init(data: UInt64) { self.data = data }
    }

    /// GOAWAY, stream 0: no stream above `lastStreamID` will be processed (SPEC §3.13, §6.4).
    public struct GoAway: Hashable, Sendable {
        public static let type = FrameType.goAway
        public var lastStreamID: StreamID
        public var code: WireErrorCode
        public var message: String
        public init(lastStreamID: StreamID, code: WireErrorCode, message: String) {
            self.lastStreamID = lastStreamID
            self.code = code
            self.message = Frame.fitting(message)
        }
    }

    /// PLAN, agent → relay, stream 0: what would uploading these blobs add to the account's quota use (SPEC §3.15)?
    public struct Plan: Hashable, Sendable {
        public static let type = FrameType.plan
        /// The only flag PLAN defines: the uploads would replace what their keys hold (as OPEN's OVERWRITE).
        public static let overwriteFlag: UInt8 = 0x04
        public struct Entry: Hashable, Sendable {
            /// The key's bytes as OPEN would carry them; not checked (SPEC §3.15).
            public var rawKey: [UInt8]
            public var size: UInt64
            public init(rawKey: [UInt8], size: UInt64) {
                self.rawKey = rawKey
                self.size = size
            }
            public init(key: String, size: UInt64) {
                self.init(rawKey: Array(key.utf8), size: size)
            }
        }
        /// Chosen by the agent; the ROOM echoes it.
        public var request: UInt32
        public var overwrite: Bool
        /// At most ``ProtocolLimits/maxPlanEntries``.
        public var entries: [Entry]
        public init(request: UInt32, overwrite: Bool, entries: [Entry]) {
            self.request = request
            self.overwrite = overwrite
            self.entries = entries
        }
    }

    /// ROOM, relay → agent, stream 0: the answer to a PLAN (SPEC §3.16, §7.2).
    public struct Room: Hashable, Sendable {
        public static let type = FrameType.room
        /// The wire value of `quota` for an account without one.
        public static let noQuota = UInt64.max
        public var request: UInt32
        /// The account's quota in bytes; nil: none.
        public var quota: UInt64?
        /// What counts against the quota now.
        public var used: UInt64
        /// Per PLAN entry, in order: what uploading it would add to `used`.
        public var needs: [UInt64]
        public init(request: UInt32, quota: UInt64?, used: UInt64, needs: [UInt64]) {
            self.request = request
            self.quota = quota
            self.used = used
            self.needs = needs
        }
    }

    /// A frame of an extension type (0x80 and up): decoded so that it can be skipped (SPEC §1.5).
    public struct Extension: Hashable, Sendable {
        public var type: FrameType
        public var flags: UInt8
        public var streamID: StreamID
        public var data: ByteBuffer
        public init(type: FrameType, flags: UInt8, streamID: StreamID, data: ByteBuffer) {
            self.type = type
            self.flags = flags
            self.streamID = streamID
            self.data = data
        }
    }
}
