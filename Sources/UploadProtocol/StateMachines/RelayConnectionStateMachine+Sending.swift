import NIOCore

/// What the relay decided, turned into frames (SPEC §4, §5, §6).
extension RelayConnectionStateMachine {
    // MARK: Sending

    /// The credential is good: the WELCOME to write, or nil when the connection is no longer authenticating (it
    /// failed meanwhile). The decoder may now accept ``ProtocolLimits/maxFrameSize``. `connectionWindow`, when given,
    /// replaces the configured connection window for this connection (a share of the relay's memory budget).
    /// `withholding` names supported features this account is not granted (QUOTA_PLAN for an account with no quota,
    /// SPEC §7.2).
    public mutating func acceptHello(account: String, connectionWindow: Int? = nil, withholding: Frame.Features = []) -> Frame? {
        guard case .authenticating(let hello) = self.phase else { return nil }
        let window = min(max(1, connectionWindow ?? self.limits.connectionWindow), ProtocolLimits.maxWindow)
        self.connectionWindow = InboundWindow(target: window)
        self.welcomeConnectionWindow = window
        self.phase = .ready
        self.welcomeSent = true
        self.features = hello.features.intersection(self.supportedFeatures).subtracting(withholding)
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

    /// The connection window's size now: the most chunk bytes the agent may make the relay hold (SPEC §5.5).
    public var connectionWindowSize: Int { self.connectionWindow.target }

    /// What the agent may still make the relay hold: its connection credit and the chunk bytes not yet consumed.
    /// Above ``connectionWindowSize`` while a smaller size keeps credit back.
    public var connectionWindowOutstanding: Int { self.connectionWindow.outstanding }

    /// Resizes the connection window (SPEC §5.5), never below the smaller of WELCOME's window and
    /// ``ProtocolLimits/smallestResizedWindow``; credit follows as storage consumes (``storageConsumed(_:bytes:)``).
    /// Nothing before WELCOME.
    public mutating func resizeConnectionWindow(to size: Int) {
        guard self.isReady else { return }
        self.connectionWindow.resize(to: max(size, min(self.welcomeConnectionWindow, ProtocolLimits.smallestResizedWindow)))
    }

    /// The relay's answer to the unanswered PLAN; nil when the connection closed meanwhile, or when `room` does not
    /// answer that PLAN (its request or its number of needs differ).
    public mutating func sendRoom(_ room: Frame.Room) -> Frame? {
        guard self.isReady, let plan = self.unansweredPlan, plan.request == room.request, plan.count == room.needs.count else {
            return nil
        }
        self.unansweredPlan = nil
        return .room(room)
    }

    /// The relay gives up on the connection (bad credential, timeout, shutdown): the ERROR to write before closing.
    public mutating func failConnection(_ code: WireErrorCode, _ message: String) -> Frame {
        self.phase = .closed
        self.streams.removeAll()
        return .error(Frame.Error(streamID: .connection, code: code, message: message))
    }

    /// The relay's answer to OPEN. Nil when the stream closed meanwhile (the agent cancelled), or for CONFIRM to an OPEN
    /// without PROBE (SPEC §3.4).
    public mutating func sendOffset(_ offset: Frame.Offset) -> Frame? {
        guard self.isReady, var stream = self.streams[offset.streamID], stream.isOpening else { return nil }
        if offset.disposition == .confirm && stream.open.probe == nil { return nil }
        if offset.disposition == .stored || offset.disposition == .confirm {
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

    mutating func holdCredit(_ credit: Frame.Credit?) {
        if let credit { self.heldCredit += credit.increment }
    }

    /// The relay fails one stream (CRC mismatch, storage error, quota, …): the ERROR and any CREDIT to write. A refused
    /// OPEN counts against ``ProtocolLimits/maxRefusalsPerSecond``: past it, the frames close the connection instead.
    public mutating func resetStream(_ id: StreamID, _ code: WireErrorCode, _ message: String, now: NIODeadline) -> [Frame] {
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
}
