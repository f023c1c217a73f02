import Foundation

/// An account: who may upload, with how much room (SPEC §2.3).
public struct Account: Hashable, Sendable {
    public var name: String
    /// Bytes the account may hold; nil means no limit.
    public var quota: Int64?
    /// Bytes of committed objects.
    public var usedBytes: Int64
    /// Disabled (`token revoke` or `token disable`): its token is refused until `token enable`.
    public var revoked: Bool
    public var createdAt: Date
    /// The hash of its token now: a `token rotate` changes it, and connections made with the old one close.
    public var tokenHash: [UInt8]

    public init(
        name: String, quota: Int64?, usedBytes: Int64 = 0, revoked: Bool = false, createdAt: Date = Date(), tokenHash: [UInt8] = []
    ) {
        self.name = name
        self.quota = quota
        self.usedBytes = usedBytes
        self.revoked = revoked
        self.createdAt = createdAt
        self.tokenHash = tokenHash
    }

    /// Whether this account, as the catalog holds it now, is still the principal a connection authenticated as
    /// `principal`: not disabled, and with the token that connection presented. A rotated token, or an account deleted
    /// and made again under the same name (a new token), is another principal, and the old connection acts for neither.
    public func isPrincipal(_ principal: Account) -> Bool {
        !self.revoked && self.name == principal.name && self.tokenHash == principal.tokenHash
    }

    /// Whether `bytes` more fit the quota.
    public func fits(_ bytes: Int64) -> Bool {
        guard let quota = self.quota else { return true }
        return self.usedBytes + bytes <= quota
    }

    /// The longest account name: it is a folder name in the store.
    public static let maxNameLength = 64

    /// Whether `name` can name an account: 1 to 64 of `A-Z a-z 0-9 . _ -`, not starting with "." or "-", because
    /// the account's objects live in the store's folder of that name (`<store>/NAME/KEY`).
    public static func isValidName(_ name: String) -> Bool {
        let bytes = Array(name.utf8)
        guard !bytes.isEmpty, bytes.count <= Self.maxNameLength, bytes[0] != UInt8(ascii: "."), bytes[0] != UInt8(ascii: "-") else {
            return false
        }
        return bytes.allSatisfy { byte in
            (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte) || (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte)
                || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "_")
                || byte == UInt8(ascii: "-")
        }
    }
}

/// How much of an account's quota is taken, and by what (SPEC §7).
public struct QuotaUse: Hashable, Sendable {
    /// The account's quota; nil means no limit.
    public var quota: Int64?
    /// Bytes of committed objects.
    public var stored: Int64
    /// Growth that commits under way have reserved.
    public var committing: Int64
    /// Bytes that the account's other unfinished uploads hold (durable bytes), or, for uploads open now, announced.
    public var staged: Int64

    public init(quota: Int64?, stored: Int64, committing: Int64, staged: Int64) {
        self.quota = quota
        self.stored = stored
        self.committing = committing
        self.staged = staged
    }

    /// Bytes left for a new upload.
    public var left: Int64 {
        guard let quota = self.quota else { return .max }
        return max(0, quota - self.stored - self.committing - self.staged)
    }

    /// For people: what takes the quota, and what to do.
    public func refusal(account: String, needed: Int64) -> String {
        var text = "account \"\(account)\" has \(self.left) bytes of its \(self.quota ?? 0)-byte quota left (\(self.stored) stored"
        if self.committing > 0 { text += ", \(self.committing) being committed" }
        if self.staged > 0 { text += ", \(self.staged) held by unfinished uploads: finish or cancel them, or they expire" }
        return text + "); this upload needs \(needed)"
    }
}

/// An unfinished upload: what a resume needs after either side restarted (SPEC §6).
public struct UploadSession: Hashable, Sendable {
    public var id: String
    public var account: String
    public var key: String
    public var resumeToken: [UInt8]
    public var fingerprint: [UInt8]
    public var declaredSize: Int64?
    /// Every byte below this offset is fsynced in the staging file.
    public var durableOffset: Int64
    /// The SHA-1 state at `durableOffset` (``UploadChecksums/SHA1/exportState()``).
    public var sha1State: [UInt8]
    /// The staging file's name in the store's staging area.
    public var stagingName: String
    /// The SHA-1 the OPEN that created the session stated, if any (SPEC §6.2).
    public var declaredSHA1: String?
    /// Created by an OPEN with STRIPED: `durableOffset` covers stripe 0, PART streams bring the others (SPEC §6.7).
    public var striped: Bool
    public var updatedAt: Date

    public init(
        id: String, account: String, key: String, resumeToken: [UInt8], fingerprint: [UInt8], declaredSize: Int64?,
        durableOffset: Int64, sha1State: [UInt8], stagingName: String, declaredSHA1: String? = nil, striped: Bool = false,
        updatedAt: Date = Date()
    ) {
        self.declaredSHA1 = declaredSHA1
        self.striped = striped
        self.id = id
        self.account = account
        self.key = key
        self.resumeToken = resumeToken
        self.fingerprint = fingerprint
        self.declaredSize = declaredSize
        self.durableOffset = durableOffset
        self.sha1State = sha1State
        self.stagingName = stagingName
        self.updatedAt = updatedAt
    }
}

/// The quota rule for what an account's other unfinished uploads hold, in one place for every catalog: each reads its
/// rows into it.
///
/// A session left behind (the agent stopped or was killed) holds its durable bytes; one whose upload is open now will
/// hold what it announced. Counting left-behind sessions by what they announced would let a killed run's sessions
/// refuse its own re-run. A session that will replace an object counts only what it adds to it, as its
/// commit will: counting a re-sent 17 MB stdin whole refused small files that fitted. Open
/// uploads with no session yet (recorded by their first durable sync) hold what they announced; one whose commit is
/// under way is counted by it, not twice.
package struct StagedBytes {
    package private(set) var total: Int64 = 0
    /// Uploads open now that no session row accounted for: key → bytes announced.
    private var unrecorded: [String: Int64]
    private let active: [String: Int64]

    /// For the account's uploads other than `key`; `active` holds what each upload open now announced.
    package init(active: [String: Int64], excluding key: String) {
        self.active = active
        var unrecorded = active
        unrecorded[key] = nil
        self.unrecorded = unrecorded
    }

    /// A session of another key, with its durable bytes (stripes included) and the size of the object it replaces.
    package mutating func addSession(key: String, declared: Int64?, durable: Int64, replaced: Int64) {
        self.add((self.active[key] != nil ? max(declared ?? durable, durable) : durable) - replaced)
        self.unrecorded[key] = nil
    }

    /// Whether open uploads with no session remain: then the keys with a commit under way are to be dropped, and the
    /// rest added with what each replaces.
    package var hasUnrecorded: Bool { self.unrecorded.values.contains { $0 > 0 } }

    /// A key whose commit is under way: its commit counts it.
    package mutating func dropCommitting(_ key: String) {
        self.unrecorded[key] = nil
    }

    /// The open uploads still to add: key and bytes announced.
    package var announced: [(key: String, bytes: Int64)] {
        self.unrecorded.filter { $0.value > 0 }.map { ($0.key, $0.value) }
    }

    /// An open upload with no session, announcing `bytes`, replacing an object of `replaced` bytes.
    package mutating func addAnnounced(_ bytes: Int64, replacing replaced: Int64) {
        self.add(bytes - replaced)
    }

    /// Saturating: with no quota, sizes near Int64.max must not wrap.
    private mutating func add(_ held: Int64) {
        let held = max(0, held)
        self.total = self.total.addingReportingOverflow(held).overflow ? .max : self.total + held
    }
}

/// One part of an upload a store keeps in parts (S3's multipart upload), as the catalog records it.
public struct StagedPart: Hashable, Sendable {
    /// 1, 2, ...
    public var number: Int
    /// The offset in the blob where the part ends.
    public var end: Int64
    public var etag: String
    /// The part's SHA-1, base64 (`x-amz-checksum-sha1`).
    public var sha1: String

    public init(number: Int, end: Int64, etag: String, sha1: String) {
        self.number = number
        self.end = end
        self.etag = etag
        self.sha1 = sha1
    }
}

/// A committed, verified object.
public struct StoredObject: Hashable, Sendable {
    public var account: String
    public var key: String
    public var size: Int64
    /// Lowercase hex.
    public var sha1: String
    /// The stored file as it was right after the commit; nil while a commit is under way or after a crash
    /// interrupted one (startup recovery settles it).
    public var identity: ObjectIdentity?
    public var committedAt: Date
    /// Lowercase hex SHA-1 of the first 256 KiB, for a blob larger than that (the dedup probe, SPEC §7.1); nil when not
    /// known (smaller, committed before the probe existed, or recovered after a crash).
    public var probeSHA1: String?

    public init(
        account: String, key: String, size: Int64, sha1: String, identity: ObjectIdentity? = nil, committedAt: Date = Date(),
        probeSHA1: String? = nil
    ) {
        self.account = account
        self.key = key
        self.size = size
        self.sha1 = sha1
        self.identity = identity
        self.committedAt = committedAt
        self.probeSHA1 = probeSHA1
    }
}

/// A commit between its quota reservation and its record: what startup recovery settles after a crash.
public struct PendingCommit: Hashable, Sendable {
    public var account: String
    public var key: String
    public var size: Int64
    public var sha1: String
    /// The upload session the bytes come from; nil for a dedup copy.
    public var sessionID: String?
    /// The probe digest to record with the object (``StoredObject/probeSHA1``). Not kept across a crash: a recovered
    /// commit records none.
    public var probeSHA1: String?
    /// Where the object will be (``BlobStore/location(of:account:)``), when post-commit hooks run: the commit's record
    /// then queues a ``CommitEvent`` in the same transaction, and a recovered commit queues it too.
    public var location: String?

    public init(
        account: String, key: String, size: Int64, sha1: String, sessionID: String?, probeSHA1: String? = nil, location: String? = nil
    ) {
        self.account = account
        self.key = key
        self.size = size
        self.sha1 = sha1
        self.sessionID = sessionID
        self.probeSHA1 = probeSHA1
        self.location = location
    }
}

/// A committed object waiting for its post-commit hooks (the outbox): queued by the commit's own
/// transaction, so never lost; gone once every hook took it.
public struct CommitEvent: Hashable, Sendable {
    public var id: Int64
    public var account: String
    public var key: String
    public var size: Int64
    /// Lowercase hex.
    public var sha1: String
    /// Where the object is: a path for the local store, `s3://BUCKET/KEY` for S3.
    public var location: String
    public var committedAt: Date
    /// Deliveries begun, this one included.
    public var attempts: Int

    public init(id: Int64, account: String, key: String, size: Int64, sha1: String, location: String, committedAt: Date, attempts: Int) {
        self.id = id
        self.account = account
        self.key = key
        self.size = size
        self.sha1 = sha1
        self.location = location
        self.committedAt = committedAt
        self.attempts = attempts
    }
}

/// What a catalog reports to people: a refusal of what was asked (an account that exists, a quota exceeded, ...), or
/// ``unavailable(_:)``, the catalog itself out of reach.
public enum CatalogError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The catalog could not be reached or used (a database down, a URL it cannot use, a schema too new): the relay's
    /// failure, not a refusal of the upload, which keeps its session. The text says what and what to check.
    case unavailable(String)
    case accountExists(String)
    case unknownAccount(String)
    case invalidAccountName(String)
    case unknownSession(String)
    case quotaExceeded(account: String, needed: Int64, quota: Int64, used: Int64)
    /// The account still has rows of this kind (objects, uploads, commits): it cannot go yet.
    case accountInUse(String, holds: String)

    /// Whether this is the catalog out of reach (``unavailable(_:)``), not a refusal of one request.
    public var isUnavailable: Bool {
        if case .unavailable = self { return true }
        return false
    }

    public var description: String {
        switch self {
        case .unavailable(let reason):
            return reason
        case .accountExists(let name):
            return "account \"\(name)\" already exists (give it a new token with `token rotate`, or pick another name)"
        case .unknownSession(let id):
            return "upload session \(id) is gone (expired or replaced); upload again"
        case .invalidAccountName(let name):
            return
                "\"\(name)\" cannot name an account: use 1 to \(Account.maxNameLength) letters, digits, \".\", \"_\" or \"-\", not starting with \".\" or \"-\" (it names the account's folder in the store)"
        case .unknownAccount(let name):
            return "no account named \"\(name)\" (see: upload-relay token list)"
        case .quotaExceeded(let account, let needed, let quota, let used):
            return "account \"\(account)\" would exceed its quota: \(used) + \(needed) bytes > \(quota)"
        case .accountInUse(let account, let holds):
            return "account \"\(account)\" still has \(holds) in the catalog: it was not deleted"
        }
    }
}

/// Accounts: names, hashed tokens, quotas, whether disabled.
public protocol AccountCatalog: Sendable {
    func addAccount(name: String, tokenHash: [UInt8], quota: Int64?) async throws
    func account(tokenHash: [UInt8]) async throws -> Account?
    func account(named name: String) async throws -> Account?
    func accounts() async throws -> [Account]
    /// Revokes the account's token; false when there is no such account.
    func revokeAccount(named name: String) async throws -> Bool
    /// Deletes the account, once it has no object, upload session or pending commit left (``CatalogError/accountInUse(_:holds:)``
    /// otherwise); false when there is no such account. Its name may be given again afterwards.
    func deleteAccount(named name: String) async throws -> Bool
    /// Changes what is given of account `name`: its quota (`.some(nil)`: no limit), its token's hash (a rotation), whether
    /// it is disabled. False when there is no such account.
    func updateAccount(named name: String, quota: Int64??, tokenHash: [UInt8]?, revoked: Bool?) async throws -> Bool
    /// The catalog's own time (the database server's clock where relays share one): looks and the changes they are
    /// compared with are timed by it, whatever the hosts' clocks say.
    func clock() async throws -> Date
    /// Relay `relay` (an id of its running process) told each of its connections the accounts as read at `readAt`:
    /// those whose principal was gone by then are closing. Looks older than a day are forgotten meanwhile.
    func recordLook(relay: String, readAt: Date) async throws
    /// Each relay's last look: when the accounts it last told its connections about were read, by ``clock()``. A look
    /// recorded out of order never replaces a later one.
    func relayLooks() async throws -> [String: Date]
    /// Relay `relay` stopped, every connection of its closed.
    func forgetLook(relay: String) async throws
}

/// Upload sessions: what is durable of each unfinished upload, so that any relay sharing the catalog can resume it.
public protocol SessionCatalog: Sendable {
    func session(account: String, key: String) async throws -> UploadSession?
    /// The sessions of these keys of the account that have one, by key: one read for many (a quota plan, SPEC §7.2).
    func sessions(account: String, keys: [String]) async throws -> [String: UploadSession]
    /// Records a new session, replacing any other session of the same account and key.
    func putSession(_ session: UploadSession) async throws
    func updateDurable(sessionID: String, offset: Int64, sha1State: [UInt8]) async throws
    /// ``putSession(_:)`` and ``updateDurable(sessionID:offset:sha1State:)`` for a store that keeps bytes in parts
    /// (S3): the parts made durable since the last record go in with the offset, in one transaction, so that any relay
    /// can complete the upload (S3 lists a part's ETag, not its checksum). A part recorded again replaces the old.
    func putSession(_ session: UploadSession, parts: [StagedPart]) async throws
    func updateDurable(sessionID: String, offset: Int64, sha1State: [UInt8], parts: [StagedPart]) async throws
    /// The parts recorded for the session, by number.
    func stagedParts(sessionID: String) async throws -> [StagedPart]
    func deleteSession(id: String) async throws
    func sessions(updatedBefore date: Date) async throws -> [UploadSession]
    /// Records that stripe `index` of the striped session, `bytes` long, is durable in its staging file (SPEC §6.7);
    /// throws ``CatalogError/unknownSession(_:)`` when the session is gone. Deleting the session forgets its stripes.
    /// The session holds them against the quota, as it holds its durable bytes.
    func completeStripe(sessionID: String, index: Int, bytes: Int64) async throws
    /// The stripes of the session recorded complete.
    func completeStripes(sessionID: String) async throws -> Set<Int>
    /// ``objects(account:prefix:after:limit:)`` for the account's recorded sessions: its uploads under way.
    func sessions(account: String, prefix: String, after: String?, limit: Int) async throws -> [UploadSession]
    /// How many unfinished uploads the account has recorded, counted up to `limit` at most (the count stops there, so
    /// an account's thousands cost no more than the limit).
    func unfinishedUploads(account: String, limit: Int) async throws -> Int
    /// Every account's unfinished uploads together: how many, and the durable bytes of their main streams. Summed by
    /// the catalog, so a scrape costs the same however many there are.
    func unfinishedTotals() async throws -> (uploads: Int, bytes: Int64)
}

/// The object index: committed objects by key and by content (size and SHA-1), for dedup, listings and recovery.
public protocol ObjectIndex: Sendable {
    func object(account: String, key: String) async throws -> StoredObject?
    /// The objects of these keys of the account that have one, by key: one read for many (a quota plan, SPEC §7.2).
    func objects(account: String, keys: [String]) async throws -> [String: StoredObject]
    func object(account: String, size: Int64, sha1: String) async throws -> [StoredObject]
    /// Objects of the account with this size whose first 256 KiB may have the SHA-1 `probe`: a recorded probe that
    /// matches, or none recorded (SPEC §7.1). At most a few.
    func probeCandidates(account: String, size: Int64, probe: String) async throws -> [StoredObject]
    /// Every committed object, for startup recovery.
    func objects() async throws -> [StoredObject]
    /// A page of the account's objects whose keys start with `prefix`, after the key `after` (none: from the first), at
    /// most `limit`, in the byte order of their keys' UTF-8 (the status endpoint's listing).
    func objects(account: String, prefix: String, after: String?, limit: Int) async throws -> [StoredObject]
    /// Forgets an object whose file is gone, giving its bytes back to the quota.
    func deleteObject(account: String, key: String) async throws
    /// `rm`: in one write transaction, which a relay's commit of the key waits for on either catalog, refuses while an
    /// upload session or a pending commit of the key exists; else runs `removingFile` with the object's row (it may refuse
    /// by throwing: then nothing changes) and deletes the row.
    func removeObject(
        account: String, key: String, removingFile: @escaping @Sendable (StoredObject) async throws -> Void
    ) async throws -> ObjectRemoval
}

/// The commit log: quota admission of OPENs, and commits reserved, recorded or abandoned (SPEC §7, §8.3).
public protocol CommitLog: Sendable {
    /// The account's quota and what takes it, not counting the session of `key` (the upload asking). Unfinished
    /// sessions count the bytes they hold; those whose key is in `active` (an upload is open on it now) count the
    /// size they announced, which they are about to hold. A session of a key that holds an object counts only what
    /// it holds beyond that object's size: its commit replaces the object.
    /// An open upload whose session is not recorded yet (a new one, before its first durable sync) counts the size it
    /// announced in `active` (key → bytes, 0 when unknown) beyond its key's object likewise.
    func quotaUse(account: String, excludingKey key: String, active: [String: Int64]) async throws -> QuotaUse

    /// The admission of an OPEN of `key` that announced `announced` bytes (0: unknown) and grows the account by `growth`:
    /// ``quotaUse(account:excludingKey:active:)``, and, when `growth` fits what is left, the announced size held for the
    /// upload, in one decision per account. A catalog several relays share counts there what the uploads open on the
    /// other relays announced, and records this one's for them, held while this relay holds the key's lock
    /// (``keyLocks``): two relays can never both admit what only one fits. The caller refuses when `growth`
    /// exceeds the answer's ``QuotaUse/left``. An account without a quota holds nothing back: its answer may count its
    /// stored bytes only (its ``QuotaUse/left`` is unlimited whatever else it holds), so that its OPENs cost one read.
    func admit(account: String, key: String, announced: Int64, growth: Int64, active: [String: Int64]) async throws -> QuotaUse

    /// Reserves the quota a commit needs and records it as under way, in one transaction, so that two commits of
    /// one account can never both pass the check. Throws
    /// ``CatalogError/quotaExceeded(account:needed:quota:used:)``. Call before the store makes the object visible.
    func beginCommit(_ commit: PendingCommit) async throws
    /// The store made the object visible: records it with its identity, charges the quota, forgets the commit and
    /// the session, in one transaction.
    func finishCommit(_ commit: PendingCommit, identity: ObjectIdentity) async throws
    /// ``beginCommit(_:)`` for many commits (group commit): each reserved in turn, all recorded by one transaction. The
    /// error of each commit that could not be reserved, nil for each reserved; throws when none could be recorded.
    func beginCommits(_ commits: [PendingCommit]) async throws -> [CatalogError?]
    /// ``finishCommit(_:identity:)`` for many commits, in one transaction.
    func finishCommits(_ commits: [(PendingCommit, ObjectIdentity)]) async throws
    /// The store did not make the object visible: gives the reservation back (the session stays).
    func abandonCommit(account: String, key: String) async throws
    /// Commits that were under way when the relay stopped.
    func pendingCommits() async throws -> [PendingCommit]
    /// The commit of `key` under way, if any: ``pendingCommits()`` of one key, which an OPEN asks for (reading them all
    /// per OPEN cost a row per commit under way in every other upload).
    func pendingCommit(account: String, key: String) async throws -> PendingCommit?
}

/// The hooks' outbox: an event per committed object, queued by the commit's own transaction, delivered at least once.
public protocol HookOutbox: Sendable {
    /// Up to `limit` queued commit events due now, oldest first, each held for `lease` (another relay, or this one's
    /// next look, takes it again only after that): at least once, never lost.
    func claimCommitEvents(limit: Int, lease: Duration) async throws -> [CommitEvent]
    /// Every hook took the event: it goes.
    func finishCommitEvent(id: Int64) async throws
    /// A hook failed: the event is tried again at `retryAt`, with the reason kept.
    func retryCommitEvent(id: Int64, at retryAt: Date, error: String) async throws
    /// How many events wait, the oldest one's last error, and when the oldest was committed.
    func commitEventBacklog() async throws -> CommitEventBacklog
}

/// The relay's durable memory, five concerns in one database (ARCHITECTURE "Storage and catalog"): accounts, upload
/// sessions, the object index, the commit log and the hooks' outbox. Every call is async: a catalog never blocks its caller's thread. A part of
/// the relay that needs one concern takes that protocol alone.
public protocol Catalog: AccountCatalog, SessionCatalog, ObjectIndex, CommitLog, HookOutbox {
    /// Answers when the catalog can be read (``/readyz``); throws what stopped it otherwise.
    func ping() async throws

    /// The locks on keys that every relay sharing this catalog honours; nil for a catalog of one relay.
    var keyLocks: (any KeyLocks)? { get }
}

extension ObjectIndex {
    /// One read per key, for catalogs with nothing better.
    public func objects(account: String, keys: [String]) async throws -> [String: StoredObject] {
        var found: [String: StoredObject] = [:]
        for key in keys where found[key] == nil {
            if let object = try await self.object(account: account, key: key) { found[key] = object }
        }
        return found
    }
}

extension SessionCatalog {
    /// One read per key, for catalogs with nothing better.
    public func sessions(account: String, keys: [String]) async throws -> [String: UploadSession] {
        var found: [String: UploadSession] = [:]
        for key in keys where found[key] == nil {
            if let session = try await self.session(account: account, key: key) { found[key] = session }
        }
        return found
    }
}

extension CommitLog {
    /// One transaction per commit, for catalogs with nothing better.
    public func beginCommits(_ commits: [PendingCommit]) async throws -> [CatalogError?] {
        try await Self.reserving(commits) { try await self.beginCommit($0) }
    }

    /// `begin` of each commit in turn: nil where it reserved, its ``CatalogError`` where it was refused; any other error
    /// stops them all.
    package static func reserving(_ commits: [PendingCommit], with begin: (PendingCommit) throws -> Void) rethrows -> [CatalogError?] {
        try commits.map { commit in
            do {
                try begin(commit)
                return nil
            } catch let error as CatalogError where !error.isUnavailable {
                return error
            }
        }
    }

    /// ``reserving(_:with:)`` with an async `begin`.
    package static func reserving(
        _ commits: [PendingCommit], with begin: (PendingCommit) async throws -> Void
    ) async rethrows -> [CatalogError?] {
        var errors: [CatalogError?] = []
        for commit in commits {
            do {
                try await begin(commit)
                errors.append(nil)
            } catch let error as CatalogError where !error.isUnavailable {
                errors.append(error)
            }
        }
        return errors
    }

    public func finishCommits(_ commits: [(PendingCommit, ObjectIdentity)]) async throws {
        for (commit, identity) in commits { try await self.finishCommit(commit, identity: identity) }
    }

    /// A catalog of one relay: the relay's own claims (`active`) hold what its open uploads announced.
    public func admit(account: String, key: String, announced: Int64, growth: Int64, active: [String: Int64]) async throws -> QuotaUse {
        try await self.quotaUse(account: account, excludingKey: key, active: active)
    }

    /// ``quotaUse(account:excludingKey:active:)`` when no other upload of the account is open.
    public func quotaUse(account: String, excludingKey key: String) async throws -> QuotaUse {
        try await self.quotaUse(account: account, excludingKey: key, active: [:])
    }
}

/// The post-commit hooks' queue: its length, the oldest event's last error, and when the oldest event was committed.
public struct CommitEventBacklog: Sendable, Hashable {
    public var count: Int
    public var lastError: String?
    public var oldest: Date?

    public init(count: Int, lastError: String?, oldest: Date?) {
        self.count = count
        self.lastError = lastError
        self.oldest = oldest
    }
}

/// How ``Catalog/removeObject(account:key:removingFile:)`` ended.
public enum ObjectRemoval: Sendable {
    case removed(StoredObject)
    case notStored
    /// An upload or a commit of the key holds it; why, in words.
    case busy(String)

    package static let uploading = ObjectRemoval.busy("an upload of it is under way or resumable; try again once it ends (or expires)")
    package static let committing = ObjectRemoval.busy("a commit of it is being settled; try again in a minute")
}
