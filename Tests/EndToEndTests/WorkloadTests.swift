import Foundation
import NIOCore
import Testing
import UploadAgent
import UploadChecksums
import UploadProtocol
@testable import UploadRelay
@testable import UploadRelaySQLite
import UploadTestSupport
import NIOConcurrencyHelpers

/// What users and hostile agents do that the first tests did not (issue 6): galleries of big files, several accounts,
/// files that change under the agent, keys in each other's way, revoked tokens.
@Suite("End to end: real workloads", .serialized)
struct WorkloadTests {
    static func items(_ files: [(String, String)]) -> [UploadItem] {
        files.map { key, path in UploadItem(key: key, displayPath: path, source: FileSource(path: path)) }
    }

    @Test(
        "a gallery of big files and small ones at once: every byte arrives (finding 1: reads planned on one credit)",
        arguments: [false, true]
    )
    func gallery(smallWindows: Bool) async throws {
        let relay = try await TestRelay {
            if smallWindows {
                $0.limits.streamWindow = 64 << 10
                $0.limits.connectionWindow = 64 << 10
            }
        }.start()
        let source = TestRelay.makeDirectory()
        var files: [String: Data] = [:]
        var paths: [(String, String)] = []
        let big = smallWindows ? (count: 3, size: 1 << 20) : (count: 8, size: 16 << 20)
        for i in 0..<big.count {
            let file = makeFile(source, "video-\(i).mov", size: big.size, seed: UInt64(100 + i))
            files["gallery/video-\(i).mov"] = file.data
            paths.append(("gallery/video-\(i).mov", file.path))
        }
        for i in 0..<200 {
            let file = makeFile(source, "img-\(i).jpg", size: 1 + i * 97, seed: UInt64(500 + i))
            files["gallery/img-\(i).jpg"] = file.data
            paths.append(("gallery/img-\(i).jpg", file.path))
        }
        for dedup in [false, true] {
            let results = try await upload(Self.items(paths), port: relay.port, token: relay.token, ca: relay.caPath) {
                $0.dedup = dedup
                $0.overwrite = true
            }
            #expect(results.count == paths.count)
            for result in results {
                #expect(result.status != .failed, "\(result.key): \(result.error ?? "")")
                #expect(relay.stored(result.key) == files[result.key], "\(result.key) differs")
            }
        }
        await relay.stop()
    }

    @Test("two accounts with the same key names: separate objects, no dedup or STORED across accounts (finding 2)")
    func accountsAreSeparate() async throws {
        let relay = try await TestRelay().start()
        let alice = try await relay.addAccount("alice")
        let bob = try await relay.addAccount("bob")
        let source = TestRelay.makeDirectory()
        let a = makeFile(source, "a.jpg", size: 300_000, seed: 1)
        let b = makeFile(source, "b.jpg", size: 300_000, seed: 2)
        let first = try await upload(Self.items([("photos/1.jpg", a.path)]), port: relay.port, token: alice, ca: relay.caPath)
        #expect(first.first?.status == .stored)
        // Bob stores other bytes under the same key: his own object; Alice's stays.
        let second = try await upload(Self.items([("photos/1.jpg", b.path)]), port: relay.port, token: bob, ca: relay.caPath)
        #expect(second.first?.status == .stored)
        #expect(relay.stored("photos/1.jpg", account: "alice") == a.data)
        #expect(relay.stored("photos/1.jpg", account: "bob") == b.data)
        // Alice's own re-upload is answered STORED from her object.
        let again = try await upload(Self.items([("photos/1.jpg", a.path)]), port: relay.port, token: alice, ca: relay.caPath)
        #expect(again.first?.status == .deduplicated)
        #expect(again.first?.sentBytes == 0)
        // Bob holding Alice's bytes under another key must send them: no dedup against another account.
        let copy = try await upload(Self.items([("mine.jpg", a.path)]), port: relay.port, token: bob, ca: relay.caPath)
        #expect(copy.first?.status == .stored)
        #expect(copy.first?.sentBytes == 300_000)
        #expect(relay.stored("mine.jpg", account: "bob") == a.data)
        #expect(relay.stored("mine.jpg", account: "alice") == nil)
        await relay.stop()
    }

    @Test("an object changed on disk behind the relay's back is never vouched for as STORED (finding 2: identity, not size)")
    func storedChecksIdentity() async throws {
        let relay = try await TestRelay().start()
        let source = TestRelay.makeDirectory()
        let file = makeFile(source, "doc.pdf", size: 100_000, seed: 3)
        let first = try await upload(Self.items([("doc.pdf", file.path)]), port: relay.port, token: relay.token, ca: relay.caPath)
        #expect(first.first?.status == .stored)
        // Same size, other bytes, placed where the object was (a new file: another inode).
        let impostor = makeFile(source, "impostor", size: 100_000, seed: 4)
        let objectPath = relay.storePath + "/dev/doc.pdf"
        try FileManager.default.removeItem(atPath: objectPath)
        try FileManager.default.copyItem(atPath: impostor.path, toPath: objectPath)
        let again = try await upload(Self.items([("doc.pdf", file.path)]), port: relay.port, token: relay.token, ca: relay.caPath) {
            $0.overwrite = true
        }
        #expect(again.first?.status == .stored)
        #expect(again.first?.sentBytes == 100_000)
        #expect(relay.stored("doc.pdf") == file.data)
        await relay.stop()
    }

    @Test("two commits of one account at once never pass its quota, and nothing refused is renamed into place (finding 3)")
    func quotaCommitsAreAtomic() async throws {
        let directory = TestRelay.makeDirectory()
        let catalog = try SQLiteCatalog(path: directory + "/catalog.sqlite")
        try await catalog.addAccount(name: "small", tokenHash: [1], quota: 100)
        let first = PendingCommit(account: "small", key: "k2", size: 60, sha1: "a", sessionID: nil)
        let second = PendingCommit(account: "small", key: "k1", size: 60, sha1: "b", sessionID: nil)
        try await catalog.beginCommit(first)
        await #expect(throws: CatalogError.self) { try await catalog.beginCommit(second) }
        try await catalog.finishCommit(first, identity: ObjectIdentity(device: 1, inode: 2, size: 60, modified: 3))
        #expect(try await catalog.account(named: "small")?.usedBytes == 60)
        // An abandoned commit gives its reservation back.
        let third = PendingCommit(account: "small", key: "k3", size: 40, sha1: "c", sessionID: nil)
        try await catalog.beginCommit(third)
        #expect(try await catalog.quotaUse(account: "small", excludingKey: "x").left == 0)
        try await catalog.abandonCommit(account: "small", key: "k3")
        #expect(try await catalog.quotaUse(account: "small", excludingKey: "x").left == 40)
    }

    @Test("unfinished uploads count against the quota; past it OPEN is refused, naming what holds the quota (finding 4)")
    func stagedBytesCountAgainstQuota() async throws {
        let directory = TestRelay.makeDirectory()
        let catalog = try SQLiteCatalog(path: directory + "/catalog.sqlite")
        try await catalog.addAccount(name: "small", tokenHash: [1], quota: 100)
        for i in 0..<3 {
            try await catalog.putSession(
                UploadSession(
                    id: "s\(i)", account: "small", key: "k\(i)", resumeToken: [], fingerprint: [], declaredSize: i == 2 ? nil : 30,
                    durableOffset: 15, sha1State: [], stagingName: "s\(i)"
                )
            )
        }
        // Left behind, the sessions hold their durable bytes; an open upload (k1) will hold what it announced.
        #expect(try await catalog.quotaUse(account: "small", excludingKey: "k0").staged == 30)
        let use = try await catalog.quotaUse(account: "small", excludingKey: "k0", active: ["k1": 0])
        #expect(use.staged == 45)
        #expect(use.left == 55)
        #expect(use.refusal(account: "small", needed: 60).contains("held by unfinished uploads"))
    }

    /// A catalog whose account "small" (quota 100) holds the object `key` of `size` bytes.
    static func catalog(holding key: String, size: Int64) async throws -> SQLiteCatalog {
        let catalog = try SQLiteCatalog(path: TestRelay.makeDirectory() + "/catalog.sqlite")
        try await catalog.addAccount(name: "small", tokenHash: [1], quota: 100)
        let stored = PendingCommit(account: "small", key: key, size: size, sha1: "a", sessionID: nil)
        try await catalog.beginCommit(stored)
        try await catalog.finishCommit(stored, identity: ObjectIdentity(device: 1, inode: 2, size: size, modified: 3))
        return catalog
    }

    @Test("an open upload whose session is not recorded yet holds what it announced, beyond the object it replaces")
    func openUploadWithoutSessionCounts() async throws {
        let catalog = try await Self.catalog(holding: "old", size: 30)
        // "new" announced 40 and replaces nothing; "old" announced 50 and replaces its 30; "stdin" announced nothing.
        var use = try await catalog.quotaUse(account: "small", excludingKey: "asking", active: ["new": 40, "old": 50, "stdin": 0, "asking": 99])
        #expect(use.staged == 60)
        #expect(use.left == 10)
        // "new" commits: its reservation counts it, its announcement no more.
        try await catalog.beginCommit(PendingCommit(account: "small", key: "new", size: 40, sha1: "b", sessionID: nil))
        use = try await catalog.quotaUse(account: "small", excludingKey: "asking", active: ["new": 40, "old": 50, "stdin": 0, "asking": 99])
        #expect(use.staged == 20 && use.committing == 40, "\(use)")
    }

    @Test("an upload that will replace an object counts only what it adds to it (soak seed 424242 round 21)")
    func replacingUploadCountsItsGrowth() async throws {
        let catalog = try await Self.catalog(holding: "big", size: 80)
        // The same key sent again from stdin (size unknown), 70 bytes in: the commit will charge nothing.
        try await catalog.putSession(
            UploadSession(
                id: "again", account: "small", key: "big", resumeToken: [], fingerprint: [], declaredSize: nil,
                durableOffset: 70, sha1State: [], stagingName: "again"
            )
        )
        var use = try await catalog.quotaUse(account: "small", excludingKey: "photo", active: ["big": 0])
        #expect(use.staged == 0)
        #expect(use.left == 20)
        // Past the old object's size, the session holds its growth.
        try await catalog.updateDurable(sessionID: "again", offset: 90, sha1State: [])
        use = try await catalog.quotaUse(account: "small", excludingKey: "photo", active: ["big": 0])
        #expect(use.staged == 10)
        #expect(use.left == 10)
    }

    @Test("abandoned sessions expire while the relay runs, staged bytes and all (finding 4)")
    func sessionsExpireWhileRunning() async throws {
        let relay = try await TestRelay {
            $0.sessionExpiry = .seconds(1)
            $0.maintenanceInterval = .milliseconds(100)
        }.start()
        let staging = try await relay.parts.store.openStaging(.named("abandoned"))
        try await staging.write(ByteBuffer(string: "half an upload"), at: 0)
        staging.close()
        try await relay.parts.catalog.putSession(
            UploadSession(
                id: "abandoned", account: "dev", key: "old.bin", resumeToken: [1], fingerprint: [], declaredSize: 100,
                durableOffset: 14, sha1State: [], stagingName: "abandoned", updatedAt: Date().addingTimeInterval(-5)
            )
        )
        // The relay's own housekeeping, observed with a deadline.
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline, try await relay.parts.catalog.session(account: "dev", key: "old.bin") != nil {
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(try await relay.parts.catalog.session(account: "dev", key: "old.bin") == nil)
        #expect(try await !relay.parts.store.hasStaging("abandoned"))
        #expect(try await relay.parts.catalog.quotaUse(account: "dev", excludingKey: "x").staged == 0)
        await relay.stop()
    }

    @Test("a file rewritten while it uploads is never committed as a mix of two versions (finding 8)")
    func changedDuringUpload() async throws {
        let relay = try await TestRelay {
            $0.limits.streamWindow = 64 << 10; $0.limits.connectionWindow = 64 << 10
        }.start()
        let source = TestRelay.makeDirectory()
        let file = makeFile(source, "growing.mov", size: 8 << 20, seed: 5)
        let sent = SentCounter()
        let path = file.path
        let task = Task {
            try await upload(Self.items([("growing.mov", path)]), port: relay.port, token: relay.token, ca: relay.caPath) {
                $0.dedup = false
                $0.maxAttemptsPerItem = 1
                // 2 MiB/s: the rewrite lands mid-upload (at loopback speed 8 MiB can be gone before it does; at 8 MiB/s
                // the full suite on 2 cores once resumed this test after the last read).
                $0.bandwidthLimit = 2 << 20
            } onEvent: { event in
                if case .sent(_, let bytes) = event { sent.add(bytes) }
            }
        }
        await sent.wait(for: 1 << 20)
        // The camera rewrites the file in place: same size, new head and tail.
        let handle = try #require(FileHandle(forWritingAtPath: path))
        try handle.write(contentsOf: Data(repeating: 0xEE, count: 4096))
        try handle.seek(toOffset: UInt64(8 << 20) - 4096)
        try handle.write(contentsOf: Data(repeating: 0xEE, count: 4096))
        try handle.close()
        let results = try await task.value
        #expect(results.first?.status == .failed)
        #expect(results.first?.error?.contains("modified during the upload") == true, "\(results.first?.error ?? "")")
        #expect(relay.stored("growing.mov") == nil)
        await relay.stop()
    }

    @Test("keys split on bytes: a combining mark right after \"/\" is stored where its key says (finding 9)")
    func combiningMarkAfterSlash() async throws {
        let relay = try await TestRelay().start()
        let source = TestRelay.makeDirectory()
        let file = makeFile(source, "x", size: 1000, seed: 6)
        let key = "uni/\u{301}x"
        let results = try await upload(Self.items([(key, file.path)]), port: relay.port, token: relay.token, ca: relay.caPath)
        #expect(results.first?.status == .stored, "\(results.first?.error ?? "")")
        #expect(FileManager.default.contents(atPath: relay.storePath + "/dev/uni/\u{301}x") == file.data)
        await relay.stop()
    }

    @Test("a key that is another key's folder, or under another key, is refused at OPEN, naming that key, and not retried (finding 10)")
    func keyConflicts() async throws {
        let relay = try await TestRelay().start()
        let source = TestRelay.makeDirectory()
        let file = makeFile(source, "f", size: 4 << 20, seed: 7)
        let first = try await upload(Self.items([("a", file.path), ("c/d", file.path)]), port: relay.port, token: relay.token, ca: relay.caPath)
        // One of the two is sent; the other, the same bytes, is the relay's dedup.
        #expect(first.map(\.status).sorted { $0.rawValue < $1.rawValue } == [.deduplicated, .stored], "\(first)")
        let other = makeFile(source, "g", size: 4 << 20, seed: 8)
        for key in ["a/b", "c"] {
            let results = try await upload(Self.items([(key, other.path)]), port: relay.port, token: relay.token, ca: relay.caPath) {
                $0.dedup = false
            }
            #expect(results.first?.status == .failed)
            #expect(results.first?.error?.contains("INVALID_KEY") == true, "\(results.first?.error ?? "")")
            #expect(results.first?.sentBytes == 0)
        }
        await relay.stop()
    }

    @Test("a token revoked while its agent uploads: the connection closes within seconds and nothing more is stored (finding 6)")
    func revokedWhileUploading() async throws {
        let relay = try await TestRelay { $0.maintenanceInterval = .milliseconds(100) }.start()
        let token = try await relay.addAccount("stolen")
        let pipe = Pipe()
        let sent = SentCounter()
        let task = Task {
            try await upload(
                [UploadItem(key: "exfil.bin", displayPath: "-", source: StreamSource(descriptor: pipe.fileHandleForReading.fileDescriptor))],
                port: relay.port, token: token, ca: relay.caPath,
                onEvent: { event in
                    if case .sent(_, let bytes) = event { sent.add(bytes) }
                }
            )
        }
        // A source that never ends: 4 MiB, then silence until the test closes it.
        let writer = Thread { pipe.fileHandleForWriting.write(Data(repeating: 1, count: 4 << 20)) }
        writer.start()
        await sent.wait(for: 1 << 20)
        #expect(try await relay.parts.catalog.revokeAccount(named: "stolen"))
        // The agent is told at once (UNAUTHENTICATED is not retried), even though its source never ended.
        let results = try await task.value
        try? pipe.fileHandleForWriting.close()
        #expect(results.first?.status == .failed)
        #expect(results.first?.error?.contains("revoked") == true, "\(results.first?.error ?? "")")
        #expect(relay.stored("exfil.bin", account: "stolen") == nil)
        await relay.stop()
    }

    @Test(
        "GOAWAY drains: a stream open when shutdown starts goes on, gets its RESULT on the same connection, and only then does the relay close (findings 11, 17)"
    )
    func goAwayDrains() async throws {
        let relay = try await TestRelay { $0.shutdownGrace = .seconds(30) }.start()
        let source = TestRelay.makeDirectory()
        let file = makeFile(source, "clip.mov", size: 48 << 20, seed: 12)
        let sent = SentCounter()
        let connections = Counter()
        let path = file.path
        let task = Task {
            try await upload(Self.items([("clip.mov", path)]), port: relay.port, token: relay.token, ca: relay.caPath) {
                $0.dedup = false
                $0.retryFor = .seconds(5)
            } onEvent: { event in
                if case .sent(_, let bytes) = event { sent.add(bytes) }
                if case .connected = event { connections.increment() }
            }
        }
        await sent.wait(for: 16 << 20)
        relay.server.shutdown()
        let results = try await task.value
        #expect(results.first?.status == .stored, "\(results.first?.error ?? "")")
        #expect(connections.value == 1)
        #expect(relay.stored("clip.mov") == file.data)
        await relay.stop()
    }

    @Test(
        "a dev relay is reachable by the address it listens on; a certificate that names another host fails at once, saying what to do (finding 22)")
    func devCertificateNames() async throws {
        // 127.0.0.2 stands for "another address of the relay's host": loopback, but not in the default certificate.
        let source = TestRelay.makeDirectory()
        let plain = try await TestRelay { $0.host = "127.0.0.2" }.start()
        let started = ContinuousClock.now
        let refused = try await upload(
            Self.items([("f", makeFile(source, "f", size: 1000, seed: 9).path)]), host: "127.0.0.2", port: plain.port,
            token: plain.token, ca: plain.caPath, configure: { $0.retryFor = .seconds(60) }
        )
        // Not retried for --retry-for: failed at once, with the fixes in the message.
        #expect(ContinuousClock.now - started < .seconds(20))
        #expect(refused.first?.status == .failed)
        #expect(refused.first?.error?.contains("--dev-host 127.0.0.2") == true, "\(refused.first?.error ?? "")")
        #expect(refused.first?.error?.contains("--server-name") == true, "\(refused.first?.error ?? "")")
        // --server-name with a name the certificate holds works whatever address is dialled.
        let named = try await upload(
            Self.items([("g", makeFile(source, "g", size: 1000, seed: 10).path)]), host: "127.0.0.2", port: plain.port,
            token: plain.token, ca: plain.caPath, configure: { $0.serverName = "localhost" }
        )
        #expect(named.first?.status == .stored, "\(named.first?.error ?? "")")
        await plain.stop()
        // A dev relay made for its address is reachable by it.
        let relay = try await TestRelay(devNames: ["127.0.0.2"]) { $0.host = "127.0.0.2" }.start()
        let stored = try await upload(
            Self.items([("h", makeFile(source, "h", size: 1000, seed: 11).path)]), host: "127.0.0.2", port: relay.port,
            token: relay.token, ca: relay.caPath
        )
        #expect(stored.first?.status == .stored, "\(stored.first?.error ?? "")")
        await relay.stop()
    }

    @Test("many agents at once share the relay's memory budget and an upload limit: windows shrink, OPENs wait, nothing fails (findings 19, 24)")
    func sharedBudgets() async throws {
        let relay = try await TestRelay {
            $0.memoryBudget = 1 << 20
            $0.limits.connectionWindow = 512 << 10
            $0.minimumConnectionWindow = 64 << 10
            $0.maxOpenUploads = 2
        }.start()
        let source = TestRelay.makeDirectory()
        let windows = WindowLog()
        let results = try await withThrowingTaskGroup(of: [UploadResult].self) { group in
            for agent in 0..<10 {
                let files = (0..<3).map { makeFile(source + "/a\(agent)", "f\($0)", size: 700_000, seed: UInt64(1000 + 10 * agent + $0)) }
                group.addTask {
                    try await upload(
                        files.enumerated().map {
                            UploadItem(key: "a\(agent)/f\($0.offset)", displayPath: $0.element.path, source: FileSource(path: $0.element.path))
                        },
                        port: relay.port, token: relay.token, ca: relay.caPath, configure: { $0.concurrency = 3 },
                        onEvent: { event in
                            if case .connected = event { windows.record(relay.parts.memory.inUse) }
                        }
                    )
                }
            }
            var all: [UploadResult] = []
            for try await results in group { all += results }
            return all
        }
        #expect(results.count == 30)
        #expect(results.allSatisfy { $0.status == .stored }, "\(results.filter { $0.status != .stored }.map { $0.error ?? "" })")
        // Granted windows stay within the budget plus at most one minimum window per connection.
        #expect(windows.maximum <= (1 << 20) + 10 * (64 << 10))
        // The agents have gone: every connection's handler, session and upload executors are freed (no retain cycle
        // through an executor of a committed upload: review of issue 7).
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline, relay.parts.health.liveHandlers.withLockedValue({ $0 }) > 0 {
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(relay.parts.health.liveHandlers.withLockedValue { $0 } == 0)
        await relay.stop()
        // Every window and upload slot is given back once the connections are gone.
        #expect(relay.parts.memory.inUse == 0)
        #expect(relay.parts.uploadSlots.inUse == 0)
    }
}

final class WindowLog: @unchecked Sendable {
    private let lock = NSLock()
    private var peak = 0
    func record(_ value: Int) {
        self.lock.lock()
        self.peak = max(self.peak, value)
        self.lock.unlock()
    }
    var maximum: Int {
        self.lock.lock()
        defer { self.lock.unlock() }
        return self.peak
    }
}
