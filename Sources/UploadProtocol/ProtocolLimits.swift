/// Every limit of the protocol in one place, with the defaults of SPEC §12.
///
/// Both roles use one value of this type: the relay announces some of these numbers in WELCOME,
/// the agent announces its frame size in HELLO, and both codecs and state machines enforce them.
public struct ProtocolLimits: Hashable, Sendable {
    /// The largest frame, header included, that this side accepts once it has announced it (SPEC §1.2).
    /// Default 1,114,112 bytes: a 1 MiB chunk and its fields fit with room to spare.
    public var maxFrameSize: Int = 1_114_112

    /// How many streams may be open at once on one connection (SPEC §4.3). Default 64.
    public var maxConcurrentStreams: Int = 64

    /// The relay's initial connection credit in bytes (SPEC §5): the most chunk bytes one connection can hold in the
    /// relay's memory. Default 8 MiB, one stream window: a connection carries at most about its socket buffer per round
    /// trip (4 MiB by default), so more held nothing more in flight, while the relay's memory budget went to the first
    /// connections (four of 32 MiB spent 128 MiB, and an agent's later connections got 128 KiB each).
    public var connectionWindow: Int = 8 << 20

    /// The relay's initial credit for each stream in bytes (SPEC §5). Default 8 MiB: enough for
    /// reading, sending, verifying and writing to overlap on a fast link (tools/bench-upload.sh).
    public var streamWindow: Int = 8 << 20

    /// The longest key in bytes of UTF-8 (SPEC §12.2). Default 1,024.
    public var maxKeyLength: Int = 1024

    /// The longest segment of a key in bytes (SPEC §12.2). Default 255, the usual file name limit.
    public var maxKeySegmentLength: Int = 255

    /// The longest bearer token in bytes (SPEC §3.1). Default 1,024.
    public var maxCredentialLength: Int = 1024

    /// The longest message in ERROR, CANCEL and GOAWAY in bytes (SPEC §3.10). Default 1,024.
    public var maxMessageLength: Int = 1024

    /// The longest agent or account name in bytes (SPEC §3.1). Default 255.
    public var maxNameLength: Int = 255

    /// The longest source fingerprint and resume token in bytes (SPEC §3.3). Default 64.
    public var maxTokenLength: Int = 64

    /// How many closed streams a state machine remembers, to tell a late frame from a bad one (SPEC §4.4). Default 1,024.
    public var closedStreamMemory: Int = 1024

    /// How long a connection may take from TCP accept to WELCOME (SPEC §2.4). Default 10 s.
    public var handshakeTimeout: Duration = .seconds(10)

    /// How long a connection may go without a whole frame before it is closed (SPEC §2.3). Default 120 s. Bytes of
    /// an unfinished frame do not count: a peer cannot hold a connection by trickling one frame.
    public var idleTimeout: Duration = .seconds(120)

    /// How long one frame may take to arrive, from its first byte to its last (SPEC §2.3). Default 120 s: a 1 MiB
    /// CHUNK needs about 70 kbit/s.
    public var frameTimeout: Duration = .seconds(120)

    /// How many OPENs the relay may refuse on one connection in one second before it takes the agent for a flood and
    /// closes with ENHANCE_YOUR_CALM (SPEC §12.3). Default 100.
    public var maxRefusalsPerSecond: Int = 100

    public init() {}

    /// The largest frame a side accepts before it has announced its own limit (SPEC §1.2).
    public static let initialMaxFrameSize = 65_536
    /// The smallest maximum frame size a side may announce (SPEC §1.2).
    public static let smallestMaxFrameSize = 16_384
    /// The largest maximum frame size a side may announce (SPEC §1.2).
    public static let largestMaxFrameSize = 16_777_216
    /// The largest a credit window may grow (SPEC §5.3).
    public static let maxWindow = Int(Int32.max)
    /// The smallest size a relay may resize a connection window to, unless WELCOME granted less (SPEC §5.5).
    public static let smallestResizedWindow = 65_536
    /// The largest size or offset a frame may carry (SPEC §3): 2^62.
    public static let maxBlobSize: UInt64 = 1 << 62
    /// The most entries one PLAN may carry (SPEC §3.15, §12.1): its ROOM then fits in the smallest frame a side may
    /// announce.
    public static let maxPlanEntries = 1000
    /// The TLS ALPN protocol id both sides offer and the relay requires (SPEC §2.1).
    public static let alpn = "upload/1"
    /// The protocol versions this implementation speaks (SPEC §2.2).
    public static let supportedVersions: ClosedRange<UInt16> = 1...1

    /// The most chunk payload bytes that fit in a frame of `frameSize` bytes (SPEC §3.5).
    public static func maxChunkPayload(frameSize: Int) -> Int {
        frameSize - FrameHeader.size - Frame.Chunk.fieldsSize(deflated: true)
    }
}
