import NIOConcurrencyHelpers

/// Which keys have an upload under way, relay-wide: one upload per key of an account at a time.
///
/// A claim is *active* while its stream is open and *closing* once the stream has ended on the wire (RESULT,
/// ERROR or OFFSET STORED sent, CANCEL or ERROR received, connection gone) while its cleanup (closing the staging
/// file, dropping a session) still runs. An OPEN of an active key is answered KEY_BUSY; an OPEN of a closing key
/// waits for the cleanup instead, so an agent never sees KEY_BUSY for a stream it already saw end
/// (SPEC §11).
///
/// With a catalog that several relays share, a claim also takes the key's lock across relays (``KeyLocks``) before its
/// upload looks at anything (``lockAcrossRelays(account:key:)``), and lets it go on release.
package final class KeyClaims: Sendable {
    /// What ``claim(_:whenFree:)`` did.
    enum Outcome: Equatable {
        /// The key is the caller's until ``release(_:)``.
        case claimed
        /// Another upload of the key is open: KEY_BUSY.
        case busy
        /// The key's last upload is closing: `whenFree` runs once it is released; claim again then.
        case queued
    }

    private struct Claim {
        var closing = false
        var waiters: [@Sendable () -> Void] = []
        /// The size its upload announced (0 when unknown), counted against the quota while the stream is open.
        var announced: Int64 = 0
        /// The key's lock across relays, once taken.
        var lock: KeyLock?
    }

    private struct State {
        var claims: [String: Claim] = [:]
        /// The keys of each account with an upload open now (claimed, not closing) and the size each announced: what
        /// ``activeUploads(of:)`` answers at every OPEN, kept as claims change. Built by a walk over every claim, it cost
        /// each OPEN time in proportion to the uploads open on the relay (thousands with many agents of one account).
        var active: [String: [String: Int64]] = [:]

        /// The account and key of a claim's name (``KeyClaims/name(account:key:)``); nil for a stripe's.
        static func split(_ name: String) -> (account: String, key: String)? {
            guard let zero = name.utf8.firstIndex(of: 0), !name.hasPrefix("\u{1}") else { return nil }
            return (String(name[..<zero]), String(name[name.utf8.index(after: zero)...]))
        }

        mutating func add(_ name: String) {
            self.claims[name] = Claim()
            guard let (account, key) = Self.split(name) else { return }
            self.active[account, default: [:]][key] = 0
        }

        mutating func setActive(_ name: String, announced: Int64?) {
            guard let (account, key) = Self.split(name) else { return }
            if let announced {
                self.active[account, default: [:]][key] = announced
            } else if self.active[account]?.removeValue(forKey: key) != nil, self.active[account]?.isEmpty == true {
                self.active[account] = nil
            }
        }
    }

    private let state = NIOLockedValueBox(State())
    private let locks: (any KeyLocks)?
    /// One quota decision per account at a time on this relay (``admitting(account:_:)``), striped by account.
    private let admissions = (0..<16).map { _ in AsyncLock() }

    /// Told when locks across relays that claims held were lost (their database connection dropped).
    private let lost = NIOLockedValueBox<(@Sendable () -> Void)?>(nil)

    init(locks: (any KeyLocks)? = nil) {
        self.locks = locks
        locks?.whenLost { [state, lost] generation in
            let held = state.withLockedValue { state -> Bool in
                var held = false
                for (name, claim) in state.claims where claim.lock?.generation == generation {
                    state.claims[name]?.lock = nil
                    held = true
                }
                return held
            }
            if held { lost.withLockedValue { $0 }?() }
        }
    }

    /// Whether keys are locked across relays too (a shared catalog).
    var acrossRelays: Bool { self.locks != nil }

    /// `handler` runs when the locks of claims held now were lost: their uploads must stop, since another relay may
    /// take their keys.
    func whenLocksLost(_ handler: @escaping @Sendable () -> Void) {
        self.lost.withLockedValue { $0 = handler }
    }

    /// Takes the lock across relays of the key the caller has claimed (``claim(_:whenFree:)``): false when another relay
    /// holds it (KEY_BUSY), true at once without a shared catalog.
    func lockAcrossRelays(account: String, key: String) async throws -> Bool {
        guard let locks else { return true }
        let name = Self.name(account: account, key: key)
        if self.state.withLockedValue({ $0.claims[name]?.lock != nil }) { return true }
        guard let lock = try await locks.tryLock(account: account, key: key) else { return false }
        let kept = self.state.withLockedValue { state -> Bool in
            guard state.claims[name] != nil, state.claims[name]?.lock == nil else { return false }
            state.claims[name]?.lock = lock
            return true
        }
        if !kept { locks.unlock(lock) }
        return kept
    }

    /// How many keys are claimed now.
    package var count: Int { self.state.withLockedValue { $0.claims.count } }

    static func name(account: String, key: String) -> String {
        account + "\u{0}" + key
    }

    /// The claim of one stripe of a striped upload (SPEC §6.7): one stream writes it at a time. Outside every account's
    /// names, so that it is never counted as an upload of the account.
    static func stripeName(account: String, key: String, index: Int) -> String {
        Self.stripePrefix(account: account, key: key) + "\(index)"
    }

    private static func stripePrefix(account: String, key: String) -> String {
        "\u{1}" + account + "\u{0}" + key + "\u{0}"
    }

    /// Whether a stream writes a stripe of the key's striped upload now: its session is live, whatever its age (SPEC §6.6).
    func hasStripes(account: String, key: String) -> Bool {
        let prefix = Self.stripePrefix(account: account, key: key)
        return self.state.withLockedValue { state in state.claims.keys.contains { $0.hasPrefix(prefix) } }
    }

    func claim(_ name: String, whenFree: @escaping @Sendable () -> Void) -> Outcome {
        self.state.withLockedValue { state in
            guard var claim = state.claims[name] else {
                state.add(name)
                return .claimed
            }
            guard claim.closing else { return .busy }
            claim.waiters.append(whenFree)
            state.claims[name] = claim
            return .queued
        }
    }

    /// Claims `name` only if nobody holds it, without waiting (housekeeping, which must never touch a live upload).
    func tryClaim(_ name: String) -> Bool {
        self.state.withLockedValue { state in
            guard state.claims[name] == nil else { return false }
            state.add(name)
            return true
        }
    }

    /// The keys of `account` with an upload open now (claimed and not closing), each with the size it announced.
    func activeUploads(of account: String) -> [String: Int64] {
        self.state.withLockedValue { $0.active[account] ?? [:] }
    }

    /// Runs an OPEN's quota decision for `account` with its uploads open now (``activeUploads(of:)``), one at a time
    /// per account on this relay: what one admits and announces (``announce(_:size:)``, inside `body`), the next one
    /// counts. Two OPENs of one account deciding at once could each leave out the other.
    func admitting<T: Sendable>(account: String, _ body: ([String: Int64]) async throws -> T) async rethrows -> T {
        var hasher = Hasher()
        hasher.combine(account)
        let lock = self.admissions[Int(UInt(bitPattern: hasher.finalize()) % UInt(self.admissions.count))]
        return try await lock.withLock { try await body(self.activeUploads(of: account)) }
    }

    /// The upload holding `name` announced `size` bytes (0: unknown).
    func announce(_ name: String, size: Int64) {
        self.state.withLockedValue { state in
            guard let claim = state.claims[name] else { return }
            state.claims[name]?.announced = size
            if !claim.closing { state.setActive(name, announced: size) }
        }
    }

    /// The key's stream has ended on the wire; its cleanup runs.
    func markClosing(_ name: String) {
        self.state.withLockedValue { state in
            guard state.claims[name] != nil else { return }
            state.claims[name]?.closing = true
            state.setActive(name, announced: nil)
        }
    }

    /// The key is free: every waiter is told (each claims again; one wins), and other relays may take it.
    func release(_ name: String) {
        let claim = self.state.withLockedValue { state in
            state.setActive(name, announced: nil)
            return state.claims.removeValue(forKey: name)
        }
        if let lock = claim?.lock { self.locks?.unlock(lock) }
        for waiter in claim?.waiters ?? [] { waiter() }
    }
}
