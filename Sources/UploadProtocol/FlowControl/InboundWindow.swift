/// The receiving side of one credit window: the relay's view of a stream or of the connection (SPEC §5).
///
/// Bytes move through three counts: the peer's `available` credit, bytes received but not yet consumed by storage,
/// and the credit owed: what the window lacks to be back at its target. Credit goes back once what is owed reaches
/// half the target, so the peer is not flooded with tiny CREDITs; with nothing held and no credit left, all of the
/// target is owed, so a window never stays shut.
///
/// A connection window may be resized while it lasts (SPEC §5.5): a smaller target keeps back the credit of consumed
/// bytes until the credit and the bytes held fit in it; a larger one is granted beyond the bytes consumed.
public struct InboundWindow: Hashable, Sendable {
    /// The window the relay aims to keep open: the peer's credit plus the bytes it holds unconsumed.
    public private(set) var target: Int
    /// Credit the peer holds now: the most it may send.
    public private(set) var available: Int
    /// Bytes received and not yet consumed.
    public private(set) var buffered: Int = 0

    public init(target: Int) {
        precondition(target >= 0 && target <= ProtocolLimits.maxWindow, "window target \(target) outside 0...2^31-1")
        self.target = target
        self.available = target
    }

    /// Credit the window lacks to be back at its target: consumed bytes not yet returned, less what a smaller target
    /// keeps back, plus what a larger one adds. Never negative.
    public var unreturned: Int { max(0, self.target - self.available - self.buffered) }

    /// What the peer may still make the relay hold: its credit and the bytes held now.
    public var outstanding: Int { self.available + self.buffered }

    /// Sets the target (clamped to 0...2^31-1); credit follows at the next return.
    public mutating func resize(to target: Int) {
        self.target = min(max(0, target), ProtocolLimits.maxWindow)
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
        guard self.unreturned >= max(1, self.target / 2) else {
            return nil
        }
        return self.returnAll()
    }

    /// Returns received bytes that will never reach storage (a discarded chunk) at once.
    public mutating func discard(_ count: Int) -> UInt32? {
        precondition(count <= self.buffered, "discarded \(count) bytes but only \(self.buffered) are buffered")
        self.buffered -= count
        return self.returnAll()
    }

    /// Returns every consumed byte not yet returned, however few (a stream finished: nothing more may come to push
    /// the count past half the window, SPEC §5.4).
    public mutating func flush() -> UInt32? {
        self.returnAll()
    }

    private mutating func returnAll() -> UInt32? {
        let increment = self.unreturned
        guard increment > 0 else { return nil }
        self.available += increment
        return UInt32(increment)
    }
}
