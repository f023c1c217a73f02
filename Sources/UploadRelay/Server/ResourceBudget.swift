import NIOConcurrencyHelpers

/// The relay-wide budget of chunk memory, shared by every connection, so that many connections together cannot make
/// the relay hold more than it was given.
///
/// Each connection's window (SPEC §5.1) is the most chunk bytes it may make the relay hold, so windows come from the
/// budget, and each connection's fair share is the budget divided among the connections holding windows, never more
/// than the configured window nor less than a floor. A connection takes its share at WELCOME while the budget has it
/// free (else the floor, which may pass the budget: no agent is ever refused, only slowed), and moves toward its share
/// each time storage consumes its bytes (``rebalance(holding:outstanding:preferred:floor:)``, SPEC §5.5): the first
/// connections give back what later ones need. Open uploads have their own budget, ``UploadSlots``.
package final class ResourceBudget: Sendable {
    /// The budget, in bytes or slots.
    let total: Int
    private let state = NIOLockedValueBox((used: 0, holders: 0))

    init(total: Int) {
        self.total = max(0, total)
    }

    /// How much is taken now.
    package var inUse: Int { self.state.withLockedValue { $0.used } }

    /// How much is not taken now (none when floors took more than the budget).
    package var free: Int { self.state.withLockedValue { max(0, self.total - $0.used) } }

    /// How many connections hold a share (``join(preferred:floor:)`` less ``leave(_:)``).
    package var holders: Int { self.state.withLockedValue { $0.holders } }

    /// A new holder of a share: its fair share while the budget has it free, else what is free, never less than
    /// `floor`. Returns what was taken.
    func join(preferred: Int, floor: Int) -> Int {
        self.state.withLockedValue { state in
            state.holders += 1
            return Self.resize(
                &state, total: self.total, holding: 0, wanted: Self.fair(state, total: self.total, preferred: preferred, floor: floor), floor: floor)
        }
    }

    /// A holder leaves, giving back what it held.
    func leave(_ holding: Int) {
        self.state.withLockedValue { state in
            state.holders = max(0, state.holders - 1)
            state.used = max(0, state.used - holding)
        }
    }

    /// A holder of `holding`, whose peer may still make the relay hold `outstanding` (never more than `holding`), moves
    /// toward the fair share now (the budget divided among its holders, within `floor...preferred`): what it holds
    /// above both goes back at once; more comes only from what is free (at least up to `floor`). Returns what it holds
    /// now and the fair share, from one look at the budget.
    func rebalance(holding: Int, outstanding: Int, preferred: Int, floor: Int) -> (held: Int, fair: Int) {
        self.state.withLockedValue { state in
            let fair = Self.fair(state, total: self.total, preferred: preferred, floor: floor)
            let held = Self.resize(&state, total: self.total, holding: holding, wanted: max(fair, outstanding), floor: floor)
            return (held, fair)
        }
    }

    private static func fair(_ state: (used: Int, holders: Int), total: Int, preferred: Int, floor: Int) -> Int {
        max(min(preferred, floor), min(preferred, total / max(1, state.holders)))
    }

    private static func resize(_ state: inout (used: Int, holders: Int), total: Int, holding: Int, wanted: Int, floor: Int) -> Int {
        let granted: Int
        if wanted <= holding {
            granted = wanted
        } else {
            let free = max(0, total - state.used)
            granted = max(min(wanted, floor), min(wanted, holding + free))
        }
        state.used = max(0, state.used - holding + granted)
        return granted
    }
}
