import Foundation
import Testing
@_spi(Testing) import UploadAgent
import UploadProtocol
import UploadRelay
import UploadTestSupport

/// What the relay refuses, and how clearly.
@Suite("End to end: refusals", .serialized)
struct RefusalTests {
    func oneFile(_ name: String = "f.bin", size: Int = 10_000) -> (UploadItem, Data) {
        let file = makeFile(TestRelay.makeDirectory(), name, size: size)
        return (UploadItem(key: name, displayPath: file.path, source: FileSource(path: file.path)), file.data)
    }

    @Test("a wrong token is refused and nothing is stored")
    func wrongToken() async throws {
        let relay = try await TestRelay().start()
        let (item, _) = self.oneFile()
        let results = try await upload([item], port: relay.port, token: "upl_not-a-token", ca: relay.caPath)
        #expect(results.first?.status == .failed)
        #expect(results.first?.error?.contains("UNAUTHENTICATED") == true)
        #expect(results.first?.error?.contains("unknown token") == true)
        #expect(relay.stored("f.bin") == nil)
        await relay.stop()
    }

    @Test("a token longer than any a relay issues (70,000 bytes) fails with what to check, before connecting; never a trap")
    func overlongToken() async throws {
        let relay = try await TestRelay().start()
        let (item, _) = self.oneFile()
        let error = await #expect(throws: (any Error).self) {
            _ = try await upload([item], port: relay.port, token: String(repeating: "a", count: 70_000), ca: relay.caPath)
        }
        #expect("\(error.map { "\($0)" } ?? "")".contains("the token is 70000 bytes"), "\(String(describing: error))")
        #expect(relay.stored("f.bin") == nil)
        await relay.stop()
    }

    @Test("a revoked token is refused")
    func revokedToken() async throws {
        let relay = try await TestRelay().start()
        let token = try await relay.addAccount("cam-7")
        #expect(try await relay.parts.catalog.revokeAccount(named: "cam-7"))
        let (item, _) = self.oneFile()
        let results = try await upload([item], port: relay.port, token: token, ca: relay.caPath)
        #expect(results.first?.status == .failed)
        #expect(results.first?.error?.contains("revoked") == true)
        #expect(relay.stored("f.bin") == nil)
        await relay.stop()
    }

    @Test("a CA that does not match gives a TLS error that says so")
    func wrongCA() async throws {
        let relay = try await TestRelay().start()
        let other = try await TestRelay()
        let (item, _) = self.oneFile()
        let results = try await upload([item], port: relay.port, token: relay.token, ca: other.caPath)
        #expect(results.first?.status == .failed)
        #expect(results.first?.error?.contains("CERTIFICATE_VERIFY_FAILED") == true)
        #expect(results.first?.error?.contains("--ca") == true)
        await relay.stop()
        await other.stop()
    }

    @Test(
        "hostile keys are refused with INVALID_KEY; the good upload beside them is stored",
        arguments: [
            "../escape", "/etc/passwd", "a\u{0}b", "a/../../b", "a//b",
        ])
    func hostileKeys(key: String) async throws {
        let relay = try await TestRelay().start()
        let (bad, _) = self.oneFile()
        let (good, data) = self.oneFile("ok.bin")
        var hostile = bad
        hostile.key = key
        let results = try await upload([hostile, good], port: relay.port, token: relay.token, ca: relay.caPath)
        let refused = try #require(results.first { $0.key == key })
        #expect(refused.status == .failed)
        #expect(refused.error?.contains("INVALID_KEY") == true)
        #expect(refused.sentBytes == 0)
        #expect(results.first { $0.key == "ok.bin" }?.status == .stored)
        #expect(relay.stored("ok.bin") == data)
        #expect(!FileManager.default.fileExists(atPath: relay.directory + "/escape"))
        await relay.stop()
    }

    @Test("the agent's own planner refuses such names before connecting, naming the file")
    func plannerRefuses() async throws {
        let directory = TestRelay.makeDirectory()
        _ = makeFile(directory, "ok", size: 1)
        #expect(throws: ItemPlanner.PlanError.self) {
            try ItemPlanner.plan(paths: [directory + "/ok"], prefix: "../up", stdinName: nil)
        }
        #expect(throws: ItemPlanner.PlanError.self) {
            try ItemPlanner.plan(paths: ["-"], prefix: nil, stdinName: nil)
        }
    }

    @Test("an agent that lies about the SHA-1 gets HASH_MISMATCH and nothing is committed")
    func lyingAgent() async throws {
        let relay = try await TestRelay().start()
        let (item, data) = self.oneFile(size: 3 << 20)
        let results = try await upload([item], port: relay.port, token: relay.token, ca: relay.caPath) {
            $0.dedup = false
            $0.faults.lieAboutSHA1 = SHA1Digest.empty
        }
        #expect(results.first?.status == .failed)
        #expect(results.first?.error?.contains("HASH_MISMATCH") == true)
        #expect(relay.stored("f.bin") == nil)
        // The refused session is discarded: an honest upload of the same key right after starts from 0 (it never
        // resumes the refused bytes) and stores the right ones.
        let honest = try await upload([self.fresh(item)], port: relay.port, token: relay.token, ca: relay.caPath) { $0.dedup = false }
        #expect(honest.first?.status == .stored, "\(honest.first?.error ?? "")")
        #expect(honest.first?.sentBytes == UInt64(data.count))
        #expect(relay.stored("f.bin") == data)
        await relay.stop()
    }

    @Test("quota: a blob larger than what is left is refused at OPEN, before any byte moves")
    func quota() async throws {
        let relay = try await TestRelay().start()
        let token = try await relay.addAccount("small", quota: 1 << 20)
        let (item, _) = self.oneFile(size: 2 << 20)
        let results = try await upload([item], port: relay.port, token: token, ca: relay.caPath)
        #expect(results.first?.status == .failed)
        #expect(results.first?.error?.contains("QUOTA_EXCEEDED") == true)
        #expect(results.first?.sentBytes == 0)
        #expect(relay.stored("f.bin") == nil)
        await relay.stop()
    }

    @Test("a chunk corrupted after its CRC was computed is refused, never committed, and the retry stores the right bytes")
    func corruptedChunk() async throws {
        let relay = try await TestRelay().start()
        let (item, data) = self.oneFile(size: 5 << 20)
        let events = EventLog()
        let results = try await upload(
            [item], port: relay.port, token: relay.token, ca: relay.caPath,
            configure: {
                $0.faults.corruptChunkAtOffset = 2 << 20
                $0.dedup = false
                $0.maxAttemptsPerItem = 1
            }
        ) { events.append($0) }
        // With one attempt, the CRC error is final: nothing under the key.
        #expect(results.first?.status == .failed)
        #expect(results.first?.error?.contains("CRC_MISMATCH") == true)
        #expect(relay.stored("f.bin") == nil)
        // Allowed to retry, the agent resumes from the durable offset; the corruption hook fires once per offset and run.
        let retried = try await upload([self.fresh(item)], port: relay.port, token: relay.token, ca: relay.caPath) { $0.dedup = false }
        #expect(retried.first?.status == .stored)
        #expect(relay.stored("f.bin") == data)
        await relay.stop()
    }

    func fresh(_ item: UploadItem) -> UploadItem {
        UploadItem(key: item.key, displayPath: item.displayPath, source: FileSource(path: item.displayPath))
    }
}

final class EventLog: @unchecked Sendable {
    private let lock = NSLock()
    private var events: [UploadEvent] = []
    func append(_ event: UploadEvent) {
        self.lock.lock()
        self.events.append(event)
        self.lock.unlock()
    }
    var all: [UploadEvent] {
        self.lock.lock()
        defer { self.lock.unlock() }
        return self.events
    }
}
