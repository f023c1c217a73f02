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

    private let claims = NIOLockedValueBox<[String: Claim]>([:])
    private let locks: (any KeyLocks)?
    /// One quota decision per account at a time on this relay (``admitting(account:_:)``), striped by account.
    private let admissions = (0..<16).map { _ in AsyncLock() }

    /// Told when locks across relays that claims held were lost (their database connection dropped).
    private let lost = NIOLockedValueBox<(@Sendable () -> Void)?>(nil)

    init(locks: (any KeyLocks)? = nil) {
        self.locks = locks
        locks?.whenLost { [claims, lost] generation in
            let held = claims.withLockedValue { claims -> Bool in
                var held = false
                for (name, claim) in claims where claim.lock?.generation == generation {
                    claims[name]?.lock = nil
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
        if self.claims.withLockedValue({ $0[name]?.lock != nil }) { return true }
        guard let lock = try await locks.tryLock(account: account, key: key) else { return false }
        let kept = self.claims.withLockedValue { claims -> Bool in
            guard claims[name] != nil, claims[name]?.lock == nil else { return false }
            claims[name]?.lock = lock
            return true
        }
        if !kept { locks.unlock(lock) }
        return kept
    }

    /// How many keys are claimed now.
    package var count: Int { self.claims.withLockedValue { $0.count } }

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
        return self.claims.withLockedValue { claims in claims.keys.contains { $0.hasPrefix(prefix) } }
    }

    func claim(_ name: String, whenFree: @escaping @Sendable () -> Void) -> Outcome {
        self.claims.withLockedValue { claims in
            guard var claim = claims[name] else {
                claims[name] = Claim()
                return .claimed
            }
            guard claim.closing else { return .busy }
            claim.waiters.append(whenFree)
            claims[name] = claim
            return .queued
        }
    }

    /// Claims `name` only if nobody holds it, without waiting (housekeeping, which must never touch a live upload).
    func tryClaim(_ name: String) -> Bool {
        self.claims.withLockedValue { claims in
            guard claims[name] == nil else { return false }
            claims[name] = Claim()
            return true
        }
    }

    /// The keys of `account` with an upload open now (claimed and not closing), each with the size it announced.
    func activeUploads(of account: String) -> [String: Int64] {
        let prefix = account + "\u{0}"
        return self.claims.withLockedValue { claims in
            var active: [String: Int64] = [:]
            for (name, claim) in claims where !claim.closing && name.hasPrefix(prefix) {
                active[String(name.dropFirst(prefix.count))] = claim.announced
            }
            return active
        }
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
        self.claims.withLockedValue { claims in
            claims[name]?.announced = size
        }
    }

    /// The key's stream has ended on the wire; its cleanup runs.
    func markClosing(_ name: String) {
        self.claims.withLockedValue { claims in
            claims[name]?.closing = true
        }
    }

    /// The key is free: every waiter is told (each claims again; one wins), and other relays may take it.
    func release(_ name: String) {
        let claim = self.claims.withLockedValue { claims in
            claims.removeValue(forKey: name)
        }
        if let lock = claim?.lock { self.locks?.unlock(lock) }
        for waiter in claim?.waiters ?? [] { waiter() }
    }
}
