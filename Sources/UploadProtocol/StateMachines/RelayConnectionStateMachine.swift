import NIOCore

/// The relay's side of one connection (SPEC §2, §4, §5): pure state, no I/O.
///
/// Feed it every decoded frame with ``receive(_:)`` and execute the ``RelayAction`` it returns.
/// Tell it what the relay decided with the `send…` methods: each returns the frames to write
/// (or none, when the stream has gone away meanwhile). It never traps on input from the network.
public struct RelayConnectionStateMachine: Sendable {
    enum Phase: Hashable, Sendable {
        /// The connection is new: the first frame must be HELLO.
        case awaitingHello
        /// HELLO arrived; the relay checks the credential. The agent may send nothing until WELCOME.
        case authenticating(Frame.Hello)
        /// WELCOME sent: streams open and close.
        case ready
        /// GOAWAY sent: streams up to `lastStreamID` go on; new ones are refused.
        case goingAway(lastStreamID: StreamID)
        /// An ERROR on stream 0 went either way: every frame is ignored.
        case closed
    }

    var phase: Phase = .awaitingHello
    var welcomeSent = false
    let limits: ProtocolLimits
    let supportedFeatures: Frame.Features
    var features: Frame.Features = []
    var streams: [StreamID: RelayStreamStateMachine] = [:]
    var closedStreams: ClosedStreams
    var highestStreamID = StreamID.connection
    var connectionWindow: InboundWindow
    /// The connection window WELCOME granted: a resize goes no lower than it or 64 KiB, whichever is smaller (SPEC §5.5).
    var welcomeConnectionWindow = 0
    /// The last stream id of the agent's GOAWAY, once it sent one: it opens no more streams.
    var agentGoAway: StreamID? = nil
    /// When the last PINGs arrived, oldest first: more than ``maxPingsPerSecond`` in a second is a flood (SPEC §2.3).
    var pings = PingRate()
    /// When the last refusals of OPEN happened, oldest first: more than ``ProtocolLimits/maxRefusalsPerSecond`` in a
    /// second is a flood (SPEC §12.3).
    var refusalTimes: [NIODeadline] = []
    /// Connection credit freed by a stream that closed with RESULT or OFFSET STORED, sent by ``flushConnectionCredit()``
    /// right after that frame (those methods return one frame, as the vectors have it).
    var heldCredit: UInt32 = 0
    /// The PLAN the relay has not answered yet: its request and entry count (SPEC §3.15, one at a time).
    var unansweredPlan: (request: UInt32, count: Int)? = nil

    /// The most PINGs an agent may send in any one second (SPEC §2.3).
    public static let maxPingsPerSecond = PingRate.limit

    /// - Parameters:
    ///   - limits: windows, stream count, key rules (SPEC §12).
    ///   - supportedFeatures: what the relay grants when the agent offers it (SPEC §9).
    public init(limits: ProtocolLimits = .init(), supportedFeatures: Frame.Features = .known) {
        self.limits = limits
        self.supportedFeatures = supportedFeatures
        self.closedStreams = ClosedStreams(capacity: limits.closedStreamMemory)
        self.connectionWindow = InboundWindow(target: limits.connectionWindow)
    }

    /// Whether WELCOME went out and the connection has not failed.
    public var isReady: Bool {
        switch self.phase {
        case .ready, .goingAway: return true
        case .awaitingHello, .authenticating, .closed: return false
        }
    }

    /// Whether the connection has closed with an error.
    public var isClosed: Bool { self.phase == .closed }

    /// The largest frame the relay accepts now (SPEC §1.3): the initial maximum until WELCOME went out, then the
    /// relay's announced maximum. Decoders read it before each frame.
    public var inboundFrameLimit: Int { self.welcomeSent ? self.limits.maxFrameSize : ProtocolLimits.initialMaxFrameSize }

    /// How many streams are open.
    public var openStreamCount: Int { self.streams.count }

    /// The ids of the open streams.
    public var openStreamIDs: [StreamID] { Array(self.streams.keys).sorted() }

    /// Whether the agent sent GOAWAY: it opens no more streams.
    public var agentGoingAway: Bool { self.agentGoAway != nil }

    /// Whether stream `id` is open and waiting for the relay's OFFSET.
    public func isOpening(_ id: StreamID) -> Bool {
        self.streams[id]?.isOpening ?? false
    }

    /// The features in force (after WELCOME).
    public var negotiatedFeatures: Frame.Features { self.features }

    /// Chunk bytes received and not yet consumed by storage on the whole connection.
    public var bufferedBytes: Int { self.connectionWindow.buffered }

    // MARK: Receiving

    /// Takes one frame from the agent; `now` is injected so that rate limits are testable.
    public mutating func receive(_ frame: Frame, now: NIODeadline) -> RelayAction {
        if case .ping = frame, self.isReady {
            guard self.pings.admit(now: now) else {
                return self.fail(.enhanceYourCalm, "more than \(Self.maxPingsPerSecond) PINGs in one second")
            }
        }
        let action = self.receiveFrame(frame)
        if case .resetStream(let error, _) = action, case .open = frame, let flood = self.countRefusal(error.streamID, now: now) {
            return flood
        }
        return action
    }

    /// Records a refused OPEN; the connection error to send instead when they come faster than the limit
    /// (a sliding second, like PINGs).
    mutating func countRefusal(_ id: StreamID, now: NIODeadline) -> RelayAction? {
        let limit = max(1, self.limits.maxRefusalsPerSecond)
        if self.refusalTimes.count == limit {
            if now - self.refusalTimes.removeFirst() < .seconds(1) {
                return self.fail(.enhanceYourCalm, "more than \(limit) OPENs refused in one second (the last on stream \(id))")
            }
        }
        self.refusalTimes.append(now)
        return nil
    }

    mutating func receiveFrame(_ frame: Frame) -> RelayAction {
        if case .error(let error) = frame, error.streamID.isConnection {
            guard self.phase != .closed else { return .none }
            self.phase = .closed
            return .peerClosed(error.code, error.message)
        }
        switch self.phase {
        case .closed:
            return .none
        case .awaitingHello:
            guard case .hello(let hello) = frame else {
                return self.fail(.protocolError, "expected HELLO as the first frame, got \(frame.type.name)")
            }
            guard hello.minVersion <= ProtocolLimits.supportedVersions.upperBound,
                hello.maxVersion >= ProtocolLimits.supportedVersions.lowerBound
            else {
                return self.fail(
                    .unsupportedVersion,
                    "agent speaks versions \(hello.minVersion)...\(hello.maxVersion); this relay speaks \(ProtocolLimits.supportedVersions.lowerBound)...\(ProtocolLimits.supportedVersions.upperBound)"
                )
            }
            switch hello.authMethod {
            case .bearerToken where hello.credential.isEmpty:
                return self.fail(.unauthenticated, "HELLO carries an empty token (check --token or UPLOAD_TOKEN)")
            case .bearerToken:
                break
            default:
                return self.fail(
                    .unauthenticated, "authentication method \(hello.authMethod.rawValue) is not supported; use a bearer token (1)"
                )
            }
            self.phase = .authenticating(hello)
            return .authenticate(hello)
        case .authenticating:
            return self.fail(.protocolError, "\(frame.type.name) before WELCOME")
        case .ready, .goingAway:
            return self.receiveWhenReady(frame)
        }
    }

    mutating func receiveWhenReady(_ frame: Frame) -> RelayAction {
        switch frame {
        case .hello:
            return self.fail(.protocolError, "second HELLO")
        case .welcome, .offset, .ack, .credit, .result, .room:
            return self.fail(.protocolError, "the relay received \(frame.type.name), which only a relay sends")
        case .plan(let plan):
            guard self.features.contains(.quotaPlan) else {
                return self.fail(.protocolError, "PLAN, but QUOTA_PLAN is not in force on this connection")
            }
            guard self.unansweredPlan == nil else {
                return self.fail(.protocolError, "PLAN while an earlier PLAN is unanswered (one at a time)")
            }
            self.unansweredPlan = (plan.request, plan.entries.count)
            return .plan(plan)
        case .open(let open):
            return self.receiveOpen(open)
        case .chunk(let chunk):
            return self.receiveChunk(chunk)
        case .hash(let hash):
            return self.receiveHash(hash)
        case .cancel(let cancel):
            return self.receiveClose(cancel.streamID, cancel.code, cancel.message, discard: true, type: .cancel)
        case .error(let error):
            return self.receiveClose(error.streamID, error.code, error.message, discard: false, type: .error)
        case .ping(let ping):
            return .send(.pong(Frame.Pong(data: ping.data)))
        case .pong, .extension:
            return .none
        case .goAway(let goAway):
            if let last = self.agentGoAway, goAway.lastStreamID > last {
                return self.fail(.protocolError, "second GOAWAY raises the last stream id from \(last) to \(goAway.lastStreamID)")
            }
            self.agentGoAway = goAway.lastStreamID
            return .peerGoingAway(goAway)
        }
    }

    // MARK: Helpers

    /// Closes a stream; returns the connection CREDIT for its bytes that storage will now never consume, and for every
    /// consumed byte not yet returned.
    mutating func close(_ id: StreamID, _ reason: StreamCloseReason) -> Frame.Credit? {
        guard let stream = self.streams.removeValue(forKey: id) else { return nil }
        self.closedStreams.insert(id, reason)
        // SPEC §5.4: the stream's unconsumed bytes, and whatever consumed bytes wait below the batching threshold.
        let buffered = stream.buffered
        guard let increment = buffered > 0 ? self.connectionWindow.discard(buffered) : self.connectionWindow.flush() else { return nil }
        return Frame.Credit(streamID: .connection, increment: increment)
    }

    mutating func reset(_ error: ProtocolError, discarding length: Int) -> RelayAction {
        guard case .stream(let id) = error.scope else { preconditionFailure("reset of a connection error") }
        var credit = self.close(id, .resetLocally)
        if length > 0, let increment = self.connectionWindow.discard(length) {
            credit = Frame.Credit(streamID: .connection, increment: increment + (credit?.increment ?? 0))
        }
        return .resetStream(Frame.Error(streamID: id, code: error.code, message: error.message), connectionCredit: credit)
    }

    /// Refuses a stream at OPEN: it never held bytes.
    mutating func refuse(_ id: StreamID, _ code: WireErrorCode, _ message: String) -> RelayAction {
        self.closedStreams.insert(id, .resetLocally)
        return .resetStream(Frame.Error(streamID: id, code: code, message: message), connectionCredit: nil)
    }

    mutating func fail(_ code: WireErrorCode, _ message: String) -> RelayAction {
        self.closeConnection(.connection(code, message))
    }

    mutating func closeConnection(_ error: ProtocolError) -> RelayAction {
        self.phase = .closed
        self.streams.removeAll()
        return .closeConnection(Frame.Error(streamID: .connection, code: error.code, message: error.message))
    }

    /// A frame the decoder refused: the connection error to send (SPEC §1).
    public mutating func decodingFailed(_ error: ProtocolError) -> RelayAction {
        guard self.phase != .closed else { return .none }
        return self.closeConnection(error)
    }
}
