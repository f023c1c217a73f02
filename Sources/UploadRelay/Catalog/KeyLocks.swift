/// A key's lock across relays, as ``KeyLocks/tryLock(account:key:)`` took it.
public struct KeyLock: Hashable, Sendable {
    /// The lock's number in the database.
    package var id: Int64
    /// Which of the holder's database connections took it: a lock dies with its connection.
    package var generation: Int

    package init(id: Int64, generation: Int) {
        self.id = id
        self.generation = generation
    }
}

/// Locks on keys that hold across every relay sharing one catalog: an upload of a key runs on one relay at
/// a time whichever relay the agent reached, and housekeeping (recovery, expiry) never touches what another relay's
/// upload holds. A lock is released by its holder, or when the holder's relay dies (its database connection drops);
/// never by a timeout alone.
public protocol KeyLocks: AnyObject, Sendable {
    /// The key's lock when no other relay holds it; nil when one does.
    func tryLock(account: String, key: String) async throws -> KeyLock?
    /// Lets `lock` go, without waiting. A lock whose connection is gone went with it.
    func unlock(_ lock: KeyLock)
    /// Once set, told the generation of a connection that dropped while the relay ran: the locks it held are gone, and
    /// another relay may take their keys.
    func whenLost(_ handler: @escaping @Sendable (_ generation: Int) -> Void)
}

extension Catalog {
    /// A catalog that only one relay uses (SQLite, in the relay's data directory) needs none.
    public var keyLocks: (any KeyLocks)? { nil }
}
