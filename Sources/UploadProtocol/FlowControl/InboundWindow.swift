/// The receiving side of one credit window: the relay's view of a stream or of the connection (SPEC §5).
///
/// Bytes move through three counts: the peer's `available` credit, bytes received but not yet
/// consumed by storage, and bytes consumed but not yet returned. Credit goes back only once
/// the unreturned bytes reach half the target, so the peer is not flooded with tiny CREDITs.
public struct InboundWindow: Hashable, Sendable {
    /// The window the relay aims to keep open.
    public let target: Int
    /// Credit the peer holds now: the most it may send.
    public private(set) var available: Int
    /// Bytes received and not yet consumed.
    public private(set) var buffered: Int = 0
    /// Bytes consumed and not yet returned as credit.
    public private(set) var unreturned: Int = 0

    public init(target: Int) {
        precondition(target >= 0 && target <= ProtocolLimits.maxWindow, "window target \(target) outside 0...2^31-1")
        self.target = target
        self.available = target
    }

    /// Records `count` received bytes; false when they overrun the credit (a FLOW_CONTROL_ERROR).
    public mutating func receive(_ count: Int) -> Bool {
        guard count <= self.available else { return false }
        self.available -= count
        self.buffered += count
        return true
    }

    /// Records that storage consumed `count` bytes; returns the credit to grant now, if any.
    public mutating func consume(_ count: Int) -> UInt32? {
        precondition(count <= self.buffered, "consumed \(count) bytes but only \(self.buffered) are buffered")
        self.buffered -= count
        self.unreturned += count
        guard self.unreturned >= max(1, self.target / 2) else {
            return nil
        }
        return self.returnAll()
    }

    /// Returns received bytes that will never reach storage (a discarded chunk) at once.
    public mutating func discard(_ count: Int) -> UInt32? {
        precondition(count <= self.buffered, "discarded \(count) bytes but only \(self.buffered) are buffered")
        self.buffered -= count
        self.unreturned += count
        return self.returnAll()
    }

    /// Returns every consumed byte not yet returned, however few (a stream finished: nothing more may come to push
    /// the count past half the window, SPEC §5.4).
    public mutating func flush() -> UInt32? {
        self.returnAll()
    }

    private mutating func returnAll() -> UInt32? {
        guard self.unreturned > 0 else { return nil }
        let increment = self.unreturned
        self.available += increment
        self.unreturned = 0
        return UInt32(increment)
    }
}
