import Foundation
import Logging
import NIOConcurrencyHelpers
import PostgresNIO
import Testing
import UploadTestSupport

@testable import UploadRelay
import UploadRelayTesting
@testable import UploadRelayPostgres
@testable import UploadRelaySQLite

/// One suite, every catalog: each test runs against SQLite, PostgreSQL (the throwaway cluster tools/test starts,
/// `UPLOAD_TEST_POSTGRES_URL`; each test gets a database of its own) and the in-memory catalog. What one backend
/// answers, the others must.
@Suite("Catalog contract: SQLite, PostgreSQL and in memory")
struct CatalogContractTests {
    enum Backend: String, CaseIterable, Sendable, CustomStringConvertible {
        case sqlite, postgres, memory
        var description: String { self.rawValue }
    }

    static var logger: Logger {
        var logger = Logger(label: "catalog-test")
        logger.logLevel = .critical
        return logger
    }

    /// A fresh, empty catalog of `backend` (and its place, to open a second one on the same data), removed after `body`.
    static func withCatalog(_ backend: Backend, _ body: (any Catalog, () async throws -> any Catalog) async throws -> Void) async throws {
        switch backend {
        case .sqlite:
            let directory = TemporaryDirectories.make(prefix: "upload-catalog-")
            let path = directory + "/catalog.sqlite"
            try await body(try SQLiteCatalog(path: path), { try SQLiteCatalog(path: path) })
        case .memory:
            // A second opening of the same data is the same catalog, as a second relay in one process would share it.
            let catalog = InMemoryCatalog()
            try await body(catalog, { catalog })
        case .postgres:
            try await PostgresTestDatabase.with { url in
                var opened: [PostgresCatalog] = []
                defer { for catalog in opened { catalog.shutdown() } }
                func open() async throws -> any Catalog {
                    let catalog = try await PostgresCatalog(url: url, logger: PostgresTestDatabase.quietLogger)
                    opened.append(catalog)
                    return catalog
                }
                try await body(try await open(), open)
            }
        }
    }

    static func session(_ id: String, key: String, durable: Int64 = 0, size: Int64? = 100, account: String = "alice") -> UploadSession {
        UploadSession(
            id: id, account: account, key: key, resumeToken: [1, 2, 3], fingerprint: [9, 9], declaredSize: size, durableOffset: durable,
            sha1State: [7, 7, 7], stagingName: "staging-\(id)", declaredSHA1: nil, striped: false, updatedAt: Date(timeIntervalSince1970: 1_000)
        )
    }

    static let identity = ObjectIdentity(device: 1, inode: UInt64.max - 5, size: 10, modified: -3)

    @Test(
        "the multipart ledger: intents recorded before their upload, their upload id after, listed oldest first, forgotten; kept across a reopen",
        arguments: Backend.allCases)
    func multipartLedger(_ backend: Backend) async throws {
        try await Self.withCatalog(backend) { catalog, reopen in
            let ledger = try #require(catalog as? any MultipartLedger)
            let before = Date().addingTimeInterval(-1)
            let first = try await ledger.recordMultipartIntent(account: "alice", key: "v/a.mp4", objectKey: "relay/alice/v/a.mp4")
            let second = try await ledger.recordMultipartIntent(account: "bob", key: "b", objectKey: "relay/bob/b")
            #expect(first != second)
            try await ledger.recordMultipartUpload(intent: first, uploadID: "upload-1")
            let intents = try await ledger.multipartIntents()
            #expect(intents.map(\.id) == [first, second])
            #expect(intents.map(\.uploadID) == ["upload-1", nil])
            #expect(intents.first?.objectKey == "relay/alice/v/a.mp4" && intents.first?.account == "alice" && intents.first?.key == "v/a.mp4")
            #expect(intents.allSatisfy { $0.createdAt >= before && $0.createdAt <= Date().addingTimeInterval(1) })
            try await ledger.forgetMultipartIntent(id: first)
            let again = try await #require(try reopen() as? any MultipartLedger)
            #expect(try await again.multipartIntents().map(\.key) == ["b"])
        }
    }

    @Test("accounts: added once, found by token hash and by name, listed in order, revoked; bad names and twins refused", arguments: Backend.allCases)
    func accounts(_ backend: Backend) async throws {
        try await Self.withCatalog(backend) { catalog, _ in
            try await catalog.addAccount(name: "bob", tokenHash: [2, 2], quota: nil)
            try await catalog.addAccount(name: "alice", tokenHash: [1, 1], quota: 500)
            await #expect(throws: CatalogError.accountExists("alice")) { try await catalog.addAccount(name: "alice", tokenHash: [3], quota: nil) }
            await #expect(throws: CatalogError.invalidAccountName("../x")) { try await catalog.addAccount(name: "../x", tokenHash: [4], quota: nil) }
            #expect(try await catalog.account(tokenHash: [1, 1])?.name == "alice")
            #expect(try await catalog.account(tokenHash: [1, 1])?.quota == 500)
            #expect(try await catalog.account(tokenHash: [9]) == nil)
            #expect(try await catalog.account(named: "bob")?.quota == nil)
            #expect(try await catalog.accounts().map(\.name) == ["alice", "bob"])
            #expect(try await catalog.revokeAccount(named: "bob"))
            #expect(try await catalog.account(named: "bob")?.revoked == true)
            #expect(try await !catalog.revokeAccount(named: "nobody"))
        }
    }

    @Test(
        "accounts changed: quota set and removed, token replaced (the old hash finds nothing), disabled and enabled; an unknown name changes nothing",
        arguments: Backend.allCases)
    func accountsChanged(_ backend: Backend) async throws {
        try await Self.withCatalog(backend) { catalog, _ in
            try await catalog.addAccount(name: "cam", tokenHash: [1, 1], quota: nil)
            #expect(try await catalog.account(named: "cam")?.tokenHash == [1, 1])
            #expect(try await catalog.updateAccount(named: "cam", quota: .some(5_000), tokenHash: nil, revoked: nil))
            #expect(try await catalog.account(named: "cam")?.quota == 5_000)
            #expect(try await catalog.updateAccount(named: "cam", quota: .some(nil), tokenHash: nil, revoked: nil))
            #expect(try await catalog.account(named: "cam")?.quota == nil)
            #expect(try await catalog.updateAccount(named: "cam", quota: nil, tokenHash: [2, 2], revoked: nil))
            #expect(try await catalog.account(tokenHash: [1, 1]) == nil)
            #expect(try await catalog.account(tokenHash: [2, 2])?.name == "cam")
            #expect(try await catalog.updateAccount(named: "cam", quota: nil, tokenHash: nil, revoked: true))
            #expect(try await catalog.account(named: "cam")?.revoked == true)
            #expect(try await catalog.updateAccount(named: "cam", quota: nil, tokenHash: nil, revoked: false))
            #expect(try await catalog.account(named: "cam")?.revoked == false)
            #expect(try await catalog.account(named: "cam")?.tokenHash == [2, 2])
            #expect(try await !catalog.updateAccount(named: "nobody", quota: .some(1), tokenHash: [3], revoked: true))
            #expect(try await catalog.account(tokenHash: [3]) == nil)
        }
    }

    @Test(
        "an account deleted: refused while it has an upload session, then gone and its name free; an unknown name is false",
        arguments: Backend.allCases)
    func accountDeleted(_ backend: Backend) async throws {
        try await Self.withCatalog(backend) { catalog, _ in
            try await catalog.addAccount(name: "alice", tokenHash: [1], quota: nil)
            try await catalog.putSession(Self.session("s1", key: "a/b.jpg", durable: 50))
            await #expect(throws: CatalogError.accountInUse("alice", holds: "uploads under way")) { try await catalog.deleteAccount(named: "alice") }
            #expect(try await catalog.account(named: "alice") != nil)
            try await catalog.deleteSession(id: "s1")
            #expect(try await catalog.deleteAccount(named: "alice"))
            #expect(try await catalog.account(named: "alice") == nil)
            #expect(try await catalog.account(tokenHash: [1]) == nil)
            #expect(try await !catalog.deleteAccount(named: "alice"))
            try await catalog.addAccount(name: "alice", tokenHash: [2], quota: nil)
            #expect(try await catalog.account(named: "alice")?.tokenHash == [2])
        }
    }

    @Test(
        "rm's removal: none while a session or a commit of the key exists; a refusal from the file's removal changes nothing; else the row and the account's bytes go",
        arguments: Backend.allCases)
    func objectRemoved(_ backend: Backend) async throws {
        struct Refused: Error {}
        try await Self.withCatalog(backend) { catalog, _ in
            try await catalog.addAccount(name: "alice", tokenHash: [1], quota: nil)
            let commit = PendingCommit(account: "alice", key: "k1", size: 60, sha1: "aa", sessionID: nil)
            try await catalog.beginCommit(commit)
            try await catalog.finishCommit(commit, identity: Self.identity)
            // A second commit of the key under way: the object is not removed meanwhile.
            try await catalog.beginCommit(PendingCommit(account: "alice", key: "k1", size: 70, sha1: "bb", sessionID: nil))
            guard
                case .busy = try await catalog.removeObject(
                    account: "alice", key: "k1", removingFile: { _ in Issue.record("removed under a commit") })
            else {
                Issue.record("a commit of the key pending: expected busy")
                return
            }
            try await catalog.abandonCommit(account: "alice", key: "k1")
            try await catalog.putSession(Self.session("s2", key: "k1", durable: 5))
            guard
                case .busy = try await catalog.removeObject(
                    account: "alice", key: "k1", removingFile: { _ in Issue.record("removed under a session") })
            else {
                Issue.record("a session of the key: expected busy")
                return
            }
            try await catalog.deleteSession(id: "s2")
            await #expect(throws: Refused.self) {
                try await catalog.removeObject(account: "alice", key: "k1", removingFile: { _ in throw Refused() })
            }
            #expect(try await catalog.object(account: "alice", key: "k1") != nil)
            #expect(try await catalog.account(named: "alice")?.usedBytes == 60)
            let seen = NIOLockedValueBox<String?>(nil)
            guard
                case .removed(let object) = try await catalog.removeObject(
                    account: "alice", key: "k1", removingFile: { object in seen.withLockedValue { $0 = object.key } })
            else {
                Issue.record("expected removed")
                return
            }
            #expect(object.size == 60 && seen.withLockedValue { $0 } == "k1")
            #expect(try await catalog.object(account: "alice", key: "k1") == nil)
            #expect(try await catalog.account(named: "alice")?.usedBytes == 0)
            guard case .notStored = try await catalog.removeObject(account: "alice", key: "k1", removingFile: { _ in }) else {
                Issue.record("expected not stored")
                return
            }
        }
    }

    @Test("objects and sessions of many keys in one read: only the account's, only keys that have one, each once", arguments: Backend.allCases)
    func manyKeys(_ backend: Backend) async throws {
        try await Self.withCatalog(backend) { catalog, _ in
            for name in ["alice", "bob"] { try await catalog.addAccount(name: name, tokenHash: [name == "alice" ? 1 : 2], quota: nil) }
            for (account, key, size) in [("alice", "a.jpg", Int64(10)), ("alice", "b.jpg", 20), ("bob", "c.jpg", 30)] {
                let commit = PendingCommit(account: account, key: key, size: size, sha1: "aa", sessionID: nil)
                try await catalog.beginCommit(commit)
                try await catalog.finishCommit(commit, identity: Self.identity)
            }
            try await catalog.putSession(Self.session("s1", key: "v.mp4", durable: 5))
            try await catalog.putSession(Self.session("s2", key: "v.mp4", durable: 6, account: "bob"))
            let objects = try await catalog.objects(account: "alice", keys: ["a.jpg", "c.jpg", "nope", "a.jpg", "v.mp4"])
            #expect(objects.mapValues(\.size) == ["a.jpg": 10], "\(objects)")
            let sessions = try await catalog.sessions(account: "alice", keys: ["v.mp4", "a.jpg", "v.mp4"])
            #expect(sessions.mapValues(\.id) == ["v.mp4": "s1"], "\(sessions)")
            #expect(try await catalog.objects(account: "alice", keys: []).isEmpty)
            #expect(try await catalog.sessions(account: "bob", keys: []).isEmpty)
        }
    }

    @Test("relays' looks: recorded per relay, the latest kept, forgotten when the relay stops", arguments: Backend.allCases)
    func relayLooks(_ backend: Backend) async throws {
        try await Self.withCatalog(backend) { catalog, _ in
            let now = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded())
            try await catalog.recordLook(relay: "a", readAt: now.addingTimeInterval(-5))
            try await catalog.recordLook(relay: "a", readAt: now)
            try await catalog.recordLook(relay: "b", readAt: now.addingTimeInterval(-1))
            #expect(try await catalog.relayLooks() == ["a": now, "b": now.addingTimeInterval(-1)])
            // A look that arrives late never replaces a later one.
            try await catalog.recordLook(relay: "a", readAt: now.addingTimeInterval(-3))
            #expect(try await catalog.relayLooks()["a"] == now)
            #expect(abs(try await catalog.clock().timeIntervalSinceNow) < 60, "the catalog's clock")
            try await catalog.forgetLook(relay: "b")
            #expect(try await catalog.relayLooks() == ["a": now])
            // A look of a relay gone for more than a day is forgotten by the next look of any.
            try await catalog.recordLook(relay: "old", readAt: now.addingTimeInterval(-90_000))
            try await catalog.recordLook(relay: "a", readAt: now.addingTimeInterval(1))
            #expect(try await catalog.relayLooks().keys.sorted() == ["a"])
        }
    }

    @Test("unfinished uploads are counted per account, up to the limit asked, and summed over all accounts", arguments: Backend.allCases)
    func unfinishedUploads(_ backend: Backend) async throws {
        try await Self.withCatalog(backend) { catalog, _ in
            for name in ["alice", "bob"] { try await catalog.addAccount(name: name, tokenHash: [name == "alice" ? 1 : 2], quota: nil) }
            for index in 0..<5 { try await catalog.putSession(Self.session("a\(index)", key: "k\(index)")) }
            try await catalog.putSession(Self.session("b0", key: "k0", account: "bob"))
            #expect(try await catalog.unfinishedUploads(account: "alice", limit: 100) == 5)
            #expect(try await catalog.unfinishedUploads(account: "alice", limit: 3) == 3)
            #expect(try await catalog.unfinishedUploads(account: "bob", limit: 100) == 1)
            try await catalog.deleteSession(id: "a0")
            #expect(try await catalog.unfinishedUploads(account: "alice", limit: 100) == 4)
            #expect(try await catalog.unfinishedUploads(account: "carol", limit: 100) == 0)
            try await catalog.updateDurable(sessionID: "a1", offset: 40, sha1State: [])
            try await catalog.updateDurable(sessionID: "b0", offset: 2, sha1State: [])
            let totals = try await catalog.unfinishedTotals()
            #expect(totals.uploads == 5 && totals.bytes == 42, "\(totals)")
        }
    }

    @Test(
        "sessions: recorded, replaced by key, updated with their parts, gone with them; an update of a gone one refused", arguments: Backend.allCases)
    func sessions(_ backend: Backend) async throws {
        try await Self.withCatalog(backend) { catalog, _ in
            try await catalog.addAccount(name: "alice", tokenHash: [1], quota: nil)
            let parts = [StagedPart(number: 1, end: 50, etag: "\"e1\"", sha1: "s1")]
            try await catalog.putSession(Self.session("s1", key: "a/b.jpg", durable: 50), parts: parts)
            let read = try await #require(try catalog.session(account: "alice", key: "a/b.jpg"))
            #expect(read == Self.session("s1", key: "a/b.jpg", durable: 50))
            #expect(try await catalog.stagedParts(sessionID: "s1") == parts)
            try await catalog.updateDurable(
                sessionID: "s1", offset: 90, sha1State: [8], parts: [StagedPart(number: 2, end: 90, etag: "e2", sha1: "s2")]
            )
            #expect(try await catalog.session(account: "alice", key: "a/b.jpg")?.durableOffset == 90)
            #expect(try await catalog.session(account: "alice", key: "a/b.jpg")?.sha1State == [8])
            #expect(try await catalog.stagedParts(sessionID: "s1").map(\.number) == [1, 2])
            // A part recorded again replaces the old.
            try await catalog.updateDurable(
                sessionID: "s1", offset: 95, sha1State: [9], parts: [StagedPart(number: 2, end: 95, etag: "e2b", sha1: "s2b")])
            #expect(try await catalog.stagedParts(sessionID: "s1").last == StagedPart(number: 2, end: 95, etag: "e2b", sha1: "s2b"))
            #expect(try await catalog.sessions(updatedBefore: .distantFuture).map(\.id) == ["s1"])
            #expect(try await catalog.sessions(updatedBefore: Date(timeIntervalSince1970: 10)).isEmpty)
            // A new session of the same key replaces the old, and its parts.
            try await catalog.putSession(Self.session("s2", key: "a/b.jpg"))
            #expect(try await catalog.session(account: "alice", key: "a/b.jpg")?.id == "s2")
            #expect(try await catalog.stagedParts(sessionID: "s1").isEmpty)
            await #expect(throws: CatalogError.unknownSession("s1")) { try await catalog.updateDurable(sessionID: "s1", offset: 1, sha1State: []) }
            try await catalog.completeStripe(sessionID: "s2", index: 3, bytes: 40)
            try await catalog.completeStripe(sessionID: "s2", index: 3, bytes: 40)
            try await catalog.completeStripe(sessionID: "s2", index: 1, bytes: 40)
            #expect(try await catalog.completeStripes(sessionID: "s2") == [1, 3])
            await #expect(throws: CatalogError.unknownSession("s9")) { try await catalog.completeStripe(sessionID: "s9", index: 1, bytes: 1) }
            try await catalog.deleteSession(id: "s2")
            #expect(try await catalog.session(account: "alice", key: "a/b.jpg") == nil)
            #expect(try await catalog.completeStripes(sessionID: "s2").isEmpty)
        }
    }

    @Test(
        "commits: reserved, then recorded with the object's identity and the account's bytes; refused over quota; abandoned; forgotten",
        arguments: Backend.allCases)
    func commits(_ backend: Backend) async throws {
        try await Self.withCatalog(backend) { catalog, _ in
            try await catalog.addAccount(name: "alice", tokenHash: [1], quota: 100)
            try await catalog.putSession(Self.session("s1", key: "k1", durable: 10))
            let first = PendingCommit(account: "alice", key: "k1", size: 60, sha1: "aa", sessionID: "s1", probeSHA1: "pp")
            try await catalog.beginCommit(first)
            #expect(try await catalog.pendingCommits() == [PendingCommit(account: "alice", key: "k1", size: 60, sha1: "aa", sessionID: "s1")])
            #expect(
                try await catalog.pendingCommit(account: "alice", key: "k1")
                    == PendingCommit(account: "alice", key: "k1", size: 60, sha1: "aa", sessionID: "s1"))
            #expect(try await catalog.pendingCommit(account: "alice", key: "k2") == nil)
            #expect(try await catalog.pendingCommit(account: "bob", key: "k1") == nil)
            #expect(try await catalog.quotaUse(account: "alice", excludingKey: "other").committing == 60)
            // A group: one too large for what is left, one that fits, one of an unknown account.
            let results = try await catalog.beginCommits([
                PendingCommit(account: "alice", key: "k2", size: 50, sha1: "bb", sessionID: nil),
                PendingCommit(account: "alice", key: "k3", size: 30, sha1: "cc", sessionID: nil),
                PendingCommit(account: "nobody", key: "k4", size: 1, sha1: "dd", sessionID: nil),
            ])
            #expect(results.count == 3)
            #expect(results[0] == .quotaExceeded(account: "alice", needed: 50, quota: 100, used: 60))
            #expect(results[1] == nil)
            #expect(results[2] == .unknownAccount("nobody"))
            try await catalog.finishCommits([(first, Self.identity)])
            let object = try await #require(try catalog.object(account: "alice", key: "k1"))
            #expect(
                object.size == 60 && object.sha1 == "aa"
                    && object.identity == ObjectIdentity(device: 1, inode: UInt64.max - 5, size: 60, modified: -3))
            #expect(object.probeSHA1 == "pp")
            #expect(try await catalog.session(account: "alice", key: "k1") == nil, "the commit's session goes with it")
            #expect(try await catalog.account(named: "alice")?.usedBytes == 60)
            #expect(try await catalog.object(account: "alice", size: 60, sha1: "aa").map(\.key) == ["k1"])
            #expect(try await catalog.probeCandidates(account: "alice", size: 60, probe: "pp").map(\.key) == ["k1"])
            #expect(try await catalog.probeCandidates(account: "alice", size: 60, probe: "other").isEmpty)
            try await catalog.abandonCommit(account: "alice", key: "k3")
            #expect(try await catalog.pendingCommits().isEmpty)
            // Replacing an object counts what it adds.
            let replace = PendingCommit(account: "alice", key: "k1", size: 90, sha1: "ee", sessionID: nil)
            #expect(try await catalog.beginCommits([replace]) == [nil])
            try await catalog.finishCommit(replace, identity: Self.identity)
            #expect(try await catalog.account(named: "alice")?.usedBytes == 90)
            try await catalog.deleteObject(account: "alice", key: "k1")
            try await catalog.deleteObject(account: "alice", key: "k1")
            #expect(try await catalog.account(named: "alice")?.usedBytes == 0)
            #expect(try await catalog.objects().isEmpty)
        }
    }

    @Test(
        "key pages: an account's objects and sessions by prefix, after a key, in UTF-8 byte order whatever the database's collation; % and _ are plain characters",
        arguments: Backend.allCases)
    func keyPages(_ backend: Backend) async throws {
        try await Self.withCatalog(backend) { catalog, _ in
            try await catalog.addAccount(name: "alice", tokenHash: [1], quota: nil)
            try await catalog.addAccount(name: "bob", tokenHash: [2], quota: nil)
            let keys = ["b/1", "a/é", "ab", "a/2", "B/1", "a%/x", "a_/y", "a/1", "a/1/z"]
            for key in keys {
                let commit = PendingCommit(account: "alice", key: key, size: 5, sha1: "aa", sessionID: nil)
                try await catalog.beginCommit(commit)
                try await catalog.finishCommit(commit, identity: Self.identity)
            }
            let bobs = PendingCommit(account: "bob", key: "a/0", size: 5, sha1: "aa", sessionID: nil)
            try await catalog.beginCommit(bobs)
            try await catalog.finishCommit(bobs, identity: Self.identity)
            try await catalog.putSession(Self.session("s1", key: "a/3", durable: 7))
            try await catalog.putSession(Self.session("s2", key: "a/2", durable: 9))
            try await catalog.putSession(Self.session("s3", key: "a/2", durable: 1, account: "bob"))

            func objects(_ prefix: String, after: String? = nil, limit: Int = 100) async throws -> [String] {
                try await catalog.objects(account: "alice", prefix: prefix, after: after, limit: limit).map(\.key)
            }
            await #expect(try objects("") == keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) })
            await #expect(try objects("") == ["B/1", "a%/x", "a/1", "a/1/z", "a/2", "a/é", "a_/y", "ab", "b/1"])
            await #expect(try objects("a/") == ["a/1", "a/1/z", "a/2", "a/é"])
            await #expect(try objects("a%") == ["a%/x"])
            await #expect(try objects("a_") == ["a_/y"])
            await #expect(try objects("a/", after: "a/1", limit: 2) == ["a/1/z", "a/2"])
            await #expect(try objects("a/", after: "a/é").isEmpty)
            await #expect(try objects("c").isEmpty)
            #expect(try await catalog.objects(account: "bob", prefix: "", after: nil, limit: 10).map(\.key) == ["a/0"])
            let sessions = try await catalog.sessions(account: "alice", prefix: "a/", after: nil, limit: 10)
            #expect(sessions.map(\.key) == ["a/2", "a/3"])
            #expect(try await catalog.sessions(account: "alice", prefix: "", after: "a/2", limit: 10).map(\.key) == ["a/3"])
            #expect(try await catalog.sessions(account: "bob", prefix: "", after: nil, limit: 10).map(\.durableOffset) == [1])

            let page = KeyStatusPage.merge(
                objects: try await catalog.objects(account: "alice", prefix: "a/", after: nil, limit: 4), sessions: sessions, limit: 3)
            #expect(page.entries.map(\.key) == ["a/1", "a/1/z", "a/2"])
            #expect(page.entries.map(\.status) == [.stored, .stored, .uploading])
            #expect(page.entries[2].bytes == 9 && page.entries[2].size == 100 && page.entries[2].sha1 == nil)
            #expect(page.next == "a/2")
        }
    }

    @Test(
        "quota use: other keys' sessions hold their durable bytes, open uploads what they announced, a replaced object only the growth",
        arguments: Backend.allCases)
    func quotaUse(_ backend: Backend) async throws {
        try await Self.withCatalog(backend) { catalog, _ in
            try await catalog.addAccount(name: "alice", tokenHash: [1], quota: 1000)
            try await catalog.putSession(Self.session("s1", key: "left", durable: 40, size: 300))
            try await catalog.putSession(Self.session("s2", key: "open", durable: 10, size: 200))
            try await catalog.completeStripe(sessionID: "s1", index: 1, bytes: 5)
            let old = PendingCommit(account: "alice", key: "open", size: 50, sha1: "x", sessionID: nil)
            try await catalog.beginCommit(old)
            try await catalog.finishCommit(old, identity: Self.identity)
            let use = try await catalog.quotaUse(account: "alice", excludingKey: "mine", active: ["open": 200, "new": 70])
            // left: 40 + 5 durable; open: announced 200 less the 50 it replaces; new: announced 70.
            #expect(use == QuotaUse(quota: 1000, stored: 50, committing: 0, staged: 45 + 150 + 70))
            #expect(try await catalog.quotaUse(account: "alice", excludingKey: "left").staged == 0)
            await #expect(throws: CatalogError.unknownAccount("bob")) { try await catalog.quotaUse(account: "bob", excludingKey: "k") }
        }
    }

    @Test(
        "admission: a quota counts what the account holds; an account without one is admitted whatever it holds; an unknown one is refused",
        arguments: Backend.allCases)
    func admission(_ backend: Backend) async throws {
        try await Self.withCatalog(backend) { catalog, _ in
            try await catalog.addAccount(name: "alice", tokenHash: [1], quota: 1000)
            try await catalog.addAccount(name: "cam", tokenHash: [2], quota: nil)
            try await catalog.putSession(Self.session("s1", key: "left", durable: 400, size: 900))
            let limited = try await catalog.admit(account: "alice", key: "new", announced: 700, growth: 700, active: ["open": 300])
            #expect(limited.left == 1000 - 400 - 300, "\(limited)")
            var held = Self.session("s2", key: "big", durable: 5_000_000, size: 9_000_000)
            held.account = "cam"
            try await catalog.putSession(held)
            let unlimited = try await catalog.admit(account: "cam", key: "new", announced: 1 << 40, growth: 1 << 40, active: ["open": 1 << 40])
            #expect(unlimited.quota == nil && unlimited.left == .max)
            await #expect(throws: CatalogError.unknownAccount("bob")) {
                try await catalog.admit(account: "bob", key: "k", announced: 1, growth: 1, active: [:])
            }
        }
    }

    @Test(
        "two catalogs on the same data (two relays): both see each other's records, a second opening migrates nothing, and racing commits never pass the quota",
        arguments: Backend.allCases)
    func twoRelays(_ backend: Backend) async throws {
        try await Self.withCatalog(backend) { first, openAnother in
            try await first.addAccount(name: "alice", tokenHash: [1], quota: 100)
            let second = try await openAnother()
            await #expect(try second.account(named: "alice")?.quota == 100)
            try await second.putSession(Self.session("s1", key: "k", durable: 5))
            await #expect(try first.session(account: "alice", key: "k")?.id == "s1")
            // 8 commits of 30 bytes, from both catalogs at once: at most 3 fit.
            let reserved = await withTaskGroup(of: Bool.self) { group in
                for index in 0..<8 {
                    let catalog = index % 2 == 0 ? first : second
                    group.addTask {
                        let commit = PendingCommit(account: "alice", key: "race-\(index)", size: 30, sha1: "s", sessionID: nil)
                        let result = try? await catalog.beginCommits([commit])
                        return result?.count == 1 && result?[0] == nil
                    }
                }
                var reserved = 0
                for await took in group where took { reserved += 1 }
                return reserved
            }
            #expect(reserved == 3, "\(reserved) commits of 30 reserved against a quota of 100")
            #expect(try await first.pendingCommits().count == 3)
        }
    }

    @Test(
        "commit events: queued by a commit that names a location (a recovered one too), claimed with a lease, retried, finished",
        arguments: Backend.allCases)
    func commitEvents(_ backend: Backend) async throws {
        try await Self.withCatalog(backend) { catalog, _ in
            try await catalog.addAccount(name: "alice", tokenHash: [1], quota: nil)
            let quiet = PendingCommit(account: "alice", key: "no-hooks", size: 5, sha1: "aa", sessionID: nil)
            let noted = PendingCommit(account: "alice", key: "a.jpg", size: 7, sha1: "bb", sessionID: nil, location: "/store/alice/a.jpg")
            #expect(try await catalog.beginCommits([quiet, noted]) == [nil, nil])
            // A crash before the record: the pending commit keeps the location for recovery to queue the event.
            #expect(try await catalog.pendingCommits().first { $0.key == "a.jpg" }?.location == "/store/alice/a.jpg")
            try await catalog.finishCommits([(quiet, Self.identity), (noted, Self.identity)])
            #expect(try await catalog.commitEventBacklog().count == 1)
            let claimed = try await catalog.claimCommitEvents(limit: 10, lease: .seconds(60))
            #expect(claimed.map(\.key) == ["a.jpg"])
            #expect(claimed.first?.location == "/store/alice/a.jpg" && claimed.first?.size == 7 && claimed.first?.sha1 == "bb")
            #expect(claimed.first?.attempts == 1)
            // Leased: not taken again meanwhile.
            #expect(try await catalog.claimCommitEvents(limit: 10, lease: .seconds(60)).isEmpty)
            let id = try #require(claimed.first?.id)
            try await catalog.retryCommitEvent(id: id, at: Date(timeIntervalSinceNow: -1), error: "hook exited 3")
            #expect(try await catalog.commitEventBacklog().lastError == "hook exited 3")
            let again = try await catalog.claimCommitEvents(limit: 10, lease: .seconds(60))
            #expect(again.map(\.id) == [id] && again.first?.attempts == 2)
            try await catalog.finishCommitEvent(id: id)
            #expect(try await catalog.commitEventBacklog().count == 0)
        }
    }
}
