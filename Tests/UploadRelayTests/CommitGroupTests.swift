import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
import UploadChecksums
import UploadProtocol
@testable import UploadRelay
@testable import UploadRelayLocalStore
@testable import UploadRelaySQLite
import UploadTestSupport

/// Group commit (issue 9): many uploads' commits made durable together, each with its own outcome.
@Suite("Group commit")
struct CommitGroupTests {
    /// A relay wired on a real catalog and store in a temporary directory, the store's system calls on `pool`.
    static func relay(pool: NIOThreadPool, quota: Int64? = nil) async throws -> Relay {
        let root = TemporaryDirectories.make(prefix: "upload-commit-group-")
        let configuration = RelayConfiguration(certificatePath: "-", privateKeyPath: "-", dataDirectory: root)
        let catalog = try SQLiteCatalog(path: configuration.catalogPath)
        try await catalog.addAccount(name: "cam-7", tokenHash: Tokens.hash(Array("t".utf8)), quota: quota)
        let store = try LocalDirectoryStore(root: configuration.storePath, stagingDirectory: configuration.stagingDirectory, threadPool: pool)
        return Relay(configuration: configuration, catalog: catalog, store: store, threadPool: pool, logger: Logger(label: "test"))
    }

    /// The account the tests' uploads authenticated as.
    static let principal = Account(name: "cam-7", quota: nil, tokenHash: Tokens.hash(Array("t".utf8)))

    /// Stages `bytes` as a new upload of `key` and returns its commit request.
    static func staged(_ key: String, _ bytes: [UInt8], relay: Relay, overwrite: Bool = false) async throws -> UploadPolicy.CommitRequest {
        let name = UploadPolicy.randomID()
        let staging = try await relay.store.openStaging(.named(name))
        try await staging.write(ByteBuffer(bytes: bytes), at: 0)
        let sha1 = try #require(SHA1Digest(bytes: SHA1.hash(bytes)))
        return UploadPolicy.CommitRequest(
            staging: staging, key: try ObjectKey(validating: key), account: Self.principal, sessionID: name, sessionRecorded: false,
            size: Int64(bytes.count), sha1: sha1, overwrite: overwrite
        )
    }

    /// The quota as an OPEN of `key` sees it now, with the uploads open beside it.
    static func quotaUse(_ relay: Relay, openingAnother key: String) async throws -> QuotaUse {
        try await relay.catalog.quotaUse(account: "cam-7", excludingKey: key, active: relay.claims.activeUploads(of: "cam-7"))
    }

    static func stored(_ key: String, relay: Relay) -> [UInt8]? {
        FileManager.default.contents(atPath: "\(relay.configuration.storePath)/cam-7/\(key)").map { Array($0) }
    }

    @Test("one group of many: each upload gets its own outcome, refusals harm none of the others, nothing is left pending")
    func mixedGroup() async throws {
        let relay = try await Self.relay(pool: .singleton, quota: 10_000)
        let policy = relay.policy
        // Already there: "taken" (other bytes) and "folder" (an object, so "folder/x" cannot be stored).
        let before = await [
            try Self.staged("taken", Array(repeating: 1, count: 10), relay: relay),
            try Self.staged("folder", Array(repeating: 2, count: 10), relay: relay),
        ]
        await #expect(policy.commit(before).allSatisfy { (try? $0.get()) == .stored })

        var requests: [UploadPolicy.CommitRequest] = []
        var expected: [String: [UInt8]] = [:]
        for i in 0..<20 {
            let bytes = (0..<(100 + i)).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ i) }
            expected["photos/\(i).jpg"] = bytes
            await requests.append(try Self.staged("photos/\(i).jpg", bytes, relay: relay))
        }
        await requests.insert(try Self.staged("taken", Array(repeating: 3, count: 10), relay: relay), at: 5)
        await requests.insert(try Self.staged("folder/x", Array(repeating: 4, count: 10), relay: relay), at: 9)
        // Past the quota (10,000 bytes; the photos and the two objects take about 2,200).
        await requests.insert(try Self.staged("huge", Array(repeating: 5, count: 9_000), relay: relay), at: 14)
        // The same bytes as an object the key holds: unchanged.
        await requests.append(try Self.staged("folder", Array(repeating: 2, count: 10), relay: relay))

        let results = await policy.commit(requests)
        #expect(results.count == requests.count)
        for (request, result) in zip(requests, results) {
            switch request.key.value {
            case "taken":
                #expect(
                    result
                        == .failure(UploadPolicy.Refusal(code: .alreadyExists, message: UploadPolicy.alreadyExists(request.key), keepSession: false)))
            case "folder/x":
                #expect((try? result.get()) == nil && { if case .failure(let r) = result { return r.code == .invalidKey } else { return false } }())
            case "huge": #expect({ if case .failure(let r) = result { return r.code == .quotaExceeded } else { return false } }())
            case "folder": #expect((try? result.get()) == .unchanged)
            default: #expect((try? result.get()) == .stored, "\(request.key)")
            }
        }
        for (key, bytes) in expected {
            #expect(Self.stored(key, relay: relay) == bytes, "\(key)")
            #expect(try await relay.catalog.object(account: "cam-7", key: key)?.sha1 == SHA1Digest(bytes: SHA1.hash(bytes))?.hex)
        }
        #expect(Self.stored("taken", relay: relay) == Array(repeating: 1, count: 10))
        #expect(Self.stored("huge", relay: relay) == nil)
        #expect(try await relay.catalog.pendingCommits().isEmpty)
        let used = try await relay.catalog.account(named: "cam-7")?.usedBytes
        #expect(used == Int64(expected.values.map(\.count).reduce(20, +)))
    }

    @Test(
        "a commit stores nothing once its connection's token is no longer the account's: rotated, or the account deleted and made again under its name"
    )
    func commitNeedsThePrincipal() async throws {
        let relay = try await Self.relay(pool: .singleton, quota: nil)
        let policy = relay.policy
        // Rotated: the old token's upload is refused.
        let rotated = try await Self.staged("rotated.jpg", [1, 2, 3], relay: relay)
        #expect(try await relay.catalog.updateAccount(named: "cam-7", quota: nil, tokenHash: Tokens.hash(Array("t2".utf8)), revoked: nil))
        let refused = await policy.commit([rotated])
        #expect(refused.map { (try? $0.get()) == nil } == [true])
        if case .failure(let refusal) = refused.first { #expect(refusal.code == .unauthenticated) }
        // Deleted and made again with the old token's hash would be the same principal; with a new token it is not.
        #expect(try await relay.catalog.deleteAccount(named: "cam-7"))
        try await relay.catalog.addAccount(name: "cam-7", tokenHash: Tokens.hash(Array("new device".utf8)), quota: nil)
        let stale = try await Self.staged("photo.jpg", [4, 5, 6], relay: relay)
        let results = await policy.commit([stale])
        if case .failure(let refusal) = results.first { #expect(refusal.code == .unauthenticated) } else { Issue.record("stored: \(results)") }
        #expect(Self.stored("rotated.jpg", relay: relay) == nil)
        #expect(Self.stored("photo.jpg", relay: relay) == nil)
        #expect(try await relay.catalog.objects().isEmpty)
    }

    @Test("an upload whose commit finished, with its RESULT not yet sent, counts once against the quota, not twice")
    func committedUploadCountsOnce() async throws {
        let relay = try await Self.relay(pool: .singleton, quota: 1000)
        let bytes = [UInt8](repeating: 7, count: 600)
        let name = KeyClaims.name(account: "cam-7", key: "a.bin")
        // The upload's OPEN claimed the key and announced its size; its stream stays open until RESULT goes out.
        #expect(relay.claims.claim(name, whenFree: {}) == .claimed)
        relay.claims.announce(name, size: 600)
        let results = await relay.policy.commit([try Self.staged("a.bin", bytes, relay: relay)])
        guard case .success(.stored)? = results.first else {
            Issue.record("\(results)")
            return
        }
        let use = try await Self.quotaUse(relay, openingAnother: "b.bin")
        #expect(use.left == 400, "\(use)")
        relay.claims.release(name)
    }

    @Test("an OPEN refused for the quota does not count against the OPENs beside it while its stream closes")
    func refusedOpenCountsNothing() async throws {
        let relay = try await Self.relay(pool: .singleton, quota: 1000)
        let account = try await #require(try relay.catalog.account(named: "cam-7"))
        let name = KeyClaims.name(account: "cam-7", key: "big.bin")
        #expect(relay.claims.claim(name, whenFree: {}) == .claimed)
        let open = Frame.Open(streamID: 1, key: "big.bin", size: 5000)
        guard
            case .refuse(.quotaExceeded, _) = await relay.policy.open(
                account: account, open: open, key: try ObjectKey(validating: "big.bin"))
        else {
            Issue.record("not refused")
            return
        }
        // Its claim lives until the refusal has gone out; meanwhile a 900-byte file still fits.
        let use = try await Self.quotaUse(relay, openingAnother: "small.bin")
        #expect(use.left == 1000, "\(use)")
        relay.claims.release(name)
    }

    @Test("commits that arrive while a group runs wait for the next one: 64 commits behind a busy store make at most two groups")
    func commitsGroupWhileBusy() async throws {
        let pool = NIOThreadPool(numberOfThreads: 1)
        pool.start()
        let relay = try await Self.relay(pool: pool)
        var requests: [(String, UploadPolicy.CommitRequest)] = []
        for i in 0..<64 {
            requests.append(("clip/\(i)", try await Self.staged("clip/\(i)", [UInt8](repeating: UInt8(i), count: 4096), relay: relay)))
        }
        // The store's only thread is busy until every commit has been asked for: the first group waits on it, the
        // others wait for the next group.
        let release = DispatchSemaphore(value: 0)
        pool.submit { _ in release.wait() }
        let all = await withTaskGroup(of: (String, Result<Frame.Result.Status, UploadPolicy.Refusal>).self) { group in
            for (key, request) in requests {
                group.addTask { (key, await relay.commits.commit(request)) }
            }
            let asked = await Polling.waitUntil(timeout: 30) { () async -> Bool in relay.commits.submitted == 64 }
            release.signal()
            #expect(asked, "\(relay.commits.submitted) of 64 commits asked for")
            var outcomes: [String: Result<Frame.Result.Status, UploadPolicy.Refusal>] = [:]
            for await (key, result) in group { outcomes[key] = result }
            return outcomes
        }
        try await pool.shutdownGracefully()
        #expect(relay.commits.groupsRun <= 2, "\(relay.commits.groupsRun) groups")
        #expect(all.count == 64 && all.values.allSatisfy { (try? $0.get()) == .stored })
        for i in 0..<64 {
            #expect(Self.stored("clip/\(i)", relay: relay) == [UInt8](repeating: UInt8(i), count: 4096))
        }
    }

    @Test("a store whose thread pool stopped refuses the waiting commits, keeping their sessions, and stores nothing")
    func stoppedPool() async throws {
        let pool = NIOThreadPool(numberOfThreads: 1)
        pool.start()
        let relay = try await Self.relay(pool: pool)
        let request = try await Self.staged("late", [1, 2, 3], relay: relay)
        try await pool.shutdownGracefully()
        let outcome = await relay.commits.commit(request)
        guard case .failure(let refusal) = outcome else {
            Issue.record("expected a refusal")
            return
        }
        #expect(refusal.code == .internalError && refusal.keepSession)
        #expect(Self.stored("late", relay: relay) == nil)
    }

    @Test(
        "a commit the store made visible but the relay never recorded (its answer lost) is settled at the next OPEN of the key: the object is recorded and the OPEN answered STORED, not started over into a second commit; a resume by token or fingerprint alone too (fault matrix seed 330)",
        arguments: ["sha1", "token", "fingerprint"]
    )
    func undecidedCommitSettledAtOpen(naming: String) async throws {
        let relay = try await Self.relay(pool: .singleton)
        let bytes = [UInt8](repeating: 42, count: 70_000)
        let request = try await Self.staged("clip.mp4", bytes, relay: relay)
        let pending = PendingCommit(
            account: "cam-7", key: "clip.mp4", size: Int64(bytes.count), sha1: request.sha1.hex, sessionID: "s-lost"
        )
        // The session the upload had, its staging now gone (made into the object), and the commit begun and placed,
        // as when S3 completed the upload and its answer never came.
        try await relay.catalog.putSession(
            UploadSession(
                id: "s-lost", account: "cam-7", key: "clip.mp4", resumeToken: [7], fingerprint: [1], declaredSize: Int64(bytes.count),
                durableOffset: 65_536, sha1State: SHA1().exportState(), stagingName: request.staging.name
            )
        )
        try await relay.catalog.beginCommit(pending)
        _ = try await relay.store.commit(request.staging, as: request.key, account: "cam-7")
        let account = try await #require(try relay.catalog.account(named: "cam-7"))
        let open = Frame.Open(
            streamID: 1, key: "clip.mp4", size: UInt64(bytes.count), sha1: naming == "sha1" ? request.sha1 : nil,
            fingerprint: naming == "token" ? [] : [1],
            resumeToken: naming == "fingerprint" ? [] : [7]
        )
        let answer = await relay.policy.open(account: account, open: open, key: request.key)
        guard case .stored(let size) = answer else {
            Issue.record("the OPEN after an undecided commit was answered \(answer)")
            return
        }
        #expect(size == UInt64(bytes.count))
        #expect(try await relay.catalog.pendingCommits().isEmpty)
        #expect(try await relay.catalog.object(account: "cam-7", key: "clip.mp4")?.sha1 == request.sha1.hex)
        #expect(try await relay.catalog.session(account: "cam-7", key: "clip.mp4") == nil)
    }
}
