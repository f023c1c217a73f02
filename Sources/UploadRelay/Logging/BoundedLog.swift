import Logging
import NIOConcurrencyHelpers
import NIOCore

/// A warning that a stranger can provoke at will (a refused connection, say), written at most once per interval: the
/// first at once, then one line per interval that counts what happened since. A flood costs the log a line every few
/// seconds, never a line per event.
final class BoundedLog: Sendable {
    private struct State {
        var lastWritten: NIODeadline? = nil
        var suppressed = 0
    }

    private let logger: Logger
    private let interval: TimeAmount
    private let state = NIOLockedValueBox(State())

    init(logger: Logger, interval: TimeAmount = .seconds(10)) {
        self.logger = logger
        self.interval = interval
    }

    /// Writes `message` (with `metadata` and the count of those not written since the last) unless one was written
    /// less than the interval ago. `now` is injected for tests.
    func warning(_ message: @autoclosure () -> String, metadata: Logger.Metadata = [:], now: NIODeadline = .now()) {
        let suppressed = self.state.withLockedValue { state -> Int? in
            if let last = state.lastWritten, now - last < self.interval {
                state.suppressed += 1
                return nil
            }
            defer {
                state.lastWritten = now
                state.suppressed = 0
            }
            return state.suppressed
        }
        guard let suppressed else { return }
        var metadata = metadata
        if suppressed > 0 { metadata["suppressed"] = "\(suppressed)" }
        self.logger.warning("\(message())", metadata: metadata)
    }
}
