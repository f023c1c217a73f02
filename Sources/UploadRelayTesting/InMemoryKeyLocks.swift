import NIOConcurrencyHelpers
import UploadRelay

/// Key locks in memory, for tests and tools, with the rules of PostgreSQL's (the key lock contract suite runs on both):
/// the relays of one process share a ``Table``, each through an ``InMemoryKeyLocks`` of its own, which stands for its
/// lock connection. A key's lock is held by one relay at a time; it goes when its holder lets it go, or when the
/// holder's connection is lost (``loseConnection()``: a relay killed, its database connection cut), never after a time.
public final class InMemoryKeyLocks: KeyLocks, Sendable {
    /// The locks of every relay sharing it.
    public final class Table: Sendable {
        fileprivate struct Hold {
            var holder: ObjectIdentifier
            var generation: Int
            /// Taken this many times by its holder (PostgreSQL's session locks stack the same way).
            var count: Int
        }

        /// Account and key → who holds it.
        fileprivate let holds = NIOLockedValueBox<[String: Hold]>([:])

        public init() {}
    }

    private struct State {
        /// This relay's connection now: a lock of an earlier one went with it.
        var generation = 1
        var lost: (@Sendable (Int) -> Void)?
        /// Lock number → account and key, for ``unlock(_:)``.
        var names: [Int64: String] = [:]
        var nextID: Int64 = 1
    }

    private let table: Table
    private let state = NIOLockedValueBox(State())

    /// One relay's locks in `table`.
    public init(table: Table) {
        self.table = table
    }

    public func tryLock(account: String, key: String) async throws -> KeyLock? {
        let name = account + "\u{0}" + key
        let me = ObjectIdentifier(self)
        let generation = self.state.withLockedValue { $0.generation }
        let taken = self.table.holds.withLockedValue { holds -> Bool in
            if var hold = holds[name] {
                guard hold.holder == me, hold.generation == generation else { return false }
                hold.count += 1
                holds[name] = hold
                return true
            }
            holds[name] = Table.Hold(holder: me, generation: generation, count: 1)
            return true
        }
        guard taken else { return nil }
        return self.state.withLockedValue { state in
            defer { state.nextID += 1 }
            state.names[state.nextID] = name
            return KeyLock(id: state.nextID, generation: generation)
        }
    }

    public func unlock(_ lock: KeyLock) {
        let me = ObjectIdentifier(self)
        let name = self.state.withLockedValue { state -> String? in
            guard lock.generation == state.generation else { return nil }
            return state.names.removeValue(forKey: lock.id)
        }
        guard let name else { return }
        self.table.holds.withLockedValue { holds in
            guard var hold = holds[name], hold.holder == me, hold.generation == lock.generation else { return }
            hold.count -= 1
            holds[name] = hold.count > 0 ? hold : nil
        }
    }

    public func whenLost(_ handler: @escaping @Sendable (Int) -> Void) {
        self.state.withLockedValue { $0.lost = handler }
    }

    /// This relay's lock connection is gone: every lock it held goes, and ``whenLost(_:)`` is told. Locks taken after
    /// it are taken on a new connection.
    public func loseConnection() {
        let me = ObjectIdentifier(self)
        let (generation, lost) = self.state.withLockedValue { state -> (Int, (@Sendable (Int) -> Void)?) in
            defer {
                state.generation += 1
                state.names = [:]
            }
            return (state.generation, state.lost)
        }
        self.table.holds.withLockedValue { holds in
            holds = holds.filter { $0.value.holder != me || $0.value.generation != generation }
        }
        lost?(generation)
    }
}
