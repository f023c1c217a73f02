import UploadProtocol

/// Everything `upload-agent send` can be told, typed (the CLI only fills this in).
public struct AgentConfiguration: Sendable {
    public var relayHost: String
    public var relayPort: Int
    /// The bearer token (SPEC §2.3).
    public var token: String
    /// PEM file of the CA that signed the relay's certificate; nil uses the system's trust roots.
    public var caPath: String?
    /// The name the relay's certificate must hold, when it is not ``relayHost`` (an agent that connects by IP address
    /// to a relay whose certificate names it by DNS name). Also sent as TLS SNI.
    public var serverName: String? = nil
    /// A name for the relay's logs.
    public var agentName: String = "upload-agent"

    /// TLS connections to the relay at once, each carrying streams: with ``adaptiveConnections`` the most a run opens
    /// (`--max-connections`), else exactly this many (`--connections N`). One TCP connection is held to its window by
    /// the host's socket buffers (about 26 MB/s over a 100 ms round trip with Linux's 4 MiB default): on a long fat link
    /// several carry several files, or the stripes of one, at once. ``concurrency``, ``maxReadsInFlight`` and
    /// ``writeBufferBytes`` are shared among a fixed number of them (each keeps at least one place, one read and a
    /// chunk's worth), and so are ``chunkSize`` and ``readBatchBytes`` (each connection's chunks and reads are smaller,
    /// down to 256 KiB), so that the memory of several connections, each with its own TLS buffer, stays about that of
    /// one.
    public var connections = 8
    /// Open one connection, and more up to ``connections`` only while the link is long (a round trip of 5 ms or more)
    /// and each one added raised the run's throughput (`ConnectionGrowth`): on loopback and a LAN one connection is
    /// enough and no other is opened. The first connection keeps the whole of ``concurrency`` and the buffers; each one
    /// added has two places, a 1/``connections`` share of the buffers and 256 KiB chunks, and on a long link every
    /// connection takes another upload only while it holds less than 4 MiB to send. False:
    /// exactly ``connections`` from the start (`--connections N`).
    public var adaptiveConnections = true
    /// Uploads in flight at once over all connections (streams). An upload of at most ``smallUploadBytes`` counts as
    /// 1/``smallUploadsPerSlot`` of one: a photo costs a round trip and a commit, not a slot's memory, and small files
    /// went at a third of the rate they could with 5 at once.
    public var concurrency: Int = 5
    /// The largest upload that counts as small for ``concurrency``: its read block (at most this) is all it holds. At
    /// 1 MiB, 33 one-MiB files in flight each held a block read for its probe: 61 MiB of agent.
    public var smallUploadBytes: UInt64 = 256 << 10
    /// How many small uploads share one place of ``concurrency``.
    public var smallUploadsPerSlot: Int = 8
    /// The largest chunk payload (capped by the relay's frame size).
    public var chunkSize: Int = 1 << 20
    /// Hash files before OPEN so the relay can answer "already stored" without a byte sent (SPEC §7). A file over 256 KiB
    /// is hashed over its first 256 KiB only when the relay grants the dedup probe, and whole only if it answers CONFIRM
    /// (SPEC §7.1).
    public var dedup = true
    /// The most payload bytes per second read and sent, over all uploads (`--bwlimit`); nil for no limit. The relay's
    /// credit still applies: the agent never sends faster than either allows.
    public var bandwidthLimit: Int? = nil
    /// Offer per-chunk deflate (SPEC §9): worth it on slow links with compressible data only.
    public var deflate = false
    /// Replace different content already stored under a key.
    public var overwrite = false
    /// How long to keep reconnecting after the relay became unreachable.
    public var retryFor: Duration = .seconds(60)
    /// Never give up reconnecting (a long-running agent: `watch`); ``retryFor`` is then ignored.
    public var retryForever = false
    /// Longest wait between reconnection attempts.
    public var maxBackoff: Duration = .seconds(5)
    /// A long-running agent (``retryForever``) told QUOTA_EXCEEDED or STORAGE_ERROR for an item lets that item wait this
    /// long instead of failing it, doubling each time the relay refuses it again, up to ``relayFullMaxBackoff``; the
    /// other items go on meanwhile.
    public var relayFullBackoff: Duration = .seconds(10)
    public var relayFullMaxBackoff: Duration = .seconds(600)
    /// A one-shot run (`send`) told STORAGE_ERROR (the relay's storage full or failing) lets the item wait this long,
    /// doubling up to ``storageRetryMaxBackoff``, for ``retryFor`` since the first refusal; then it fails. It reports
    /// QUOTA_EXCEEDED at once.
    public var storageRetryBackoff: Duration = .seconds(1)
    public var storageRetryMaxBackoff: Duration = .seconds(30)
    /// With nothing received for this long the agent sends PING; with nothing for twice as long it
    /// takes the connection for dead and reconnects (SPEC §2.3). Catches links that vanish silently.
    public var keepaliveInterval: Duration = .seconds(15)
    /// The longest a relay may take, from TCP connected, to WELCOME the connection: bytes that trickle in keep the
    /// keepalive quiet, never this.
    public var welcomeTimeout: Duration = .seconds(15)
    /// How many times one item may fail with a retryable stream error before it is given up.
    public var maxAttemptsPerItem = 5
    /// How many times in a row a source may be reopened after it threw ``SourceInvalidated`` with no successful read
    /// in between, before its upload fails.
    public var maxReopensInARow = 3
    /// Wire limits: frame size and the like (SPEC §12).
    public var limits = ProtocolLimits()
    /// The most items of a persistent queue held in memory, waiting or uploading; the rest wait in the state database
    /// and are loaded as uploads end, so memory stays the same for 100 queued files or 100,000.
    public var queueWindow = 256
    /// Threads for reading and hashing sources.
    public var ioThreads = 2
    /// The most bytes of one stream read (and hashed) in one trip to the thread pool: one such batch per stream is
    /// in memory while it is read and sent.
    public var readBatchBytes = 1 << 20
    /// The most reads of sources on the thread pool at once, whatever the number of uploads: each holds a batch.
    public var maxReadsInFlight = 2
    /// A source of at most this many bytes that is hashed whole before OPEN (dedup) keeps the bytes it was hashed from
    /// until its upload ends, and is sent from them: no second read, no second trip to the thread pool (a small
    /// file's costs are per trip). At most this much memory per upload in flight; 0 reads every source again.
    public var heldSourceBytes = 64 << 10
    /// The most bytes (encrypted frames) waiting for the socket: above it no read of a source starts, below half of it
    /// reads go on. With one batch in flight per stream, this bounds the agent's memory whatever the link's speed.
    public var writeBufferBytes = 2 << 20
    /// The most capacity TLS keeps in its buffer of encrypted bytes between writes (a larger write allocates anew):
    /// a CHUNK of ``chunkSize`` and its records' overhead fit without the buffer doubling.
    public var tlsBufferBytes = (1 << 20) + (64 << 10)
    /// Faults the agent injects on purpose, for tests of the relay's checks; none by default.
    @_spi(Testing) public var faults = AgentFaults()

    public init(relayHost: String, relayPort: Int, token: String, caPath: String?) {
        self.relayHost = relayHost
        self.relayPort = relayPort
        self.token = token
        self.caPath = caPath
    }
}

/// Ways a test makes the agent misbehave, to see the relay refuse it. Not part of the public configuration.
@_spi(Testing) public struct AgentFaults: Sendable {
    /// Corrupt every chunk that holds this offset, after its CRC was computed (the relay must refuse it).
    public var corruptChunkAtOffset: UInt64? = nil
    /// Claim this SHA-1 in every HASH instead of the real one.
    public var lieAboutSHA1: SHA1Digest? = nil
    /// Take the link's round trip to be this, whatever the kernel measured (an adaptive run on loopback behaving as on a
    /// long link).
    public var assumedRoundTrip: Duration? = nil

    public init() {}
}
