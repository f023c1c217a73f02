import Foundation
import Logging
import UploadProtocol

/// What `upload-relay rm` and `token delete` do to the store and the catalog, on either catalog and either store.
///
/// Only what the relay made is touched: an object is removed only when the catalog records it and the file (or S3
/// object) at its place is still the one committed; the file goes first, then the catalog's row, so a crash between the
/// two leaves a row whose file is gone, which the next start forgets (never a file no row knows). Each key is held as
/// an upload holds it (with a shared catalog, under its lock across relays), so no upload of it commits meanwhile.
public enum RelayAdmin {
    /// How one `rm` ended.
    public enum Removal: Hashable, Sendable {
        /// Removed: the object's size.
        case removed(Int64)
        /// The catalog records no object under the key.
        case notStored
        /// Left alone, and why.
        case refused(String)
    }

    /// Removes the object `key` of `account`: under the key's lock across relays (a shared catalog), in one catalog
    /// write transaction that a relay's commit of the key waits for (``Catalog/removeObject(account:key:removingFile:)``).
    public static func remove(
        key: String, account: String, catalog: any Catalog, store: any BlobStore, logger: Logger
    ) async throws -> Removal {
        guard let objectKey = try? ObjectKey(validating: key) else { return .notStored }
        let keys = RelayRuntime.KeyGuard.claiming(KeyClaims(locks: catalog.keyLocks))
        let outcome = try await keys.holding(account, key) { () async throws -> Removal in
            do {
                switch try await catalog.removeObject(
                    account: account, key: key,
                    removingFile: { object in
                        let current = try await store.identity(of: objectKey, account: account)
                        // Only what the relay committed: a row without an identity (a commit recovery settled, or an older
                        // catalog) is checked by the object's size at least.
                        if let current {
                            if let recorded = object.identity, current != recorded { throw NotCommitted() }
                            if object.identity == nil, current.size != object.size { throw NotCommitted() }
                            try await store.removeObject(objectKey, account: account)
                        }
                    })
                {
                case .removed(let object):
                    logger.notice(
                        "removed an object (upload-relay rm)",
                        metadata: ["account": "\(account)", "upload.key": "\(key)", "upload.size": "\(object.size)"]
                    )
                    return .removed(object.size)
                case .notStored:
                    return .notStored
                case .busy(let reason):
                    return .refused(reason)
                }
            } catch is NotCommitted {
                return .refused("what is at its place is not the object the relay committed (it was changed by hand since): left as it is")
            }
        }
        return outcome ?? .refused("an upload of it is under way on a relay; try again once it ends")
    }

    private struct NotCommitted: Error {}

    /// What `token delete` does with the account's objects.
    public enum Objects: String, Sendable {
        /// Removed with the account, as `rm` removes them.
        case delete
        /// Left in the store as they are, forgotten by the catalog.
        case keep
    }

    /// How `token delete` ended: what it removed or left, and what it could not remove.
    public struct AccountDeletion: Sendable {
        public var removed = 0
        public var removedBytes: Int64 = 0
        public var kept = 0
        /// Objects left in place, each with why (the account stays while any is).
        public var refused: [(key: String, reason: String)] = []
        public var uploadsDropped = 0
        public var deleted = false
        /// How the running relays took the revocation that came first.
        public var looks = Looks()
    }

    /// Deletes account `name`: its token is refused first (running relays close its connections), then its uploads
    /// under way are dropped with their staged bytes, its objects removed or kept as `objects` says, and the account goes
    /// once nothing of it is left in the catalog.
    public static func deleteAccount(
        _ name: String, objects: Objects, catalog: any Catalog, store: any BlobStore, logger: Logger
    ) async throws -> AccountDeletion {
        var outcome = AccountDeletion()
        guard try await catalog.revokeAccount(named: name) else { throw CatalogError.unknownAccount(name) }
        // After the revocation is in the catalog: a look that read the accounts since has seen it.
        let revoked = try await catalog.clock()
        // No relay acts for the account from here on: each has closed its connections before anything of it goes.
        outcome.looks = try await Self.waitForLooks(catalog: catalog, after: revoked)
        let keys = RelayRuntime.KeyGuard.claiming(KeyClaims(locks: catalog.keyLocks))
        // A connection the relays just closed records what it had made durable as it goes: such sessions appear for a
        // moment after the looks, and are dropped as they do, for a few seconds.
        let settling = ContinuousClock.now + .seconds(5)
        while true {
            for session in try await catalog.sessions(updatedBefore: .distantFuture) where session.account == name {
                let dropped = try await keys.holding(name, session.key) { () async throws -> Bool in
                    try await catalog.deleteSession(id: session.id)
                    try? await store.removeStaging(session.stagingName)
                    return true
                }
                if dropped == true { outcome.uploadsDropped += 1 }
            }
            let left = try await catalog.sessions(updatedBefore: .distantFuture).contains { $0.account == name }
            guard left, ContinuousClock.now < settling else { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        // Nothing of the objects is touched while the account cannot go anyway: an upload a relay holds, a commit.
        if try await catalog.sessions(updatedBefore: .distantFuture).contains(where: { $0.account == name }) {
            throw CatalogError.accountInUse(name, holds: "uploads under way on a relay (disabled now: try again in a few seconds)")
        }
        if try await catalog.pendingCommits().contains(where: { $0.account == name }) {
            throw CatalogError.accountInUse(name, holds: "commits being settled (try again in a minute)")
        }
        for object in try await catalog.objects() where object.account == name {
            switch objects {
            case .keep:
                try await catalog.deleteObject(account: name, key: object.key)
                outcome.kept += 1
            case .delete:
                switch try await Self.remove(key: object.key, account: name, catalog: catalog, store: store, logger: logger) {
                case .removed(let size):
                    outcome.removed += 1
                    outcome.removedBytes += size
                case .notStored:
                    break
                case .refused(let reason):
                    outcome.refused.append((object.key, reason))
                }
            }
        }
        guard outcome.refused.isEmpty else { return outcome }
        outcome.deleted = try await catalog.deleteAccount(named: name)
        if outcome.deleted {
            logger.notice("deleted an account (upload-relay token delete)", metadata: ["account": "\(name)", "objects": "\(objects.rawValue)"])
        }
        return outcome
    }

    /// How the running relays took an account change: how many told their connections, and how many did not within
    /// the wait.
    public struct Looks: Hashable, Sendable {
        public var told = 0
        public var silent = 0
    }

    /// Waits until every running relay (one that looked at the accounts within `live` before `after`) has told its
    /// connections the accounts as they were at `after` or later: then none of them holds a connection of a principal
    /// that was gone by `after`. Relays that do not within `timeout` are counted silent.
    public static func waitForLooks(
        catalog: any Catalog, after: Date, timeout: Duration = .seconds(30), live: TimeInterval = 10
    ) async throws -> Looks {
        let deadline = ContinuousClock.now + timeout
        while true {
            let running = try await catalog.relayLooks().values.filter { $0 > after.addingTimeInterval(-live) }
            let behind = running.filter { $0 < after }.count
            if behind == 0 || ContinuousClock.now >= deadline {
                return Looks(told: running.count - behind, silent: behind)
            }
            // The catalog is asked again shortly: relays look every couple of seconds.
            try await Task.sleep(for: .milliseconds(100))
        }
    }
}
