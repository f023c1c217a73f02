import NIOConcurrencyHelpers

/// How many connections an adaptive run opens (``AgentConfiguration/adaptiveConnections``): one, and more, up to
/// ``AgentConfiguration/connections``, while the link is long and the ones added last raised the run's throughput. The
/// first step, taken as soon as the first connection's round trip says the link is long, opens ``firstStep`` in all
/// (one connection there is held to its window per round trip, whatever the link: 4 carried 3.9 times scp's rate over
/// 100 ms); each later step doubles them while the last one raised the rate: a link that rewards them gets them
/// within a second, before a transfer of a few seconds is over.
///
/// One TCP connection carries at most its window per round trip (about 26 MB/s over 100 ms with Linux's 4 MiB
/// default buffers): on a long fat link a user who does not know `--connections` got a quarter of the speed. On
/// loopback and a LAN the window is never the bound, and one connection is enough: a round trip below
/// ``longLink`` opens no other. Pure decisions, sampled by ``Uploader`` once per ``window(roundTrip:)``.
struct ConnectionGrowth: Sendable {
    /// The most connections.
    let maximum: Int
    /// A round trip at least this long makes the link long: one connection's window may be what holds it.
    static let longLink = Duration.milliseconds(5)
    /// The connections of the first step.
    static let firstStep = 4
    /// The connections added last must have raised the rate by this factor for more to be tried.
    static let gain = 1.2

    /// Connections opened so far.
    private(set) var running = 1
    /// No more are opened: the link is short, the last one added did not help, or the maximum is reached.
    private(set) var settled = false
    /// Why it settled, for the log and `--json`.
    private(set) var reason: String? = nil
    /// The rate of the window before the last connections were added.
    private var rateBefore: Double? = nil

    init(maximum: Int) {
        self.maximum = max(1, maximum)
        if self.maximum == 1 { self.settle("--connections 1") }
    }

    /// How long to measure between two decisions: five round trips, and at least half a second.
    static func window(roundTrip: Duration?) -> Duration {
        max(.milliseconds(500), (roundTrip ?? .zero) * 5)
    }

    /// One window's sample: the round trip of the first connection (nil until it is measured), the payload bytes per
    /// second sent over the window, and whether jobs wait that a new connection could take. Returns how many
    /// connections to open now (0: none).
    mutating func sample(roundTrip: Duration?, rate: Double, workWaiting: Bool) -> Int {
        guard !self.settled else { return 0 }
        guard let roundTrip else { return 0 }  // not connected yet
        guard roundTrip >= Self.longLink else {
            self.settle("a round trip of \(roundTrip) (one connection is enough)")
            return 0
        }
        if let before = self.rateBefore, before > 0, rate < before * Self.gain {
            self.settle("the connections added last raised the rate less than \(Int(((Self.gain - 1) * 100).rounded())) %")
            return 0
        }
        // Nothing a new connection could take now: asked again next window.
        guard workWaiting else { return 0 }
        let added = min(self.rateBefore == nil ? Self.firstStep - 1 : self.running, self.maximum - self.running)
        self.rateBefore = rate
        self.running += added
        if self.running == self.maximum { self.settle("the maximum, \(self.maximum)") }
        return added
    }

    private mutating func settle(_ reason: String) {
        self.settled = true
        self.reason = reason
    }
}

/// What the connections of one adaptive run measured, for its ``ConnectionGrowth``: the first connection's round trip
/// and the payload bytes sent on all of them.
final class LinkMeter: Sendable {
    private let state = NIOLockedValueBox<(roundTrip: Duration?, sent: UInt64)>((nil, 0))

    /// A connection came up and the kernel measured its round trip: the first one is the link's.
    func measured(roundTrip: Duration) {
        self.state.withLockedValue { if $0.roundTrip == nil { $0.roundTrip = roundTrip } }
    }

    func sent(_ bytes: Int) {
        self.state.withLockedValue { $0.sent += UInt64(bytes) }
    }

    var roundTrip: Duration? { self.state.withLockedValue { $0.roundTrip } }
    var sentBytes: UInt64 { self.state.withLockedValue { $0.sent } }
}
