/// One upload as the agent sees it (SPEC §4.5).
struct AgentStreamStateMachine: Sendable {
    private enum State: Hashable, Sendable {
        /// OPEN sent; waiting for OFFSET (or ERROR).
        case opening
        /// OFFSET START or RESUME received: CHUNKs go out while credit lasts.
        case sending
        /// HASH sent: waiting for a RESULT that repeats its size and SHA-1; ACK and CREDIT may still arrive.
        case awaitingResult(Frame.Hash)
    }

    private var state: State = .opening
    let open: Frame.Open
    /// The offset the next CHUNK carries.
    private(set) var nextOffset: UInt64 = 0
    /// The highest ACK received.
    private(set) var ackedOffset: UInt64 = 0
    /// Stream credit; nil before OFFSET.
    private(set) var window: OutboundWindow? = nil

    /// The bytes the stream carries (``Frame/Open/streamLength``), read for every CHUNK.
    private let streamLength: UInt64?

    init(open: Frame.Open) {
        self.open = open
        self.streamLength = open.streamLength
    }

    var id: StreamID { self.open.streamID }

    var isSending: Bool { self.state == .sending }

    mutating func receiveOffset(_ offset: Frame.Offset, initialWindow: Int) -> ProtocolError? {
        guard self.state == .opening else {
            return .connection(.protocolError, "second OFFSET on stream \(self.id)")
        }
        // A striped upload's streams carry their stripe only (SPEC §6.7).
        if let size = offset.disposition == .stored && self.open.part == nil ? self.open.size : self.streamLength, offset.offset > size {
            return .connection(.protocolError, "OFFSET \(offset.offset) on stream \(self.id) is beyond the size \(size)")
        }
        if offset.disposition == .confirm && self.open.probe == nil {
            return .connection(.protocolError, "OFFSET CONFIRM on stream \(self.id), whose OPEN had no PROBE")
        }
        if offset.disposition == .stored, let size = self.open.part == nil ? self.open.size : self.streamLength, offset.offset != size {
            return .connection(
                .protocolError, "OFFSET STORED on stream \(self.id) says \(offset.offset) bytes; OPEN announced \(size)"
            )
        }
        self.state = .sending
        self.nextOffset = offset.offset
        self.ackedOffset = offset.offset
        self.window = OutboundWindow(initial: initialWindow)
        return nil
    }

    mutating func receiveAck(_ ack: Frame.Ack) -> ProtocolError? {
        guard self.state != .opening else {
            return .connection(.protocolError, "ACK on stream \(self.id) before OFFSET")
        }
        guard ack.offset <= self.nextOffset else {
            return .connection(
                .protocolError, "ACK \(ack.offset) on stream \(self.id) is beyond the \(self.nextOffset) bytes sent"
            )
        }
        guard ack.offset > self.ackedOffset else {
            return .connection(
                .protocolError, "ACK \(ack.offset) on stream \(self.id) does not advance the last ACK \(self.ackedOffset)"
            )
        }
        self.ackedOffset = ack.offset
        return nil
    }

    mutating func receiveCredit(_ credit: Frame.Credit) -> ProtocolError? {
        guard self.state != .opening else {
            return .connection(.protocolError, "CREDIT on stream \(self.id) before OFFSET")
        }
        guard self.window?.grant(credit.increment) ?? false else {
            return .stream(
                self.id, .flowControlError,
                "CREDIT of \(credit.increment) bytes makes the stream window of \((self.window?.available ?? 0) + self.reserved) pass 2^31-1"
            )
        }
        return nil
    }

    func checkResult(_ result: Frame.Result) -> ProtocolError? {
        guard case .awaitingResult(let hash) = self.state else {
            return .connection(.protocolError, "RESULT on stream \(self.id) before HASH")
        }
        guard Array(result.key.utf8) == self.open.rawKey else {
            return .connection(.protocolError, "RESULT on stream \(self.id) names key \"\(result.key)\", not the key it opened")
        }
        guard result.size == hash.size, result.sha1 == hash.sha1 else {
            return .connection(
                .protocolError,
                "RESULT on stream \(self.id) reports \(result.size) bytes with SHA-1 \(result.sha1); HASH sent \(hash.size) bytes with \(hash.sha1)"
            )
        }
        return nil
    }

    /// Claims up to `count` bytes of stream credit for a read; returns how many were claimed.
    mutating func reserve(upTo count: Int) -> Int {
        guard self.state == .sending, self.window != nil else { return 0 }
        return self.window!.reserve(upTo: count)
    }

    /// Credit claimed on this stream and not yet spent.
    var reserved: Int { self.window?.reserved ?? 0 }

    /// Gives back every byte of stream credit claimed and not spent; returns how many.
    mutating func releaseReservation() -> Int {
        guard let reserved = self.window?.reserved, reserved > 0 else { return 0 }
        self.window!.release(reserved)
        return reserved
    }

    /// Why the agent cannot send `chunk` now, or nil when it can (nothing changes then).
    func refusal(of chunk: Frame.Chunk) -> String? {
        guard self.state == .sending, let window = self.window else {
            return "CHUNK on stream \(self.id) outside the sending state"
        }
        guard chunk.offset == self.nextOffset else {
            return "CHUNK at \(chunk.offset) on stream \(self.id), expected \(self.nextOffset)"
        }
        if let size = self.streamLength, chunk.offset + UInt64(chunk.payloadLength) > size {
            return "CHUNK ends at \(chunk.offset + UInt64(chunk.payloadLength)) on stream \(self.id), beyond the size \(size)"
        }
        guard chunk.payloadLength > 0 else {
            return "empty CHUNK on stream \(self.id)"
        }
        guard chunk.payloadLength <= window.reserved + window.available else {
            return "CHUNK of \(chunk.payloadLength) bytes on stream \(self.id) with \(window.reserved + window.available) bytes of credit"
        }
        return nil
    }

    /// Sends a CHUNK that ``refusal(of:)`` allowed: spends the reservation first, then unclaimed credit.
    mutating func sendChunk(_ chunk: Frame.Chunk) {
        self.window?.take(chunk.payloadLength)
        self.nextOffset += UInt64(chunk.payloadLength)
    }

    /// Why the agent cannot send `hash` now, or nil when it can.
    func refusal(of hash: Frame.Hash) -> String? {
        guard self.state == .sending else {
            return "HASH on stream \(self.id) outside the sending state"
        }
        if self.open.striped {
            // The main stream of a striped upload states the whole blob, having sent its first stripe (SPEC §6.7).
            guard hash.size == self.open.size, self.nextOffset == self.streamLength else {
                return "HASH size \(hash.size) on striped stream \(self.id) after \(self.nextOffset) bytes sent"
            }
            return nil
        }
        guard hash.size == self.nextOffset else {
            return "HASH size \(hash.size) on stream \(self.id), but \(self.nextOffset) bytes were sent"
        }
        return nil
    }

    mutating func sendHash(_ hash: Frame.Hash) {
        self.state = .awaitingResult(hash)
    }
}
