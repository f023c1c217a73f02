import NIOConcurrencyHelpers

/// A relay-wide budget of one resource (chunk memory, open uploads), shared by every connection, so that many
/// connections together cannot take more than the relay was given.
///
/// Memory: each connection's window (SPEC §5.1) is the most chunk bytes it may make the relay hold, so the relay
/// grants windows from a budget: a new connection gets the configured window while the budget lasts, then a quarter
/// of what is left, and never less than a floor, so that no agent is ever refused, only slowed. File descriptors:
/// each open upload holds its staging file, so uploads take a slot and an OPEN past the last slot is refused with
/// REFUSED_STREAM (retried by the agent) instead of failing in the middle with EMFILE.
package final class ResourceBudget: Sendable {
    /// The budget, in bytes or slots.
    let total: Int
    private let used = NIOLockedValueBox(0)

    init(total: Int) {
        self.total = max(0, total)
    }

    /// How much is taken now.
    package var inUse: Int { self.used.withLockedValue { $0 } }

    /// Takes `count` if it fits; false (nothing taken) otherwise.
    func take(_ count: Int) -> Bool {
        self.used.withLockedValue { used in
            guard count <= self.total - used else { return false }
            used += count
            return true
        }
    }

    /// Takes `preferred` while the budget lasts, else a quarter of what is left, never less than `floor` (which may
    /// pass the budget: by at most `floor` per taker). Returns what was taken.
    func share(preferred: Int, floor: Int) -> Int {
        self.used.withLockedValue { used in
            let free = max(0, self.total - used)
            let granted = max(min(preferred, floor), min(preferred, free >= preferred ? preferred : free / 4))
            used += granted
            return granted
        }
    }

    func give(_ count: Int) {
        self.used.withLockedValue { used in used = max(0, used - count) }
    }
}
