/// The sending side of one credit window: the agent's view of a stream or of the connection (SPEC §5).
///
/// Credit moves through two counts, as swift-nio-ssh's `OutboundFlowController` keeps it: `available`,
/// which nothing has claimed yet, and `reserved`, claimed by a read that is under way. A read reserves
/// before it starts, the CHUNKs it produces spend from the reservation, and whatever the read did not use
/// is released. Two reads planned at once can therefore never promise the same bytes.
public struct OutboundWindow: Hashable, Sendable {
    /// Credit no read has claimed yet.
    public private(set) var available: Int
    /// Credit claimed by reads under way and not yet spent on CHUNKs.
    public private(set) var reserved: Int = 0

    public init(initial: Int) {
        precondition(initial >= 0 && initial <= ProtocolLimits.maxWindow, "window \(initial) outside 0...2^31-1")
        self.available = initial
    }

    /// Claims up to `count` bytes of credit; returns how many were claimed.
    public mutating func reserve(upTo count: Int) -> Int {
        let claimed = max(0, min(count, self.available))
        self.available -= claimed
        self.reserved += claimed
        return claimed
    }

    /// Spends `count` bytes on a CHUNK: the reservation first, then unclaimed credit. The caller checked that
    /// `count <= reserved + available`.
    public mutating func take(_ count: Int) {
        let fromReservation = min(count, self.reserved)
        self.reserved -= fromReservation
        self.available -= min(count - fromReservation, self.available)
    }

    /// Gives `count` reserved bytes back (the read used fewer, or its stream closed).
    public mutating func release(_ count: Int) {
        let returned = max(0, min(count, self.reserved))
        self.reserved -= returned
        self.available += returned
    }

    /// Adds a peer's CREDIT; false when the window would pass 2^31-1 (a FLOW_CONTROL_ERROR).
    public mutating func grant(_ increment: UInt32) -> Bool {
        let (sum, overflow) = self.available.addingReportingOverflow(Int(increment))
        guard !overflow, sum + self.reserved <= ProtocolLimits.maxWindow else { return false }
        self.available = sum
        return true
    }
}
