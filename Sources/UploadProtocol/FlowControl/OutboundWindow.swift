/// The sending side of one credit window: the agent's view of a stream or of the connection (SPEC §5).
public struct OutboundWindow: Hashable, Sendable {
    /// Bytes the agent may still send.
    public private(set) var available: Int

    public init(initial: Int) {
        precondition(initial >= 0 && initial <= ProtocolLimits.maxWindow, "window \(initial) outside 0...2^31-1")
        self.available = initial
    }

    /// Spends credit on a chunk. Sending without credit is our own bug.
    public mutating func consume(_ count: Int) {
        precondition(count <= self.available, "sending \(count) bytes with only \(self.available) bytes of credit")
        self.available -= count
    }

    /// Adds a peer's CREDIT; false when the window would pass 2^31-1 (a FLOW_CONTROL_ERROR).
    public mutating func grant(_ increment: UInt32) -> Bool {
        let (sum, overflow) = self.available.addingReportingOverflow(Int(increment))
        guard !overflow, sum <= ProtocolLimits.maxWindow else { return false }
        self.available = sum
        return true
    }
}
