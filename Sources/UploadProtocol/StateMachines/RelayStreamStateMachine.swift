/// One upload as the relay sees it (SPEC §4.4).
///
/// The connection state machine owns one of these per open stream and removes it when the
/// stream closes; closed streams live on only in ``ClosedStreams``.
struct RelayStreamStateMachine: Sendable {
    private enum State: Hashable, Sendable {
        /// OPEN received; the relay is deciding (catalog lookup, quota, dedup). The agent may only CANCEL or ERROR.
        case opening
        /// OFFSET START or RESUME sent: CHUNK frames flow, within credit, at `nextOffset`.
        case receiving
        /// HASH received: the relay verifies and commits; only RESULT or ERROR follows.
        case verifying
    }

    private var state: State = .opening
    let open: Frame.Open
    /// The offset the next CHUNK must carry.
    private(set) var nextOffset: UInt64 = 0
    /// The highest ACK sent.
    private(set) var ackedOffset: UInt64 = 0
    /// The stream's credit window; nil until OFFSET grants it.
    private(set) var window: InboundWindow? = nil

    /// The bytes the stream carries (``Frame/Open/streamLength``), read for every CHUNK.
    private let streamLength: UInt64?

    init(open: Frame.Open) {
        self.open = open
        self.streamLength = open.streamLength
    }

    var id: StreamID { self.open.streamID }

    /// Checks a CHUNK against state, offset, size and stream credit (SPEC §4.4, §5.2).
    mutating func receiveChunk(_ chunk: Frame.Chunk) -> ProtocolError? {
        switch self.state {
        case .opening:
            return .connection(.protocolError, "CHUNK on stream \(self.id) before OFFSET")
        case .verifying:
            return .connection(.protocolError, "CHUNK on stream \(self.id) after HASH")
        case .receiving:
            break
        }
        let length = chunk.payloadLength
        guard chunk.offset == self.nextOffset else {
            return .stream(
                self.id, .invalidOffset, "CHUNK at offset \(chunk.offset); the next expected offset is \(self.nextOffset)"
            )
        }
        if let size = self.streamLength, self.nextOffset + UInt64(length) > size {
            let what = self.open.part != nil ? "the stripe's length" : self.open.striped ? "the first stripe's length" : "the announced size"
            return .stream(
                self.id, .sizeMismatch, "CHUNK ends at \(self.nextOffset + UInt64(length)), beyond \(what) \(size)"
            )
        }
        guard self.window!.receive(length) else {
            return .stream(
                self.id, .flowControlError,
                "CHUNK of \(length) bytes overruns the stream credit of \(self.window!.available) bytes"
            )
        }
        self.nextOffset += UInt64(length)
        return nil
    }

    /// Checks HASH against the bytes received and the OPEN (SPEC §3.8, §8).
    mutating func receiveHash(_ hash: Frame.Hash) -> ProtocolError? {
        switch self.state {
        case .opening:
            return .connection(.protocolError, "HASH on stream \(self.id) before OFFSET")
        case .verifying:
            return .connection(.protocolError, "second HASH on stream \(self.id)")
        case .receiving:
            break
        }
        if self.open.striped {
            // The main stream states the whole blob; it carried the first stripe (SPEC §6.7).
            if let first = self.streamLength, self.nextOffset != first {
                return .stream(self.id, .sizeMismatch, "HASH after \(self.nextOffset) bytes of the first stripe's \(first)")
            }
        } else if hash.size != self.nextOffset {
            return .stream(self.id, .sizeMismatch, "HASH says \(hash.size) bytes but \(self.nextOffset) were sent")
        }
        if let size = self.open.part == nil ? self.open.size : self.streamLength, size != hash.size {
            return .stream(self.id, .sizeMismatch, "HASH says \(hash.size) bytes but OPEN announced \(size)")
        }
        if let sha1 = self.open.sha1, sha1 != hash.sha1 {
            return .stream(self.id, .hashMismatch, "HASH SHA-1 \(hash.sha1) differs from the SHA-1 \(sha1) announced in OPEN")
        }
        self.state = .verifying
        return nil
    }

    /// Whether the relay may still send OFFSET.
    var isOpening: Bool { self.state == .opening }

    /// Records OFFSET START or RESUME: the stream's window opens.
    mutating func sendOffset(_ offset: Frame.Offset, window: Int) {
        precondition(self.state == .opening, "OFFSET sent twice on stream \(self.id)")
        precondition(offset.disposition != .stored && offset.disposition != .confirm, "OFFSET STORED and CONFIRM close the stream")
        self.state = .receiving
        self.nextOffset = offset.offset
        self.ackedOffset = offset.offset
        self.window = InboundWindow(target: window)
    }

    /// Whether an ACK of `offset` says something new; the relay never acknowledges what it has not received.
    mutating func sendAck(_ offset: UInt64) -> Bool {
        precondition(offset <= self.nextOffset, "ACK \(offset) beyond the \(self.nextOffset) bytes received")
        guard self.state != .opening, offset > self.ackedOffset else { return false }
        self.ackedOffset = offset
        return true
    }

    /// Whether RESULT may be sent now (only after HASH).
    var isVerifying: Bool { self.state == .verifying }

    /// Storage consumed `count` bytes of this stream; the stream credit to return, if any.
    mutating func consume(_ count: Int) -> UInt32? {
        self.window?.consume(count)
    }

    /// Bytes received on this stream and not yet consumed by storage.
    var buffered: Int { self.window?.buffered ?? 0 }
}
