import Logging
import NIOCore
import UploadProtocol

/// What a relay session shares with the rest of the relay: its settings, the key claims and the memory and
/// upload budgets. In memory and thread-safe; no I/O.
package struct RelaySessionResources: Sendable {
    var settings: RelaySessionSettings
    var claims: KeyClaims
    /// Chunk bytes the connections' windows may make the relay hold, all together.
    var memory: ResourceBudget
    /// Uploads open at once (each holds its staging file's descriptor).
    var uploadSlots: UploadSlots

    package init(configuration: RelayConfiguration, claims: KeyClaims, memory: ResourceBudget, uploadSlots: UploadSlots) {
        self.settings = RelaySessionSettings(configuration)
        self.claims = claims
        self.memory = memory
        self.uploadSlots = uploadSlots
    }
}

/// What of ``RelayConfiguration`` a session decides with. Each session holds it by value, so it stays small: not the
/// paths, the S3 keys, the hooks or the status endpoint.
package struct RelaySessionSettings: Sendable {
    var limits: ProtocolLimits
    var allowDeflate: Bool
    var allowStripes: Bool
    var minimumConnectionWindow: Int
    var syncBytes: Int
    var syncInterval: Duration
    var shutdownGrace: Duration
    var idleShareTimeout: Duration
    var maxBlobSize: Int64
    var lookupsPerConnection: Int

    init(_ configuration: RelayConfiguration) {
        self.limits = configuration.limits
        self.allowDeflate = configuration.allowDeflate
        self.allowStripes = configuration.allowStripes
        self.minimumConnectionWindow = configuration.minimumConnectionWindow
        self.syncBytes = configuration.syncBytes
        self.syncInterval = configuration.syncInterval
        self.shutdownGrace = configuration.shutdownGrace
        self.idleShareTimeout = configuration.idleShareTimeout
        self.maxBlobSize = configuration.maxBlobSize
        self.lookupsPerConnection = max(1, configuration.lookupsPerConnection)
    }
}

/// Everything one relay connection decides (SPEC §2 to §6), with no channel, no thread and no clock of its own.
///
/// Inputs are TLS and decoded frames, the completions of catalog and storage work, and timer ticks, each with the
/// time when it matters. Outputs are ``Action``s for ``RelayConnectionHandler`` to run: write, close, arm or cancel a
/// timer, authenticate, look an upload up, run a storage step. The session owns the connection's state machine, the
/// frame reader and its frame-limit rule, every stream's upload pipeline, the timers' deadlines and the GOAWAY drain.
package struct RelaySession {
    package enum Timer: Hashable {
        /// HELLO and authentication must be done by then (SPEC §2.3).
        case handshake
        /// The idle and frame timeouts (SPEC §2.3), checked at the next deadline.
        case liveness
        /// The end of the GOAWAY drain period, then of the shutdown grace (SPEC §6.5).
        case grace
        /// One upload's pending bytes are due to be made durable.
        case sync(StreamID)
    }

    package enum Action {
        case write(Frame)
        /// Flush and close the connection.
        case close
        case schedule(Timer, in: TimeAmount)
        case cancel(Timer)
        /// Look the HELLO's credential up in the catalog, then call ``authenticated(_:)``.
        case authenticate(Frame.Hello)
        /// Decide the OPEN against the catalog and the store (``UploadPolicy/open(account:open:key:)``), then call
        /// ``uploadLookedUp(_:_:)``.
        case lookUp(Frame.Open, ObjectKey, Account)
        /// Run a storage step of the stream's upload (write, sync, commit, release), then report its completion.
        case storage(StreamID, UploadPipeline.StorageStep)
        /// The stream's upload needs its storage no more (committed: nothing to close): let it go.
        case dropStorage(StreamID)
        /// Answer the PLAN from the catalog (``UploadPolicy/plan(account:plan:)``), then call ``planAnswered(_:)``.
        case plan(Frame.Plan, Account)
        /// Drop the unfinished session the OPEN named (it was cancelled while waiting for its key, SPEC §3.11).
        case discardSession(Frame.Open, ObjectKey, Account)
        case log(Logger.Level, String, Logger.Metadata)
    }

    /// What a lookup decided, without the staging file and SHA-1 state that stay with the handler.
    package enum LookUp {
        case stored(size: UInt64)
        /// OFFSET CONFIRM: a PROBE matched (SPEC §7.1).
        case confirm
        case refuse(WireErrorCode, String)
        case upload(durableOffset: Int64, resumeToken: [UInt8], resumed: Bool, byteLimit: Int64?)
        /// A PART stream's stripe, sent from its start (SPEC §6.7).
        case stripe
    }

    /// Where a connection is in its graceful shutdown.
    enum Drain {
        /// Not shutting down.
        case none
        /// GOAWAY sent: open streams go on (CHUNK, HASH, RESULT) for the drain period; the connection closes as soon as
        /// none is left open.
        case draining
        /// The drain period is over: what was received is made durable and acknowledged, verifying streams get their
        /// RESULT, then the connection closes.
        case finishing
    }

    package var machine: RelayConnectionStateMachine
    var reader = FrameReader()
    let resources: RelaySessionResources
    var limits: ProtocolLimits { self.resources.settings.limits }
    /// Runs a waiting OPEN again once its key is free (from any thread; the handler hops to its event loop).
    let keyFreed: @Sendable (Frame.Open, ObjectKey) -> Void

    var account: Account? = nil
    /// What this connection holds of the relay's memory budget: its window's size, or what the agent may still make
    /// the relay hold while a smaller size keeps credit back (SPEC §5.5). Taken at WELCOME, given back at close.
    var grantedWindow = 0
    /// Whether the connection counts among the budget's holders (from WELCOME to its close).
    var holdsWindowShare = false
    /// Whether TLS selected the protocol's ALPN id (SPEC §2.1); nothing is read before.
    var alpnAccepted = false
    var closed = false
    var drain = Drain.none
    /// When the last whole frame arrived (or the connection was accepted).
    var lastFrameAt: NIODeadline
    /// When the connection last did something (a frame other than PING or PONG, or an upload open or opening at a look),
    /// or was accepted: an idle connection gives its memory share back.
    var lastActiveAt: NIODeadline
    /// When the first byte of the frame now arriving came; nil between frames.
    var frameStartedAt: NIODeadline? = nil
    /// The time of the latest input that carried one (a frame, a timer, a look at the accounts): the session's clock for
    /// decisions made on inputs without one (a refused OPEN's place in the refusal rate). The session reads no clock.
    var latestInputAt: NIODeadline

    /// Uploads by stream, from the lookup's answer until their storage lets go (which may be after the stream ended).
    var pipelines: [StreamID: UploadPipeline] = [:]
    /// The key claim of each upload in `pipelines`: its key's, or for a PART stream its stripe's.
    var uploadClaims: [StreamID: String] = [:]
    /// Uploads whose storage is letting go (their release step runs), with the claim that goes back, and their slot,
    /// once it is done. The session is the one owner of both: storage gives nothing back.
    var releasing: [StreamID: String] = [:]
    /// Keys claimed by streams whose upload is being looked up, and, once such a stream closed meanwhile, whether to
    /// drop the session when the lookup returns.
    var opening: [StreamID: (claim: String, closedMeanwhile: Bool?)] = [:]
    /// Streams whose OPEN waits for its key (the key's last upload is closing), and whether CANCEL came meanwhile.
    var waitingForKey: [StreamID: Bool] = [:]
    /// Lookups of this connection running now (``RelaySessionSettings/lookupsPerConnection`` at most), and the OPENs
    /// in ``opening`` waiting for one to return, in order. Each waits as a frame, not as a task of its own.
    var lookupsInFlight = 0
    var lookupQueue: [(Frame.Open, ObjectKey, Account)] = []

    package init(resources: RelaySessionResources, now: NIODeadline, keyFreed: @escaping @Sendable (Frame.Open, ObjectKey) -> Void) {
        self.resources = resources
        self.keyFreed = keyFreed
        self.lastFrameAt = now
        self.lastActiveAt = now
        self.latestInputAt = now
        self.machine = RelayConnectionStateMachine(
            limits: resources.settings.limits,
            supportedFeatures: Frame.Features([.dedupProbe, .quotaPlan])
                .union(resources.settings.allowDeflate ? [.deflate] : [])
                .union(resources.settings.allowStripes ? [.stripes] : [])
        )
    }

    // MARK: Running the state machine's actions

    mutating func run(_ action: RelayAction) -> [Action] {
        var actions: [Action] = []
        switch action {
        case .none, .peerGoingAway:
            break
        case .plan(let plan):
            // The state machine lets a PLAN through only after WELCOME, when the account is known.
            guard let account = self.account else { return self.failConnection(.internalError, "PLAN before authentication") }
            actions.append(.plan(plan, account))
        case .authenticate(let hello):
            actions.append(.authenticate(hello))
        case .openUpload(let open, let key):
            actions += self.openUpload(open, key)
        case .write(let chunk):
            actions += self.step(chunk.streamID) { $0.enqueue(chunk) }
        case .finish(let hash):
            actions += self.step(hash.streamID) { $0.finish(hash) }
        case .abortUpload(let id, let code, let message, let discard, let credit):
            actions.append(.log(.debug, "agent closed stream", ["stream.id": "\(id)", "error.code": "\(code.name)", "error.message": "\(message)"]))
            if let credit { actions += self.write(.credit(credit)) }
            actions += self.streamEnded(id, discard: discard)
        case .send(let frame):
            actions += self.write(frame)
        case .resetStream(let error, let credit):
            actions += self.write(.error(error))
            if let credit { actions += self.write(.credit(credit)) }
            // SPEC §8.2: a size that does not add up makes the staged bytes worthless; other resets keep them.
            let keep = error.code != .sizeMismatch && error.code != .hashMismatch
            actions += self.streamEnded(error.streamID, discard: !keep)
        case .closeConnection(let error):
            actions.append(.log(.info, "closing connection", ["error.code": "\(error.code.name)", "error.message": "\(error.message)"]))
            actions += self.write(.error(error))
            actions += self.close()
        case .peerClosed(let code, let message):
            actions.append(.log(.info, "agent closed the connection", ["error.code": "\(code.name)", "error.message": "\(message)"]))
            actions += self.close()
        }
        return actions + self.closeIfDrained()
    }

    /// A stream ended on the wire (reset by either side, cancelled): its upload keeps or drops its bytes.
    private mutating func streamEnded(_ id: StreamID, discard: Bool) -> [Action] {
        if let pipeline = self.pipelines[id], pipeline.isOpen {
            return self.abortUpload(id, keepSession: !discard)
        }
        self.streamClosedWhileOpening(id, discard: discard)
        return []
    }

    // MARK: Writing and closing

    /// A frame to write; nothing once the connection is closed, except the ERROR that closes it.
    func write(_ frame: Frame) -> [Action] {
        guard !self.closed || frame.type == .error else { return [] }
        return [.write(frame)]
    }

    /// Frames the state machine produced; an ERROR on stream 0 among them closes the connection.
    mutating func write(_ frames: [Frame]) -> [Action] {
        var actions: [Action] = []
        for frame in frames {
            actions += self.write(frame)
            if case .error(let error) = frame, error.streamID.isConnection {
                actions.append(.log(.info, "closing connection", ["error.code": "\(error.code.name)", "error.message": "\(error.message)"]))
                return actions + self.close()
            }
        }
        return actions
    }

    mutating func close() -> [Action] {
        guard !self.closed else { return [] }
        self.closed = true
        return [.close]
    }

    mutating func failConnection(_ code: WireErrorCode, _ message: String) -> [Action] {
        guard !self.closed else { return [] }
        let log = Action.log(.info, "closing connection", ["error.code": "\(code.name)", "error.message": "\(message)"])
        return [log] + self.write(self.machine.failConnection(code, message)) + self.close()
    }
}
