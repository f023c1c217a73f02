import NIOCore

/// When a peer's last PINGs arrived, oldest first: more than ``limit`` in one second (sliding) is a flood (SPEC §2.3),
/// answered ENHANCE_YOUR_CALM by the relay and the agent alike. Answering every PING of a peer that never reads its
/// PONGs would make the answerer hold them without bound.
struct PingRate {
    static let limit = 10
    private var times: [NIODeadline] = []

    /// Counts a PING received at `now`; false when it is the flood.
    mutating func admit(now: NIODeadline) -> Bool {
        if self.times.count == Self.limit, now - self.times.removeFirst() < .seconds(1) {
            return false
        }
        self.times.append(now)
        return true
    }
}
