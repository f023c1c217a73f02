import NIOCore

/// The agent's side of one connection (SPEC §2, §4, §5): pure state, no I/O.
///
/// Call ``sendHello(_:)`` first, then feed every decoded frame to ``receive(_:)``. Before reading its source
/// for a stream the agent claims credit with ``reserveCredit(on:upTo:)`` (it reads only while it holds credit),
/// sends the CHUNKs it read with ``sendChunk(_:)`` and gives back what it did not use with
/// ``releaseReservation(on:)``. Nothing the relay sends and no order of events can make it trap.
public struct AgentConnectionStateMachine: Sendable {
    enum Phase: Hashable, Sendable {
        /// Nothing sent yet.
        case idle
        /// HELLO sent; only WELCOME or ERROR may arrive.
        case helloSent(Frame.Hello)
        /// WELCOME received: streams open and close.
        case ready
        /// GOAWAY received: no new streams; open ones continue until the relay closes.
        case goingAway(lastStreamID: StreamID)
        /// An ERROR on stream 0 went either way.
        case closed
    }

    var phase: Phase = .idle
    /// The largest frame the agent announced in HELLO.
    var announcedFrameSize: Int? = nil
    let limits: ProtocolLimits
    var welcome: Frame.Welcome? = nil
    var streams: [StreamID: AgentStreamStateMachine] = [:]
    var closedStreams: ClosedStreams
    var highestStreamID = StreamID.connection
    var connectionWindow = OutboundWindow(initial: 0)
    /// The PLAN the relay has not answered yet: its request and entry count (SPEC §3.15, one at a time).
    var unansweredPlan: (request: UInt32, count: Int)? = nil
    /// When the relay's last PINGs arrived: more than ten a second is a flood (SPEC §2.3).
    var pings = PingRate()

    public init(limits: ProtocolLimits = .init()) {
        self.limits = limits
        self.closedStreams = ClosedStreams(capacity: limits.closedStreamMemory)
    }

    /// The relay's terms, once WELCOME arrived.
    public var terms: Frame.Welcome? { self.welcome }

    /// Whether the connection is ready and not going away: new streams may open.
    /// The features in force: those WELCOME granted (none before it).
    public var features: Frame.Features { self.welcome?.features ?? [] }

    public var canOpenStream: Bool {
        guard case .ready = self.phase, let welcome = self.welcome, !self.streamIDsExhausted else { return false }
        return self.streams.count < Int(welcome.maxStreams)
    }

    /// Every stream id was used (SPEC §1.5: the largest is 2^31-1): no stream opens here any more, and new uploads
    /// need a new connection.
    public var streamIDsExhausted: Bool { self.highestStreamID == StreamID.maxID }

    public var isClosed: Bool { self.phase == .closed }

    /// How many streams are open.
    public var openStreamCount: Int { self.streams.count }

    /// The ids of the open streams.
    public var openStreamIDs: [StreamID] { Array(self.streams.keys).sorted() }

    /// The id the next OPEN should use (the largest once ``streamIDsExhausted``, which ``sendOpen(_:)`` refuses).
    public var nextStreamID: StreamID { StreamID(rawValue: min(self.highestStreamID.rawValue + 1, StreamID.maxID.rawValue)) }

    /// Connection credit left.
    public var connectionCredit: Int { self.connectionWindow.available }

    /// The largest CHUNK payload the relay accepts in one frame.
    public var maxChunkPayload: Int {
        ProtocolLimits.maxChunkPayload(frameSize: Int(self.welcome?.maxFrameSize ?? UInt32(ProtocolLimits.initialMaxFrameSize)))
    }

    // MARK: Receiving

    /// Takes one frame from the relay; `now` is injected so that the PING rate limit is testable.
    public mutating func receive(_ frame: Frame, now: NIODeadline) -> AgentAction {
        // A relay flooding PINGs is told to calm down and left, as the relay does to agents (SPEC §2.3).
        if case .ping = frame, self.phase != .closed, !self.pings.admit(now: now) {
            return self.fail(.enhanceYourCalm, "the relay sent more than \(PingRate.limit) PINGs in one second")
        }
        if case .error(let error) = frame, error.streamID.isConnection {
            guard self.phase != .closed else { return .none }
            self.phase = .closed
            self.streams.removeAll()
            return .peerClosed(error.code, error.message)
        }
        switch self.phase {
        case .closed:
            return .none
        case .idle:
            return self.fail(.protocolError, "\(frame.type.name) before HELLO was sent")
        case .helloSent(let hello):
            guard case .welcome(let welcome) = frame else {
                return self.fail(.protocolError, "expected WELCOME, got \(frame.type.name)")
            }
            guard welcome.version >= hello.minVersion && welcome.version <= hello.maxVersion else {
                return self.fail(
                    .protocolError,
                    "relay chose version \(welcome.version); the agent offered \(hello.minVersion)...\(hello.maxVersion)"
                )
            }
            guard hello.features.isSuperset(of: welcome.features) else {
                return self.fail(
                    .protocolError,
                    "WELCOME features 0x\(String(welcome.features.rawValue, radix: 16)) were not all offered in HELLO"
                )
            }
            self.welcome = welcome
            self.connectionWindow = OutboundWindow(initial: Int(welcome.connectionWindow))
            self.phase = .ready
            return .connected(welcome)
        case .ready, .goingAway:
            return self.receiveWhenReady(frame)
        }
    }

    mutating func receiveWhenReady(_ frame: Frame) -> AgentAction {
        switch frame {
        case .welcome:
            return self.fail(.protocolError, "second WELCOME")
        case .hello, .open, .chunk, .hash, .cancel, .plan:
            return self.fail(.protocolError, "the agent received \(frame.type.name), which only an agent sends")
        case .room(let room):
            guard let plan = self.unansweredPlan else {
                return self.fail(.protocolError, "ROOM, but no PLAN is unanswered")
            }
            guard room.request == plan.request, room.needs.count == plan.count else {
                return self.fail(
                    .protocolError,
                    "ROOM answers request \(room.request) with \(room.needs.count) needs; the PLAN was request \(plan.request) with \(plan.count) entries"
                )
            }
            self.unansweredPlan = nil
            return .room(room)
        case .offset(let offset):
            return self.withStream(offset.streamID, .offset) { stream, machine in
                if let error = stream.receiveOffset(offset, initialWindow: Int(machine.welcome?.streamWindow ?? 0)) {
                    return .failure(error)
                }
                if offset.disposition == .stored || offset.disposition == .confirm {
                    return .close(.offset(offset))
                }
                return .keep(.offset(offset))
            }
        case .ack(let ack):
            return self.withStream(ack.streamID, .ack) { stream, _ in
                stream.receiveAck(ack).map { .failure($0) } ?? .keep(.acknowledged(ack.streamID, offset: ack.offset))
            }
        case .credit(let credit) where credit.streamID.isConnection:
            guard self.connectionWindow.grant(credit.increment) else {
                return self.fail(
                    .flowControlError,
                    "CREDIT of \(credit.increment) bytes makes the connection window of \(self.connectionWindow.available) pass 2^31-1"
                )
            }
            return .creditGranted(.connection)
        case .credit(let credit):
            return self.withStream(credit.streamID, .credit) { stream, _ in
                stream.receiveCredit(credit).map { .failure($0) } ?? .keep(.creditGranted(credit.streamID))
            }
        case .result(let result):
            return self.withStream(result.streamID, .result) { stream, _ in
                stream.checkResult(result).map { .failure($0) } ?? .close(.completed(result))
            }
        case .error(let error):
            return self.withStream(error.streamID, .error) { _, _ in
                .close(.streamFailed(error.streamID, error.code, error.message))
            }
        case .ping(let ping):
            return .send(.pong(Frame.Pong(data: ping.data)))
        case .pong, .extension:
            return .none
        case .goAway(let goAway):
            if case .goingAway(let last) = self.phase, goAway.lastStreamID > last {
                return self.fail(
                    .protocolError, "second GOAWAY raises the last stream id from \(last) to \(goAway.lastStreamID)"
                )
            }
            self.phase = .goingAway(lastStreamID: goAway.lastStreamID)
            // Streams above lastStreamID were not processed: refused, retried on a new connection (SPEC §6.5).
            for id in self.streams.keys where id > goAway.lastStreamID {
                self.close(id, .resetLocally)
            }
            return .goingAway(goAway)
        }
    }

    enum StreamOutcome {
        case keep(AgentAction)
        case close(AgentAction)
        case failure(ProtocolError)
    }

    mutating func withStream(
        _ id: StreamID, _ type: FrameType,
        _ body: (inout AgentStreamStateMachine, AgentConnectionStateMachine) -> StreamOutcome
    ) -> AgentAction {
        guard var stream = self.streams[id] else {
            guard id <= self.highestStreamID else {
                return self.fail(.protocolError, "\(type.name) on stream \(id), which was never opened")
            }
            switch self.closedStreams.reason(id) {
            case .finished, .abandoned:
                return self.fail(.streamClosed, "\(type.name) on stream \(id), which is closed")
            case .resetLocally, nil:
                return .none
            }
        }
        switch body(&stream, self) {
        case .keep(let action):
            self.streams[id] = stream
            return action
        case .close(let action):
            self.close(id, .finished)
            return action
        case .failure(let error):
            switch error.scope {
            case .connection:
                return self.fail(error.code, error.message)
            case .stream(let id):
                self.close(id, .resetLocally)
                return .resetStream(Frame.Error(streamID: id, code: error.code, message: error.message))
            }
        }
    }

    mutating func close(_ id: StreamID, _ reason: StreamCloseReason) {
        if var stream = self.streams.removeValue(forKey: id) {
            self.connectionWindow.release(stream.releaseReservation())
        }
        self.closedStreams.insert(id, reason)
    }

    mutating func fail(_ code: WireErrorCode, _ message: String) -> AgentAction {
        self.phase = .closed
        self.streams.removeAll()
        return .closeConnection(Frame.Error(streamID: .connection, code: code, message: message))
    }

    /// A frame the decoder refused: the connection error to send (SPEC §1).
    public mutating func decodingFailed(_ error: ProtocolError) -> AgentAction {
        guard self.phase != .closed else { return .none }
        return self.fail(error.code, error.message)
    }
}
