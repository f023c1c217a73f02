import NIOCore

/// The relay's side of one connection (SPEC §2, §4, §5): pure state, no I/O.
///
/// Feed it every decoded frame with ``receive(_:)`` and execute the ``RelayAction`` it returns.
/// Tell it what the relay decided with the `send…` methods: each returns the frames to write
/// (or none, when the stream has gone away meanwhile). It never traps on input from the network.
public struct RelayConnectionStateMachine: Sendable {
    private enum Phase: Hashable, Sendable {
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

    private var phase: Phase = .awaitingHello
    private var welcomeSent = false
    private let limits: ProtocolLimits
    private let supportedFeatures: Frame.Features
    private var features: Frame.Features = []
    private var streams: [StreamID: RelayStreamStateMachine] = [:]
    private var closedStreams: ClosedStreams
    private var highestStreamID = StreamID.connection
    private var connectionWindow: InboundWindow
    /// The last stream id of the agent's GOAWAY, once it sent one: it opens no more streams.
    private var agentGoAway: StreamID? = nil
    /// When the last PINGs arrived, oldest first: more than ``maxPingsPerSecond`` in a second is a flood (SPEC §2.3).
    private var pingTimes: [NIODeadline] = []
    /// When the last refusals of OPEN happened, oldest first: more than ``ProtocolLimits/maxRefusalsPerSecond`` in a
    /// second is a flood (SPEC §12.3).
    private var refusalTimes: [NIODeadline] = []

    /// The most PINGs an agent may send in any one second (SPEC §2.3).
    public static let maxPingsPerSecond = 10

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
    public mutating func receive(_ frame: Frame, now: NIODeadline = .now()) -> RelayAction {
        if case .ping = frame, self.isReady {
            if self.pingTimes.count == Self.maxPingsPerSecond {
                if now - self.pingTimes.removeFirst() < .seconds(1) {
                    return self.fail(.enhanceYourCalm, "more than \(Self.maxPingsPerSecond) PINGs in one second")
                }
            }
            self.pingTimes.append(now)
        }
        let action = self.receiveFrame(frame)
        if case .resetStream(let error, _) = action, case .open = frame, let flood = self.countRefusal(error.streamID, now: now) {
            return flood
        }
        return action
    }

    /// Records a refused OPEN; the connection error to send instead when they come faster than the limit
    /// (a sliding second, like PINGs).
    private mutating func countRefusal(_ id: StreamID, now: NIODeadline) -> RelayAction? {
        let limit = max(1, self.limits.maxRefusalsPerSecond)
        if self.refusalTimes.count == limit {
            if now - self.refusalTimes.removeFirst() < .seconds(1) {
                return self.fail(.enhanceYourCalm, "more than \(limit) OPENs refused in one second (the last on stream \(id))")
            }
        }
        self.refusalTimes.append(now)
        return nil
    }

    private mutating func receiveFrame(_ frame: Frame) -> RelayAction {
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

    private mutating func receiveWhenReady(_ frame: Frame) -> RelayAction {
        switch frame {
        case .hello:
            return self.fail(.protocolError, "second HELLO")
        case .welcome, .offset, .ack, .credit, .result:
            return self.fail(.protocolError, "the relay received \(frame.type.name), which only a relay sends")
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

    private mutating func receiveOpen(_ open: Frame.Open) -> RelayAction {
        let id = open.streamID
        guard id > self.highestStreamID else {
            return self.fail(.protocolError, "OPEN on stream \(id), not above the last stream \(self.highestStreamID)")
        }
        if self.agentGoAway != nil {
            return self.fail(.protocolError, "OPEN on stream \(id) after the agent's own GOAWAY")
        }
        self.highestStreamID = id
        if case .goingAway(let last) = self.phase, id > last {
            return self.refuse(id, .refusedStream, "the relay is going away; open stream \(id) on a new connection")
        }
        guard self.streams.count < self.limits.maxConcurrentStreams else {
            return self.refuse(
                id, .refusedStream, "\(self.streams.count) streams are open; the limit is \(self.limits.maxConcurrentStreams)"
            )
        }
        let key: ObjectKey
        do {
            key = try ObjectKey(
                validating: open.rawKey, maxLength: self.limits.maxKeyLength,
                maxSegmentLength: self.limits.maxKeySegmentLength
            )
        } catch {
            return self.refuse(id, .invalidKey, error.reason)
        }
        self.streams[id] = RelayStreamStateMachine(open: open)
        return .openUpload(open, key)
    }

    private mutating func receiveChunk(_ chunk: Frame.Chunk) -> RelayAction {
        let id = chunk.streamID
        let length = chunk.payloadLength
        if chunk.isDeflated && !self.features.contains(.deflate) {
            return self.fail(.protocolError, "DEFLATED CHUNK on stream \(id), but deflate was not negotiated")
        }
        // SPEC §5.2: the connection window first; bytes on a stream we reset still count.
        guard self.connectionWindow.receive(length) else {
            return self.fail(
                .flowControlError,
                "CHUNK of \(length) bytes overruns the connection credit of \(self.connectionWindow.available) bytes"
            )
        }
        guard var stream = self.streams[id] else {
            if let action = self.lateFrame(id, .chunk) {
                return action
            }
            return self.connectionWindow.discard(length).map { .send(.credit(Frame.Credit(streamID: .connection, increment: $0))) } ?? .none
        }
        if let error = stream.receiveChunk(chunk) {
            if case .stream = error.scope {
                return self.reset(error, discarding: length)
            }
            return self.closeConnection(error)
        }
        self.streams[id] = stream
        return .write(chunk)
    }

    private mutating func receiveHash(_ hash: Frame.Hash) -> RelayAction {
        guard var stream = self.streams[hash.streamID] else {
            return self.lateFrame(hash.streamID, .hash) ?? .none
        }
        if let error = stream.receiveHash(hash) {
            if case .stream = error.scope {
                return self.reset(error, discarding: 0)
            }
            return self.closeConnection(error)
        }
        self.streams[hash.streamID] = stream
        return .finish(hash)
    }

    private mutating func receiveClose(
        _ id: StreamID, _ code: WireErrorCode, _ message: String, discard: Bool, type: FrameType
    ) -> RelayAction {
        guard self.streams[id] != nil else {
            return self.lateFrame(id, type) ?? .none
        }
        let credit = self.close(id, .abandoned)
        return .abortUpload(id, code, message, discardSession: discard, connectionCredit: credit)
    }

    /// A frame for a stream that is not open (SPEC §4.4): nil means "discard it".
    private mutating func lateFrame(_ id: StreamID, _ type: FrameType) -> RelayAction? {
        guard id <= self.highestStreamID else {
            return self.fail(.protocolError, "\(type.name) on stream \(id), which was never opened")
        }
        switch self.closedStreams.reason(id) {
        case .finished where type == .cancel || type == .error:
            // It crossed our RESULT or OFFSET STORED (SPEC §4.7).
            return nil
        case .finished, .abandoned:
            return self.fail(.streamClosed, "\(type.name) on stream \(id), which is closed")
        case .resetLocally, nil:
            return nil
        }
    }

    // MARK: Sending

    /// The credential is good: the WELCOME to write, or nil when the connection is no longer authenticating (it
    /// failed meanwhile). The decoder may now accept ``ProtocolLimits/maxFrameSize``. `connectionWindow`, when given,
    /// replaces the configured connection window for this connection (a share of the relay's memory budget).
    public mutating func acceptHello(account: String, connectionWindow: Int? = nil) -> Frame? {
        guard case .authenticating(let hello) = self.phase else { return nil }
        let window = min(max(1, connectionWindow ?? self.limits.connectionWindow), ProtocolLimits.maxWindow)
        self.connectionWindow = InboundWindow(target: window)
        self.phase = .ready
        self.welcomeSent = true
        self.features = hello.features.intersection(self.supportedFeatures)
        return .welcome(
            Frame.Welcome(
                version: ProtocolLimits.supportedVersions.upperBound, maxFrameSize: UInt32(self.limits.maxFrameSize),
                features: self.features, maxStreams: UInt32(self.limits.maxConcurrentStreams),
                connectionWindow: UInt32(window), streamWindow: UInt32(self.limits.streamWindow),
                maxKeyLength: UInt16(self.limits.maxKeyLength),
                idleTimeoutMillis: UInt32(clamping: self.limits.idleTimeout.components.seconds * 1000),
                account: account
            )
        )
    }

    /// The relay gives up on the connection (bad credential, timeout, shutdown): the ERROR to write before closing.
    public mutating func failConnection(_ code: WireErrorCode, _ message: String) -> Frame {
        self.phase = .closed
        self.streams.removeAll()
        return .error(Frame.Error(streamID: .connection, code: code, message: message))
    }

    /// The relay's answer to OPEN. Nil when the stream closed meanwhile (the agent cancelled).
    public mutating func sendOffset(_ offset: Frame.Offset) -> Frame? {
        guard self.isReady, var stream = self.streams[offset.streamID], stream.isOpening else { return nil }
        if offset.disposition == .stored {
            self.holdCredit(self.close(offset.streamID, .finished))
        } else {
            stream.sendOffset(offset, window: self.limits.streamWindow)
            self.streams[offset.streamID] = stream
        }
        return .offset(offset)
    }

    /// Storage has consumed `bytes` of a stream's chunks: the CREDIT frames to write, if any (SPEC §5.3).
    public mutating func storageConsumed(_ id: StreamID, bytes: Int) -> [Frame] {
        guard self.isReady, var stream = self.streams[id] else {
            // The stream was reset; its buffered bytes were returned then.
            return []
        }
        var frames: [Frame] = []
        if let increment = stream.consume(bytes) {
            frames.append(.credit(Frame.Credit(streamID: id, increment: increment)))
        }
        self.streams[id] = stream
        if let increment = self.connectionWindow.consume(bytes) {
            frames.append(.credit(Frame.Credit(streamID: .connection, increment: increment)))
        }
        return frames
    }

    /// Bytes below `offset` are durable: the ACK to write, or nil when there is nothing new to say.
    public mutating func sendAck(_ id: StreamID, offset: UInt64) -> Frame? {
        guard self.isReady, var stream = self.streams[id], stream.sendAck(offset) else { return nil }
        self.streams[id] = stream
        return .ack(Frame.Ack(streamID: id, offset: offset))
    }

    /// The blob is committed: the RESULT to write, which closes the stream. Nil when the stream is gone.
    public mutating func sendResult(_ result: Frame.Result) -> Frame? {
        guard self.isReady, let stream = self.streams[result.streamID], stream.isVerifying else { return nil }
        self.holdCredit(self.close(result.streamID, .finished))
        return .result(result)
    }

    /// A stream finished: the CREDIT(0) that returns every byte storage consumed and the connection has not yet got back,
    /// however few (SPEC §5.4: returned at the latest when a stream closes). Nil when there is none.
    public mutating func flushConnectionCredit() -> Frame? {
        guard self.isReady else { return nil }
        let increment = self.heldCredit + (self.connectionWindow.flush() ?? 0)
        self.heldCredit = 0
        guard increment > 0 else { return nil }
        return .credit(Frame.Credit(streamID: .connection, increment: increment))
    }

    /// Connection credit freed by a stream that closed with RESULT or OFFSET STORED, sent by ``flushConnectionCredit()``
    /// right after that frame (those methods return one frame, as the vectors have it).
    private var heldCredit: UInt32 = 0

    private mutating func holdCredit(_ credit: Frame.Credit?) {
        if let credit { self.heldCredit += credit.increment }
    }

    /// The relay fails one stream (CRC mismatch, storage error, quota, …): the ERROR and any CREDIT to write. A refused
    /// OPEN counts against ``ProtocolLimits/maxRefusalsPerSecond``: past it, the frames close the connection instead.
    public mutating func resetStream(_ id: StreamID, _ code: WireErrorCode, _ message: String, now: NIODeadline = .now()) -> [Frame] {
        guard self.isReady, let stream = self.streams[id] else { return [] }
        if stream.isOpening, case .closeConnection(let error) = self.countRefusal(id, now: now) {
            return [.error(error)]
        }
        var frames: [Frame] = [.error(Frame.Error(streamID: id, code: code, message: message))]
        if let credit = self.close(id, .resetLocally) {
            frames.append(.credit(credit))
        }
        return frames
    }

    /// Graceful shutdown (SPEC §6.4): the GOAWAY to write. Open streams go on; new ones are refused.
    public mutating func sendGoAway(_ code: WireErrorCode = .noError, _ message: String) -> Frame? {
        guard self.isReady else { return nil }
        self.phase = .goingAway(lastStreamID: self.highestStreamID)
        return .goAway(Frame.GoAway(lastStreamID: self.highestStreamID, code: code, message: message))
    }

    // MARK: Helpers

    /// Closes a stream; returns the connection CREDIT for its bytes that storage will now never consume, and for every
    /// consumed byte not yet returned.
    private mutating func close(_ id: StreamID, _ reason: StreamCloseReason) -> Frame.Credit? {
        guard let stream = self.streams.removeValue(forKey: id) else { return nil }
        self.closedStreams.insert(id, reason)
        // SPEC §5.4: the stream's unconsumed bytes, and whatever consumed bytes wait below the batching threshold.
        let buffered = stream.buffered
        guard let increment = buffered > 0 ? self.connectionWindow.discard(buffered) : self.connectionWindow.flush() else { return nil }
        return Frame.Credit(streamID: .connection, increment: increment)
    }

    private mutating func reset(_ error: ProtocolError, discarding length: Int) -> RelayAction {
        guard case .stream(let id) = error.scope else { preconditionFailure("reset of a connection error") }
        var credit = self.close(id, .resetLocally)
        if length > 0, let increment = self.connectionWindow.discard(length) {
            credit = Frame.Credit(streamID: .connection, increment: increment + (credit?.increment ?? 0))
        }
        return .resetStream(Frame.Error(streamID: id, code: error.code, message: error.message), connectionCredit: credit)
    }

    /// Refuses a stream at OPEN: it never held bytes.
    private mutating func refuse(_ id: StreamID, _ code: WireErrorCode, _ message: String) -> RelayAction {
        self.closedStreams.insert(id, .resetLocally)
        return .resetStream(Frame.Error(streamID: id, code: code, message: message), connectionCredit: nil)
    }

    private mutating func fail(_ code: WireErrorCode, _ message: String) -> RelayAction {
        self.closeConnection(.connection(code, message))
    }

    private mutating func closeConnection(_ error: ProtocolError) -> RelayAction {
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
