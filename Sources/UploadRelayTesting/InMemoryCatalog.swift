import Foundation
import NIOConcurrencyHelpers
import UploadRelay
import UploadProtocol

/// A catalog in memory, for tests and tools: the same answers as the SQLite and PostgreSQL catalogs (the contract suite
/// runs on all three), every call one step under one lock as a transaction would be, nothing durable. Several relays
/// (sessions, servers) share one by sharing the instance.
public final class InMemoryCatalog: Catalog, MultipartLedger, Sendable {
    private struct Row: Hashable {
        var account: String
        var key: String
    }

    private struct Event {
        var event: CommitEvent
        var nextAttempt: Date
        var lastError: String?
    }

    private struct State {
        var accounts: [String: Account] = [:]
        var looks: [String: Date] = [:]
        var sessions: [String: UploadSession] = [:]
        var parts: [String: [Int: StagedPart]] = [:]
        var stripes: [String: [Int: Int64]] = [:]
        var objects: [Row: StoredObject] = [:]
        var pending: [Row: (commit: PendingCommit, delta: Int64)] = [:]
        var events: [Int64: Event] = [:]
        var lastEventID: Int64 = 0
        var intents: [Int64: MultipartIntent] = [:]
        var lastIntentID: Int64 = 0
        /// Objects whose removal (``removeObject(account:key:removingFile:)``) is under way.
        var removing: Set<Row> = []

        func session(_ account: String, _ key: String) -> UploadSession? {
            self.sessions.values.first { $0.account == account && $0.key == key }
        }

        mutating func dropSession(_ id: String) {
            self.sessions[id] = nil
            self.parts[id] = nil
            self.stripes[id] = nil
        }

        /// The quota rule of ``Catalog/quotaUse(account:excludingKey:active:)``, as the SQL catalogs read it.
        func quotaUse(_ account: String, excludingKey key: String, active: [String: Int64]) throws -> QuotaUse {
            guard let row = self.accounts[account] else { throw CatalogError.unknownAccount(account) }
            let committing = self.pending.values
                .filter { $0.commit.account == account && $0.commit.key != key && $0.delta > 0 }
                .reduce(Int64(0)) { $0 + $1.delta }
            let committingKeys = Set(self.pending.keys.filter { $0.account == account }.map(\.key))
            var staged = StagedBytes(active: active, excluding: key)
            for session in self.sessions.values where session.account == account && session.key != key && !committingKeys.contains(session.key) {
                let stripes = self.stripes[session.id]?.values.reduce(Int64(0), +) ?? 0
                let replaced = self.objects[Row(account: account, key: session.key)]?.size ?? 0
                staged.addSession(key: session.key, declared: session.declaredSize, durable: session.durableOffset + stripes, replaced: replaced)
            }
            if staged.hasUnrecorded {
                for committingKey in committingKeys { staged.dropCommitting(committingKey) }
            }
            for (openKey, announced) in staged.announced {
                staged.addAnnounced(announced, replacing: self.objects[Row(account: account, key: openKey)]?.size ?? 0)
            }
            return QuotaUse(quota: row.quota, stored: row.usedBytes, committing: committing, staged: staged.total)
        }

        mutating func beginCommit(_ commit: PendingCommit) throws {
            guard !self.removing.contains(Row(account: commit.account, key: commit.key)) else {
                throw CatalogError.unavailable("the object \"\(commit.key)\" is being removed (upload-relay rm); retry")
            }
            let use = try self.quotaUse(commit.account, excludingKey: commit.key, active: [:])
            let row = Row(account: commit.account, key: commit.key)
            let delta = commit.size - (self.objects[row]?.size ?? 0)
            if let quota = use.quota, delta > 0, use.stored + use.committing + delta > quota {
                throw CatalogError.quotaExceeded(account: commit.account, needed: delta, quota: quota, used: use.stored + use.committing)
            }
            self.pending[row] = (commit, delta)
        }

        mutating func finishCommit(_ commit: PendingCommit, identity: ObjectIdentity) {
            let row = Row(account: commit.account, key: commit.key)
            let previous = self.objects[row]?.size ?? 0
            let now = Date()
            // The identity as the SQL catalogs keep it: device, inode and time, with the object's size.
            let recorded = ObjectIdentity(device: identity.device, inode: identity.inode, size: commit.size, modified: identity.modified)
            self.objects[row] = StoredObject(
                account: commit.account, key: commit.key, size: commit.size, sha1: commit.sha1, identity: recorded, committedAt: now,
                probeSHA1: commit.probeSHA1
            )
            self.accounts[commit.account]?.usedBytes += commit.size - previous
            self.pending[row] = nil
            if let sessionID = commit.sessionID { self.dropSession(sessionID) }
            if let location = commit.location {
                self.lastEventID += 1
                let event = CommitEvent(
                    id: self.lastEventID, account: commit.account, key: commit.key, size: commit.size, sha1: commit.sha1, location: location,
                    committedAt: now, attempts: 0
                )
                self.events[self.lastEventID] = Event(event: event, nextAttempt: now, lastError: nil)
            }
        }
    }

    private let state = NIOLockedValueBox(State())

    public init() {}

    private func locked<T>(_ body: (inout State) throws -> T) rethrows -> T {
        try self.state.withLockedValue { try body(&$0) }
    }

    /// Whether `key` sorts before `other` in the byte order of their UTF-8, as the SQL catalogs list keys.
    private static func precedes(_ key: String, _ other: String) -> Bool {
        key.utf8.lexicographicallyPrecedes(other.utf8)
    }

    /// The page of ``objects(account:prefix:after:limit:)``: `prefix` as bytes, after `after`, in UTF-8 order.
    private static func page<T>(_ items: [T], key: (T) -> String, prefix: String, after: String?, limit: Int) -> [T] {
        let chosen = items.filter { item in
            let itemKey = key(item)
            return itemKey.utf8.starts(with: prefix.utf8) && (after.map { Self.precedes($0, itemKey) } ?? true)
        }
        return Array(chosen.sorted { Self.precedes(key($0), key($1)) }.prefix(max(0, limit)))
    }

    // MARK: Accounts

    public func addAccount(name: String, tokenHash: [UInt8], quota: Int64?) async throws {
        guard Account.isValidName(name) else { throw CatalogError.invalidAccountName(name) }
        try self.locked { state in
            guard state.accounts[name] == nil else { throw CatalogError.accountExists(name) }
            state.accounts[name] = Account(name: name, quota: quota, tokenHash: tokenHash)
        }
    }

    public func account(tokenHash: [UInt8]) async throws -> Account? {
        self.locked { state in state.accounts.values.first { $0.tokenHash == tokenHash } }
    }

    public func account(named name: String) async throws -> Account? {
        self.locked { $0.accounts[name] }
    }

    public func accounts() async throws -> [Account] {
        self.locked { $0.accounts.values.sorted { Self.precedes($0.name, $1.name) } }
    }

    public func clock() async throws -> Date { Date() }

    public func recordLook(relay: String, readAt: Date) async throws {
        self.locked { state in
            state.looks[relay] = max(state.looks[relay] ?? readAt, readAt)
            state.looks = state.looks.filter { $0.value > readAt.addingTimeInterval(-86_400) }
        }
    }

    public func relayLooks() async throws -> [String: Date] {
        self.locked { $0.looks }
    }

    public func forgetLook(relay: String) async throws {
        self.locked { $0.looks[relay] = nil }
    }

    public func revokeAccount(named name: String) async throws -> Bool {
        self.locked { state in
            guard state.accounts[name] != nil else { return false }
            state.accounts[name]?.revoked = true
            return true
        }
    }

    public func deleteAccount(named name: String) async throws -> Bool {
        try self.locked { state in
            guard state.accounts[name] != nil else { return false }
            if state.objects.keys.contains(where: { $0.account == name }) { throw CatalogError.accountInUse(name, holds: "objects") }
            if state.sessions.values.contains(where: { $0.account == name }) { throw CatalogError.accountInUse(name, holds: "uploads under way") }
            if state.pending.keys.contains(where: { $0.account == name }) { throw CatalogError.accountInUse(name, holds: "commits being settled") }
            state.accounts[name] = nil
            return true
        }
    }

    public func updateAccount(named name: String, quota: Int64??, tokenHash: [UInt8]?, revoked: Bool?) async throws -> Bool {
        self.locked { state in
            guard var account = state.accounts[name] else { return false }
            if let quota { account.quota = quota }
            if let tokenHash { account.tokenHash = tokenHash }
            if let revoked { account.revoked = revoked }
            state.accounts[name] = account
            return true
        }
    }

    // MARK: Upload sessions

    public func session(account: String, key: String) async throws -> UploadSession? {
        self.locked { $0.session(account, key) }
    }

    public func putSession(_ session: UploadSession) async throws {
        try await self.putSession(session, parts: [])
    }

    public func putSession(_ session: UploadSession, parts: [StagedPart]) async throws {
        self.locked { state in
            if let old = state.session(session.account, session.key) { state.dropSession(old.id) }
            state.sessions[session.id] = session
            for part in parts { state.parts[session.id, default: [:]][part.number] = part }
        }
    }

    public func updateDurable(sessionID: String, offset: Int64, sha1State: [UInt8]) async throws {
        try await self.updateDurable(sessionID: sessionID, offset: offset, sha1State: sha1State, parts: [])
    }

    public func updateDurable(sessionID: String, offset: Int64, sha1State: [UInt8], parts: [StagedPart]) async throws {
        try self.locked { state in
            // A session that is gone cannot vouch for durable bytes: never acknowledge them.
            guard var session = state.sessions[sessionID] else { throw CatalogError.unknownSession(sessionID) }
            session.durableOffset = offset
            session.sha1State = sha1State
            session.updatedAt = Date()
            state.sessions[sessionID] = session
            for part in parts { state.parts[sessionID, default: [:]][part.number] = part }
        }
    }

    public func stagedParts(sessionID: String) async throws -> [StagedPart] {
        self.locked { state in (state.parts[sessionID] ?? [:]).values.sorted { $0.number < $1.number } }
    }

    public func deleteSession(id: String) async throws {
        self.locked { $0.dropSession(id) }
    }

    public func sessions(updatedBefore date: Date) async throws -> [UploadSession] {
        self.locked { state in state.sessions.values.filter { $0.updatedAt < date } }
    }

    public func completeStripe(sessionID: String, index: Int, bytes: Int64) async throws {
        try self.locked { state in
            guard state.sessions[sessionID] != nil else { throw CatalogError.unknownSession(sessionID) }
            state.sessions[sessionID]?.updatedAt = Date()
            if state.stripes[sessionID]?[index] == nil { state.stripes[sessionID, default: [:]][index] = bytes }
        }
    }

    public func completeStripes(sessionID: String) async throws -> Set<Int> {
        self.locked { state in Set((state.stripes[sessionID] ?? [:]).keys) }
    }

    public func sessions(account: String, prefix: String, after: String?, limit: Int) async throws -> [UploadSession] {
        self.locked { state in
            Self.page(state.sessions.values.filter { $0.account == account }, key: \.key, prefix: prefix, after: after, limit: limit)
        }
    }

    public func unfinishedUploads(account: String, limit: Int) async throws -> Int {
        self.locked { state in min(limit, state.sessions.values.lazy.filter { $0.account == account }.count) }
    }

    public func unfinishedTotals() async throws -> (uploads: Int, bytes: Int64) {
        self.locked { state in (state.sessions.count, state.sessions.values.reduce(Int64(0)) { $0 + $1.durableOffset }) }
    }

    // MARK: Objects

    public func object(account: String, key: String) async throws -> StoredObject? {
        self.locked { $0.objects[Row(account: account, key: key)] }
    }

    public func object(account: String, size: Int64, sha1: String) async throws -> [StoredObject] {
        self.locked { state in
            Array(state.objects.values.filter { $0.account == account && $0.size == size && $0.sha1 == sha1 }.prefix(8))
        }
    }

    public func probeCandidates(account: String, size: Int64, probe: String) async throws -> [StoredObject] {
        self.locked { state in
            Array(
                state.objects.values.filter { $0.account == account && $0.size == size && ($0.probeSHA1 == probe || $0.probeSHA1 == nil) }.prefix(8))
        }
    }

    public func objects() async throws -> [StoredObject] {
        self.locked { Array($0.objects.values) }
    }

    public func objects(account: String, prefix: String, after: String?, limit: Int) async throws -> [StoredObject] {
        self.locked { state in
            Self.page(state.objects.values.filter { $0.account == account }, key: \.key, prefix: prefix, after: after, limit: limit)
        }
    }

    public func deleteObject(account: String, key: String) async throws {
        self.locked { state in
            guard let object = state.objects.removeValue(forKey: Row(account: account, key: key)) else { return }
            state.accounts[account]?.usedBytes -= object.size
        }
    }

    /// The key is marked as being removed while `removingFile` runs (no lock is held across it): a commit of the key
    /// meanwhile is refused (``beginCommit(_:)``), as the SQL catalogs make it wait.
    public func removeObject(
        account: String, key: String, removingFile: @escaping @Sendable (StoredObject) async throws -> Void
    ) async throws -> ObjectRemoval {
        let row = Row(account: account, key: key)
        // `.removed` here: the object, to remove now.
        let found = self.locked { state -> ObjectRemoval in
            guard let object = state.objects[row] else { return .notStored }
            if state.session(account, key) != nil { return .uploading }
            if state.pending[row] != nil || state.removing.contains(row) { return .committing }
            state.removing.insert(row)
            return .removed(object)
        }
        guard case .removed(let object) = found else { return found }
        do {
            try await removingFile(object)
        } catch {
            self.locked { _ = $0.removing.remove(row) }
            throw error
        }
        return self.locked { state in
            state.removing.remove(row)
            state.objects[row] = nil
            state.accounts[account]?.usedBytes -= object.size
            return .removed(object)
        }
    }

    // MARK: Quota and commits

    public func quotaUse(account: String, excludingKey key: String, active: [String: Int64]) async throws -> QuotaUse {
        try self.locked { try $0.quotaUse(account, excludingKey: key, active: active) }
    }

    public func beginCommit(_ commit: PendingCommit) async throws {
        try self.locked { try $0.beginCommit(commit) }
    }

    public func beginCommits(_ commits: [PendingCommit]) async throws -> [CatalogError?] {
        try self.locked { state in try Self.reserving(commits) { try state.beginCommit($0) } }
    }

    public func finishCommit(_ commit: PendingCommit, identity: ObjectIdentity) async throws {
        self.locked { $0.finishCommit(commit, identity: identity) }
    }

    public func finishCommits(_ commits: [(PendingCommit, ObjectIdentity)]) async throws {
        self.locked { state in
            for (commit, identity) in commits { state.finishCommit(commit, identity: identity) }
        }
    }

    public func abandonCommit(account: String, key: String) async throws {
        self.locked { $0.pending[Row(account: account, key: key)] = nil }
    }

    public func pendingCommit(account: String, key: String) async throws -> PendingCommit? {
        self.locked { state in state.pending[Row(account: account, key: key)].map { Self.recorded($0.commit) } }
    }

    public func pendingCommits() async throws -> [PendingCommit] {
        self.locked { state in state.pending.values.map { Self.recorded($0.commit) } }
    }

    /// A pending commit as the SQL catalogs keep it: the probe digest goes with the commit's own call, not its record.
    private static func recorded(_ commit: PendingCommit) -> PendingCommit {
        var commit = commit
        commit.probeSHA1 = nil
        return commit
    }

    // MARK: The hooks' outbox

    public func claimCommitEvents(limit: Int, lease: Duration) async throws -> [CommitEvent] {
        self.locked { state in
            let now = Date()
            let due = state.events.values.filter { $0.nextAttempt <= now }.sorted { $0.event.id < $1.event.id }.prefix(max(0, limit))
            return due.map { entry in
                var claimed = entry
                claimed.event.attempts += 1
                claimed.nextAttempt = now.addingTimeInterval(lease.inSeconds)
                state.events[entry.event.id] = claimed
                return claimed.event
            }
        }
    }

    public func finishCommitEvent(id: Int64) async throws {
        self.locked { $0.events[id] = nil }
    }

    public func retryCommitEvent(id: Int64, at retryAt: Date, error: String) async throws {
        self.locked { state in
            state.events[id]?.nextAttempt = retryAt
            state.events[id]?.lastError = error
        }
    }

    public func commitEventBacklog() async throws -> CommitEventBacklog {
        self.locked { state in
            let events = state.events.values.sorted { $0.event.id < $1.event.id }
            return CommitEventBacklog(
                count: events.count, lastError: events.first { $0.lastError != nil }?.lastError,
                oldest: events.map(\.event.committedAt).min()
            )
        }
    }

    public func ping() async throws {}

    // MARK: The multipart ledger

    public func recordMultipartIntent(account: String, key: String, objectKey: String) async throws -> Int64 {
        self.locked { state in
            state.lastIntentID += 1
            state.intents[state.lastIntentID] = MultipartIntent(
                id: state.lastIntentID, account: account, key: key, objectKey: objectKey, uploadID: nil, createdAt: Date()
            )
            return state.lastIntentID
        }
    }

    public func recordMultipartUpload(intent: Int64, uploadID: String) async throws {
        self.locked { $0.intents[intent]?.uploadID = uploadID }
    }

    public func multipartIntents() async throws -> [MultipartIntent] {
        self.locked { state in state.intents.values.sorted { $0.id < $1.id } }
    }

    public func forgetMultipartIntent(id: Int64) async throws {
        self.locked { $0.intents[id] = nil }
    }
}
