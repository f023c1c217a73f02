import NIOCore

/// What the agent sends: HELLO, OPEN, reserved credit, CHUNK, HASH, CANCEL (SPEC §2, §4, §5).
extension AgentConnectionStateMachine {
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

    /// Whether a PLAN may go out now: the relay granted QUOTA_PLAN, the connection is up, and no PLAN is unanswered.
    public var canSendPlan: Bool {
        switch self.phase {
        case .ready, .goingAway:
            return self.features.contains(.quotaPlan) && self.unansweredPlan == nil
        case .idle, .helloSent, .closed:
            return false
        }
    }

    /// Asks the relay what a selection would add to the quota use (SPEC §3.15): the PLAN to write, or nil when one may
    /// not go out now (``canSendPlan``) or it has more than ``ProtocolLimits/maxPlanEntries`` entries.
    public mutating func sendPlan(_ plan: Frame.Plan) -> Frame? {
        guard self.canSendPlan, plan.entries.count <= ProtocolLimits.maxPlanEntries else { return nil }
        self.unansweredPlan = (plan.request, plan.entries.count)
        return .plan(plan)
    }

    /// Opens a stream: the OPEN to write, or nil when the connection cannot open one now (check ``canOpenStream``)
    /// or the id is not above every id used so far.
    public mutating func sendOpen(_ open: Frame.Open) -> Frame? {
        guard self.canOpenStream, open.streamID > self.highestStreamID else { return nil }
        // PROBE only while the relay granted the dedup probe (SPEC §7.1).
        if open.probe != nil && !(self.welcome?.features.contains(.dedupProbe) ?? false) { return nil }
        // STRIPED and PART only while the relay granted stripes (SPEC §6.7).
        if (open.striped || open.part != nil) && !(self.welcome?.features.contains(.stripes) ?? false) { return nil }
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
}
