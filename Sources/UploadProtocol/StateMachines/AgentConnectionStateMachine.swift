/// The agent's side of one connection (SPEC §2, §4, §5): pure state, no I/O.
///
/// Call ``sendHello(_:)`` first, then feed every decoded frame to ``receive(_:)``. Before reading its source
/// for a stream the agent claims credit with ``reserveCredit(on:upTo:)`` (it reads only while it holds credit),
/// sends the CHUNKs it read with ``sendChunk(_:)`` and gives back what it did not use with
/// ``releaseReservation(on:)``. Nothing the relay sends and no order of events can make it trap.
public struct AgentConnectionStateMachine: Sendable {
    private enum Phase: Hashable, Sendable {
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

    private var phase: Phase = .idle
    /// The largest frame the agent announced in HELLO.
    private var announcedFrameSize: Int? = nil
    private let limits: ProtocolLimits
    private var welcome: Frame.Welcome? = nil
    private var streams: [StreamID: AgentStreamStateMachine] = [:]
    private var closedStreams: ClosedStreams
    private var highestStreamID = StreamID.connection
    private var connectionWindow = OutboundWindow(initial: 0)

    public init(limits: ProtocolLimits = .init()) {
        self.limits = limits
        self.closedStreams = ClosedStreams(capacity: limits.closedStreamMemory)
    }

    /// The relay's terms, once WELCOME arrived.
    public var terms: Frame.Welcome? { self.welcome }

    /// Whether the connection is ready and not going away: new streams may open.
    public var canOpenStream: Bool {
        guard case .ready = self.phase, let welcome = self.welcome else { return false }
        return self.streams.count < Int(welcome.maxStreams)
    }

    public var isClosed: Bool { self.phase == .closed }

    /// How many streams are open.
    public var openStreamCount: Int { self.streams.count }

    /// The ids of the open streams.
    public var openStreamIDs: [StreamID] { Array(self.streams.keys).sorted() }

    /// The id the next OPEN should use.
    public var nextStreamID: StreamID { StreamID(rawValue: self.highestStreamID.rawValue + 1) }

    /// Connection credit left.
    public var connectionCredit: Int { self.connectionWindow.available }

    /// The largest CHUNK payload the relay accepts in one frame.
    public var maxChunkPayload: Int {
        ProtocolLimits.maxChunkPayload(frameSize: Int(self.welcome?.maxFrameSize ?? UInt32(ProtocolLimits.initialMaxFrameSize)))
    }

    // MARK: Sending

    /// The largest frame the agent accepts now (SPEC §1.3): its announced maximum once HELLO went out (it sends HELLO
    /// before it receives anything), the initial maximum before. Decoders read it before each frame.
    public var inboundFrameLimit: Int { self.announcedFrameSize ?? ProtocolLimits.initialMaxFrameSize }

    /// The first frame of the connection.
    public mutating func sendHello(_ hello: Frame.Hello) -> Frame {
        precondition(self.phase == .idle, "HELLO sent twice")
        self.phase = .helloSent(hello)
        self.announcedFrameSize = Int(hello.maxFrameSize)
        return .hello(hello)
    }

    /// Opens a stream: the OPEN to write, or nil when the connection cannot open one now (check ``canOpenStream``)
    /// or the id is not above every id used so far.
    public mutating func sendOpen(_ open: Frame.Open) -> Frame? {
        guard self.canOpenStream, open.streamID > self.highestStreamID else { return nil }
        self.highestStreamID = open.streamID
        self.streams[open.streamID] = AgentStreamStateMachine(open: open)
        return .open(open)
    }

    /// How many bytes a CHUNK on `id` may carry now without a reservation: the smaller of the unclaimed stream
    /// and connection credit and one frame.
    public func sendableBytes(on id: StreamID) -> Int {
        min(self.credit(on: id), self.maxChunkPayload)
    }

    /// Unclaimed credit on `id` now: the smaller of stream and connection credit, however many frames it takes.
    public func credit(on id: StreamID) -> Int {
        guard let stream = self.streams[id], stream.isSending, let window = stream.window else { return 0 }
        return min(window.available, self.connectionWindow.available)
    }

    /// The offset the next CHUNK on `id` carries, or nil when the stream is not sending.
    public func nextOffset(on id: StreamID) -> UInt64? {
        guard let stream = self.streams[id], stream.isSending else { return nil }
        return stream.nextOffset
    }

    /// Claims up to `count` bytes of stream and connection credit for a read on `id` (SPEC §5.2): the read may
    /// produce CHUNKs of at most the returned number of raw bytes, however other streams spend credit meanwhile.
    /// Give back what the read did not use with ``releaseReservation(on:)``.
    public mutating func reserveCredit(on id: StreamID, upTo count: Int) -> Int {
        guard var stream = self.streams[id], stream.isSending else { return 0 }
        let claimed = stream.reserve(upTo: min(count, self.connectionWindow.available))
        _ = self.connectionWindow.reserve(upTo: claimed)
        self.streams[id] = stream
        return claimed
    }

    /// Credit claimed on `id` and not yet spent.
    public func reservedCredit(on id: StreamID) -> Int {
        self.streams[id]?.reserved ?? 0
    }

    /// Returns the credit claimed on `id` and not spent to the stream and connection windows.
    public mutating func releaseReservation(on id: StreamID) {
        guard var stream = self.streams[id] else { return }
        self.connectionWindow.release(stream.releaseReservation())
        self.streams[id] = stream
    }

    /// Sends a CHUNK, spending its stream's reservation first, then unclaimed credit.
    public mutating func sendChunk(_ chunk: Frame.Chunk) -> AgentSendDecision {
        guard var stream = self.streams[chunk.streamID], stream.isSending else { return .streamGone }
        if let reason = stream.refusal(of: chunk) {
            return .refused(reason)
        }
        let fromReservation = min(chunk.payloadLength, stream.reserved)
        let rest = chunk.payloadLength - fromReservation
        guard rest <= self.connectionWindow.available else {
            return .refused(
                "CHUNK of \(chunk.payloadLength) bytes on stream \(chunk.streamID) with \(fromReservation + self.connectionWindow.available) bytes of connection credit"
            )
        }
        self.connectionWindow.take(chunk.payloadLength)
        stream.sendChunk(chunk)
        self.streams[chunk.streamID] = stream
        return .send(.chunk(chunk))
    }

    /// Ends the data of a stream; gives back any credit still claimed on it.
    public mutating func sendHash(_ hash: Frame.Hash) -> AgentSendDecision {
        guard var stream = self.streams[hash.streamID], stream.isSending else { return .streamGone }
        if let reason = stream.refusal(of: hash) {
            return .refused(reason)
        }
        self.connectionWindow.release(stream.releaseReservation())
        stream.sendHash(hash)
        self.streams[hash.streamID] = stream
        return .send(.hash(hash))
    }

    /// Abandons an upload: the CANCEL to write, or nil when the stream is already closed.
    public mutating func sendCancel(_ id: StreamID, _ code: WireErrorCode = .cancelled, _ message: String) -> Frame? {
        guard self.streams[id] != nil else { return nil }
        self.close(id, .resetLocally)
        return .cancel(Frame.Cancel(streamID: id, code: code, message: message))
    }

    /// The agent gives up on the connection: the ERROR to write before closing.
    public mutating func failConnection(_ code: WireErrorCode, _ message: String) -> Frame {
        self.phase = .closed
        self.streams.removeAll()
        return .error(Frame.Error(streamID: .connection, code: code, message: message))
    }

    // MARK: Receiving

    /// Takes one frame from the relay.
    public mutating func receive(_ frame: Frame) -> AgentAction {
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

    private mutating func receiveWhenReady(_ frame: Frame) -> AgentAction {
        switch frame {
        case .welcome:
            return self.fail(.protocolError, "second WELCOME")
        case .hello, .open, .chunk, .hash, .cancel:
            return self.fail(.protocolError, "the agent received \(frame.type.name), which only an agent sends")
        case .offset(let offset):
            return self.withStream(offset.streamID, .offset) { stream, machine in
                if let error = stream.receiveOffset(offset, initialWindow: Int(machine.welcome?.streamWindow ?? 0)) {
                    return .failure(error)
                }
                if offset.disposition == .stored {
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

    private enum StreamOutcome {
        case keep(AgentAction)
        case close(AgentAction)
        case failure(ProtocolError)
    }

    private mutating func withStream(
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

    private mutating func close(_ id: StreamID, _ reason: StreamCloseReason) {
        if var stream = self.streams.removeValue(forKey: id) {
            self.connectionWindow.release(stream.releaseReservation())
        }
        self.closedStreams.insert(id, reason)
    }

    private mutating func fail(_ code: WireErrorCode, _ message: String) -> AgentAction {
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
