import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOPosix
import Testing
import UploadProtocol
import UploadTestSupport

@testable import UploadRelay
import UploadRelayTesting
@testable import UploadRelayLocalStore
@testable import UploadRelayPostgres
@testable import UploadRelaySQLite
import PostgresNIO

/// Keys locked across relays: with one PostgreSQL catalog behind several relays, an upload of a key runs on one relay
/// at a time, and no relay's housekeeping touches what another relay's upload holds. The lock contract runs on the
/// run's real PostgreSQL and on ``InMemoryKeyLocks``.
@Suite("Key locks across relays")
struct KeyLockTests {
    /// Two catalogs on one new database (two relays' views), shut down after `body`.
    static func withTwoCatalogs(_ body: (PostgresCatalog, PostgresCatalog) async throws -> Void) async throws {
        try await PostgresTestDatabase.with { url in
            let first = try await PostgresCatalog(url: url, logger: PostgresTestDatabase.quietLogger)
            defer { first.shutdown() }
            let second = try await PostgresCatalog(url: url, logger: PostgresTestDatabase.quietLogger)
            defer { second.shutdown() }
            try await body(first, second)
        }
    }

    enum Backend: String, CaseIterable, CustomStringConvertible {
        case memory, postgres
        var description: String { self.rawValue }
    }

    /// Two relays' key locks of `backend` on one place (a new database, or one table), and what cuts relay B's lock
    /// connection (as when its process is killed), closed after `body`.
    static func withTwoRelaysLocks(
        _ backend: Backend, _ body: (any KeyLocks, any KeyLocks, _ cutB: () async throws -> Void) async throws -> Void
    ) async throws {
        switch backend {
        case .memory:
            let table = InMemoryKeyLocks.Table()
            let (a, b) = (InMemoryKeyLocks(table: table), InMemoryKeyLocks(table: table))
            try await body(a, b) { b.loseConnection() }
        case .postgres:
            try await Self.withTwoCatalogs { first, second in
                let a = try #require(first.keyLocks)
                let b = try #require(second.keyLocks)
                try await body(a, b) {
                    // Relay B's lock connection, as when its process is killed.
                    let pid = try #require((b as? PostgresKeyLocks)?.backendPID, "relay B has no lock connection")
                    try await first.execute("SELECT pg_terminate_backend(\(pid))")
                }
            }
        }
    }

    @Test(
        "a key locked by one relay is refused to another, per account; let go, or its connection cut, the other takes it",
        arguments: Backend.allCases)
    func locks(_ backend: Backend) async throws {
        try await Self.withTwoRelaysLocks(backend) { a, b, cutB in
            let held = try await #require(try a.tryLock(account: "alice", key: "clips/1.mov"))
            #expect(try await b.tryLock(account: "alice", key: "clips/1.mov") == nil)
            // Another key, or the same key of another account, is another lock.
            let other = try await #require(try b.tryLock(account: "alice", key: "clips/2.mov"))
            let bobs = try await #require(try b.tryLock(account: "bob", key: "clips/1.mov"))
            a.unlock(held)
            #expect(await Polling.waitUntil(timeout: 10) { (try? await b.tryLock(account: "alice", key: "clips/1.mov")) != nil })
            #expect(try await a.tryLock(account: "alice", key: "clips/1.mov") == nil)

            // Relay B's connection dies: its locks go, and B is told.
            let lost = NIOLockedValueBox(false)
            b.whenLost { _ in lost.withLockedValue { $0 = true } }
            try await cutB()
            #expect(await Polling.waitUntil(timeout: 10) { lost.withLockedValue { $0 } }, "relay B was not told its locks were lost")
            #expect(await Polling.waitUntil(timeout: 10) { (try? await a.tryLock(account: "alice", key: "clips/1.mov")) != nil })
            #expect(try await a.tryLock(account: "alice", key: "clips/2.mov") != nil)
            // B takes new locks on a new connection; letting go of the old ones touches nothing of A's.
            b.unlock(other)
            b.unlock(bobs)
            #expect(try await b.tryLock(account: "alice", key: "clips/2.mov") == nil)
            #expect(try await b.tryLock(account: "alice", key: "clips/3.mov") != nil)
        }
    }

    @Test(
        "15,000 keys held open at once on one relay (a fleet's thumbnails in flight) take no lock-table entry each: all held, none to another relay, all free once the holder's connection is cut"
    )
    func fleetScale() async throws {
        try await Self.withTwoRelaysLocks(.postgres) { a, b, cutB in
            // More than the test cluster's lock table holds (64 x 200 connections = 12,800 entries): session advisory
            // locks, one per key, failed here with "out of shared memory".
            let count = 15_000
            let held = try await withThrowingTaskGroup(of: Bool.self) { group in
                var taken = 0
                for index in 0..<count {
                    if index >= 64, try await group.next() == true { taken += 1 }
                    group.addTask { try await b.tryLock(account: "fleet", key: "thumbs/\(index).jpg") != nil }
                }
                for try await ok in group where ok { taken += 1 }
                return taken
            }
            #expect(held == count)
            let locks = try #require(a as? PostgresKeyLocks)
            _ = try await a.tryLock(account: "fleet", key: "other")  // A's own connection, which the count below sees
            let entries = try await locks.advisoryLocksInDatabase()
            #expect(entries <= 2, "\(entries) advisory locks for \(count) keys held: one per relay connection expected")
            for index in [0, 12_345, count - 1] {
                #expect(try await a.tryLock(account: "fleet", key: "thumbs/\(index).jpg") == nil, "relay A took a key B holds")
            }
            try await cutB()
            #expect(await Polling.waitUntil(timeout: 10) { (try? await a.tryLock(account: "fleet", key: "thumbs/0.jpg")) != nil })
            #expect(try await a.tryLock(account: "fleet", key: "thumbs/\(count - 1).jpg") != nil)
        }
    }

    @Test("a key claimed twice by one relay (a new upload of it before the old one's release arrived) is held until let go twice")
    func reentrant() async throws {
        try await Self.withTwoRelaysLocks(.postgres) { a, b, _ in
            let first = try await #require(try a.tryLock(account: "alice", key: "k"))
            let second = try await #require(try a.tryLock(account: "alice", key: "k"))
            let locks = try #require(a as? PostgresKeyLocks)
            #expect(try await locks.holds(account: "alice", key: "k") == 2)
            a.unlock(first)
            #expect(await Polling.waitUntil(timeout: 10) { (try? await locks.holds(account: "alice", key: "k")) == 1 })
            #expect(try await b.tryLock(account: "alice", key: "k") == nil, "let go once of two claims, the key was free")
            a.unlock(second)
            #expect(await Polling.waitUntil(timeout: 10) { (try? await b.tryLock(account: "alice", key: "k")) != nil })
        }
    }

    @Test(
        "a claim whose query is given up on (blocked past the timeout) and then goes through is given back: the key is free for another relay once let go"
    )
    func claimAfterTimeout() async throws {
        try await PostgresTestDatabase.with { url in
            // The set-up is not what is tested: on a loaded machine (the whole suite at once) a first query may take
            // longer than relay A's 2 s, so each step of it is given three tries.
            func settingUp<T>(_ step: () async throws -> T) async throws -> T {
                for _ in 0..<2 {
                    if let done = try? await step() { return done }
                }
                return try await step()
            }
            let a = try await settingUp { try await PostgresCatalog(url: url, logger: PostgresTestDatabase.quietLogger, timeout: .seconds(2)) }
            defer { a.shutdown() }
            let b = try await PostgresCatalog(url: url, logger: PostgresTestDatabase.quietLogger)
            defer { b.shutdown() }
            let (locksA, locksB) = (try #require(a.keyLocks), try #require(b.keyLocks))
            let first = try await #require(try await settingUp { try await locksA.tryLock(account: "alice", key: "k") })
            // Another session holds the claim's row: relay A's second claim of the key (reentrant) waits on it.
            let (locked, lockedWaiter) = AsyncStream<Void>.makeStream()
            let (release, releaser) = AsyncStream<Void>.makeStream()
            let blocker = Task {
                try await b.transaction { connection in
                    _ = try await connection.query(
                        "SELECT holds FROM key_claim WHERE lock_id = \(PostgresKeyLocks.lockID(account: "alice", key: "k")) FOR UPDATE",
                        logger: PostgresTestDatabase.quietLogger
                    ).collect()
                    lockedWaiter.yield()
                    for await _ in release { break }
                }
            }
            for await _ in locked { break }
            let started = ContinuousClock.now
            await #expect(throws: CatalogError.self) { try await locksA.tryLock(account: "alice", key: "k") }
            #expect(ContinuousClock.now - started < .seconds(10), "the timeout did not bound the wait")
            // The row is let go: the claim given up on goes through now, and is given back.
            releaser.yield()
            try await blocker.value
            locksA.unlock(first)
            #expect(await Polling.waitUntil(timeout: 10) { (try? await locksB.tryLock(account: "alice", key: "k")) != nil })
        }
    }

    @Test("a catalog of one relay has no key locks")
    func oneRelay() async throws {
        let directory = TemporaryDirectories.make(prefix: "upload-keylock-")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let sqlite = try SQLiteCatalog(path: directory + "/catalog.sqlite")
        #expect(sqlite.keyLocks == nil)
        #expect(InMemoryCatalog().keyLocks == nil)
    }

    /// A relay wired on `catalog`, with a store of its own in a temporary directory.
    static func relay(_ catalog: any Catalog) throws -> Relay {
        let root = TemporaryDirectories.make(prefix: "upload-keylock-")
        let configuration = RelayConfiguration(certificatePath: "-", privateKeyPath: "-", dataDirectory: root)
        let store = try LocalDirectoryStore(root: configuration.storePath, stagingDirectory: configuration.stagingDirectory)
        return Relay(configuration: configuration, catalog: catalog, store: store, threadPool: .singleton, logger: Logger(label: "test"))
    }

    @Test("relay B answers KEY_BUSY to an OPEN of a key relay A uploads, and its recovery leaves A's commit alone until A lets the key go")
    func relays() async throws {
        try await Self.withTwoCatalogs { first, second in
            try await first.addAccount(name: "cam-7", tokenHash: Tokens.hash(Array("t".utf8)), quota: nil)
            let (relayA, relayB) = (try Self.relay(first), try Self.relay(second))
            let account = try await #require(try first.account(named: "cam-7"))
            let key = try ObjectKey(validating: "DCIM/0001.mov")
            let name = KeyClaims.name(account: "cam-7", key: key.value)
            let open = Frame.Open(streamID: 1, key: key.value, size: 100)

            #expect(relayA.claims.claim(name, whenFree: {}) == .claimed)
            guard case .upload(_, let staging, _, _, _, _) = await relayA.policy.open(account: account, open: open, key: key) else {
                Issue.record("relay A did not take the upload")
                return
            }
            staging.close()
            #expect(relayB.claims.claim(name, whenFree: {}) == .claimed, "relay B's own claims know nothing of A's")
            let answer = await relayB.policy.open(account: account, open: open, key: key)
            guard case .refuse(.keyBusy, let message) = answer else {
                Issue.record("relay B answered \(answer), not KEY_BUSY")
                return
            }
            #expect(message.contains("another relay"), "\(message)")
            relayB.claims.release(name)

            // A commit relay A has under way: relay B's recovery, as at its start or in its maintenance, leaves it.
            try await first.beginCommit(
                PendingCommit(account: "cam-7", key: key.value, size: 100, sha1: String(repeating: "a", count: 40), sessionID: nil))
            try await RelayRuntime.recover(
                catalog: second, store: relayB.store, logger: relayB.logger, keys: .claiming(relayB.claims), objects: false
            )
            #expect(try await second.pendingCommits().count == 1, "relay B settled a commit relay A was making")
            // Relay A lets the key go (or dies): B settles the commit A left (its object is not in the store: given up).
            relayA.claims.release(name)
            #expect(
                try await Polling.waitUntil(timeout: 10) {
                    try await RelayRuntime.recover(
                        catalog: second, store: relayB.store, logger: relayB.logger, keys: .claiming(relayB.claims), objects: false
                    )
                    return try await second.pendingCommits().isEmpty
                }
            )
            #expect(relayB.claims.count == 0 && relayA.claims.count == 0)
        }
    }
}
