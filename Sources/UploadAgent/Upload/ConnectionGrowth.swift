import NIOConcurrencyHelpers
import UploadProtocol

/// How many connections an adaptive run opens (``AgentConfiguration/adaptiveConnections``): one, and more, up to
/// ``AgentConfiguration/connections``, while the link is long and the connections added last raised the run's rate.
///
/// One TCP connection carries at most its window per round trip (about 26 MB/s over 100 ms with Linux's 4 MiB
/// default buffers): on a long fat link a user who does not know `--connections` got a quarter of the speed. On
/// loopback and a LAN the window is never the bound, and one connection is enough: a round trip below
/// ``longLink`` opens no other.
///
/// On a long link with work waiting, ``firstStep`` connections run in all at once (4 carried 3.9 times scp's rate over
/// 100 ms): one connection's rate is bounded by its largest window per round trip, which the round trip alone tells, and
/// every round trip spent measuring one connection is one a long link carries a quarter of what four would. Each later
/// window doubles them while the window's rate was at least ``gain`` times the one before the last step (for the first
/// step, what one connection's largest send buffer carries per round trip: more than that proves the step paid). A long
/// thin link (a phone's) stops at the first step. Pure decisions, sampled by ``Uploader`` once per
/// ``window(roundTrip:)``.
struct ConnectionGrowth: Sendable {
    /// The most connections.
    let maximum: Int
    /// The largest send buffer the kernel gives a connection (tcp_wmem's maximum): one connection carries at most about
    /// this per round trip.
    let sendBufferLimit: Int
    /// A round trip at least this long makes the link long: one connection's window may be what holds it.
    static let longLink = Duration.milliseconds(5)
    /// The connections after the first step.
    static let firstStep = 4
    /// The connections added last must have raised the rate by this factor for more to be tried.
    static let gain = 1.2

    /// Connections opened so far.
    private(set) var running = 1
    /// No more are opened: the link is short, the last ones added did not help, or the maximum is reached.
    private(set) var settled = false
    /// Why it settled, for the log.
    private(set) var reason: String? = nil
    /// Where the decisions stand.
    private var phase = Phase.waitingForRoundTrip

    private enum Phase {
        /// The first connection is not up yet.
        case waitingForRoundTrip
        /// The link is long: the first step waits for work a new connection could take.
        case measuring
        /// A step was taken after a window whose rate was `before`.
        case grown(before: Double)
    }

    init(maximum: Int, sendBufferLimit: Int = 4 << 20) {
        self.maximum = max(1, maximum)
        self.sendBufferLimit = max(1, sendBufferLimit)
        if self.maximum == 1 { self.settle("--connections 1") }
    }

    /// Whether a selection of `bytes` is worth opening the first step's connections before the run starts, beside the
    /// quota plan's (``Uploader/quotaPlan(_:keepConnection:)``), once the round trip is known to be long: at least what
    /// ``firstStep`` connections' largest send buffers carry in one round trip (16 MiB with Linux's defaults). Less, one
    /// connection carries in a few round trips what three more handshakes would save.
    static func worthWarming(bytes: UInt64, sendBufferLimit: Int) -> Bool {
        bytes >= UInt64(Self.firstStep) * UInt64(max(1, sendBufferLimit))
    }

    /// How long to measure between two decisions: eight round trips (a new connection's handshakes take about four,
    /// then it ramps up), and at least half a second.
    static func window(roundTrip: Duration?) -> Duration {
        max(.milliseconds(500), (roundTrip ?? .zero) * 8)
    }

    /// The most one connection carries over a link of `roundTrip`: its largest send buffer per round trip, in bytes per
    /// second (42 MB/s over 100 ms with Linux's 4 MiB; about 26 MB/s measured, the kernel keeping part for itself).
    func oneConnectionCeiling(roundTrip: Duration) -> Double {
        Double(self.sendBufferLimit) / max(roundTrip.inSeconds, 0.000_001)
    }

    /// One window's sample: the round trip of the first connection (nil until it is measured), whether a connection
    /// came up, the payload bytes per second sent over the window, and whether jobs wait that a new connection could
    /// take. Returns how many connections to open now (0: none).
    mutating func sample(roundTrip: Duration?, connected: Bool = false, rate: Double, workWaiting: Bool) -> Int {
        guard !self.settled else { return 0 }
        switch self.phase {
        case .waitingForRoundTrip:
            guard let roundTrip else {
                // Not connected yet; or connected where the kernel does not tell the round trip: one connection then.
                if connected { self.settle("the round trip is not known") }
                return 0
            }
            guard roundTrip >= Self.longLink else {
                self.settle("a round trip of \(roundTrip) (one connection is enough)")
                return 0
            }
            self.phase = .measuring
            return self.sample(roundTrip: roundTrip, connected: connected, rate: rate, workWaiting: workWaiting)
        case .measuring:
            // Nothing a new connection could take (a first file still hashed, the only one): asked again.
            guard workWaiting, let roundTrip else { return 0 }
            return self.step(after: self.oneConnectionCeiling(roundTrip: roundTrip))
        case .grown(let before):
            guard rate >= before * Self.gain else {
                self.settle("the connections added last raised the rate less than \(Int(((Self.gain - 1) * 100).rounded())) %")
                return 0
            }
            guard workWaiting else { return 0 }
            return self.step(after: rate)
        }
    }

    /// Opens the next step's connections after a window of `rate` (for the first, one connection's ceiling):
    /// ``firstStep`` in all at first, then twice as many.
    private mutating func step(after rate: Double) -> Int {
        let target = self.running == 1 ? Self.firstStep : self.running * 2
        let added = min(target, self.maximum) - self.running
        self.running += added
        self.phase = .grown(before: rate)
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
    private let state = NIOLockedValueBox<(roundTrip: Duration?, connected: Bool, sent: UInt64)>((nil, false, 0))
    /// Told the first measure, once.
    private let whenMeasured: (@Sendable (Duration?) -> Void)?

    init(whenMeasured: (@Sendable (Duration?) -> Void)? = nil) {
        self.whenMeasured = whenMeasured
    }

    /// A connection came up, and the kernel measured its round trip (nil: it could not tell). The first measure is the
    /// run's, and the answer: every connection of the run decides on it (whether large files stripe), so that a round
    /// trip near ``ConnectionGrowth/longLink`` cannot make two connections, or two reconnections, decide otherwise.
    func measured(roundTrip: Duration?) -> Duration? {
        let (answer, first) = self.state.withLockedValue { state in
            let first = !state.connected
            if first {
                state.connected = true
                state.roundTrip = roundTrip
            }
            return (state.roundTrip, first)
        }
        if first { self.whenMeasured?(answer) }
        return answer
    }

    /// A connection came up, whether or not its round trip was measured.
    var connected: Bool { self.state.withLockedValue { $0.connected } }

    func sent(_ bytes: Int) {
        self.state.withLockedValue { $0.sent += UInt64(bytes) }
    }

    var roundTrip: Duration? { self.state.withLockedValue { $0.roundTrip } }
    var sentBytes: UInt64 { self.state.withLockedValue { $0.sent } }
}
