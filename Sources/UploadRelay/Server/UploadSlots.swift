import NIOConcurrencyHelpers

/// The relay's open-upload slots (each open upload holds its staging file's descriptor), shared fairly among
/// accounts, so that one account's many connections cannot leave another account none.
///
/// An account holding fewer than ``floor`` slots (one connection's streams) takes one while any is free: a newcomer
/// is never refused while slots remain. Past its floor an account takes only from the slots outside a reserve kept for
/// such newcomers (a quarter of all), and only while it holds less than its share of them, divided among the
/// accounts holding slots. An account holding more than its share (the others came later) keeps what it has; its new
/// OPENs wait for its uploads to end.
package final class UploadSlots: Sendable {
    /// All slots.
    package let total: Int
    /// Slots an account takes while any is free.
    package let floor: Int
    private let reserve: Int
    private let state = NIOLockedValueBox((used: 0, held: [String: Int]()))

    package init(total: Int, floor: Int) {
        self.total = max(0, total)
        self.floor = max(1, min(floor, self.total))
        self.reserve = self.total / 4
    }

    /// Slots taken now, by all accounts.
    package var inUse: Int { self.state.withLockedValue { $0.used } }

    /// Slots `account` holds now.
    package func held(by account: String) -> Int { self.state.withLockedValue { $0.held[account] ?? 0 } }

    /// Takes one slot for `account` when the rule above allows it; false (nothing taken) otherwise.
    package func take(for account: String) -> Bool {
        self.state.withLockedValue { state in
            guard state.used < self.total else { return false }
            let mine = state.held[account] ?? 0
            if mine >= self.floor {
                let shared = self.total - self.reserve
                let holders = state.held.count
                guard state.used < shared, mine < max(self.floor, shared / max(1, holders)) else { return false }
            }
            state.used += 1
            state.held[account] = mine + 1
            return true
        }
    }

    /// Gives back one slot `account` took.
    package func give(for account: String) {
        self.state.withLockedValue { state in
            guard let mine = state.held[account], mine > 0 else { return }
            state.used -= 1
            state.held[account] = mine > 1 ? mine - 1 : nil
        }
    }
}
