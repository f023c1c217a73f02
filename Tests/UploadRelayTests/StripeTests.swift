import Foundation
import NIOCore
import Testing
import UploadChecksums
import UploadProtocol
import UploadTestSupport

@testable import UploadRelay

/// One blob in stripes over several connections (SPEC §6.7), against the relay's real session, catalog and store.
@Suite("Striped uploads, in memory")
struct StripeTests {
    static let mib = 1 << 20

    /// `count` bytes in which every 4 KiB block differs (a repeated block would hide a stripe written at the wrong place).
    static func blob(_ count: Int, seed: UInt64 = 3) -> [UInt8] {
        var rng = SeededGenerator(seed: seed)
        let block = (0..<4096).map { _ in UInt8.random(in: 0...255, using: &rng) }
        var bytes = [UInt8](repeating: 0, count: count)
        for start in stride(from: 0, to: count, by: 4096) {
            let n = min(4096, count - start)
            bytes.replaceSubrange(start..<start + n, with: block[0..<n])
            withUnsafeBytes(of: UInt32(start / 4096)) { bytes.replaceSubrange(start..<start + min(4, n), with: $0.prefix(min(4, n))) }
        }
        return bytes
    }

    /// A connection to `backend` that negotiated stripes, sending 256 KiB chunks.
    static func connection(_ backend: RelayBackend) async -> Pump {
        var pump = await Pump(backend: backend)
        pump.agent.chunkSize = 256 << 10
        await pump.connect(features: .stripes)
        return pump
    }

    /// A new connection that opened `bytes` under `key` with STRIPED and sent stripe 0, its HASH held back: the connection,
    /// the stream, and the upload's token that PART streams name.
    static func openStriped(_ backend: RelayBackend, _ key: String, _ bytes: [UInt8]) async throws -> (Pump, StreamID, [UInt8]) {
        var main = await Self.connection(backend)
        let id = main.upload(MemoryAgent.Job(key: key, data: bytes, striped: true, holdHash: true))
        await main.run()
        return (main, id, try #require(main.agent.resumeTokens[id]))
    }

    /// The main stream's HASH goes out (its stripes are in, or the test says they are not).
    static func sendHash(_ main: inout Pump, _ id: StreamID) async {
        main.agent.jobs[id]?.holdHash = false
        main.agentSends(main.agent.sendWhatCreditAllows())
        await main.run()
    }

    static func stored(_ outcome: MemoryAgent.Outcome?) -> Bool {
        if case .stored = outcome { return true }
        return false
    }

    @Test("a blob of three stripes: stripe 0 on one connection, 1 and 2 on another; HASH on the first commits the exact bytes")
    func threeStripes() async throws {
        let backend = try await RelayBackend()
        let bytes = Self.blob(32 * Self.mib + 100_000)
        #expect(Frame.Stripes(size: UInt64(bytes.count)).count == 3)
        let (opened, id, token) = try await Self.openStriped(backend, "clips/long.mp4", bytes)
        var main = opened
        var parts = await Self.connection(backend)
        #expect(!token.isEmpty)
        #expect(main.agent.sentPayload[id] == 16 * Self.mib)

        let one = parts.upload(MemoryAgent.Job(key: "clips/long.mp4", data: bytes, resumeToken: token, part: 1))
        let two = parts.upload(MemoryAgent.Job(key: "clips/long.mp4", data: bytes, resumeToken: token, part: 2))
        await parts.run()
        #expect(Self.stored(parts.agent.outcomes[one]))
        #expect(Self.stored(parts.agent.outcomes[two]))
        #expect(parts.agent.sentPayload[two] == 100_000)
        // A complete stripe opened again: nothing to send.
        let again = parts.upload(MemoryAgent.Job(key: "clips/long.mp4", data: bytes, resumeToken: token, part: 2))
        await parts.run()
        #expect(parts.agent.outcomes[again] == .deduplicated)
        await #expect(backend.object("clips/long.mp4") == nil)

        await Self.sendHash(&main, id)
        guard case .stored(let result) = main.agent.outcomes[id] else {
            Issue.record("main stream: \(String(describing: main.agent.outcomes[id]))")
            return
        }
        #expect(result.size == UInt64(bytes.count))
        await #expect(backend.object("clips/long.mp4") == bytes)
        await #expect(backend.durableOffset("clips/long.mp4") == nil)
        // Committed: the token names no striped upload any more.
        let late = parts.upload(MemoryAgent.Job(key: "clips/long.mp4", data: bytes, resumeToken: token, part: 1))
        await parts.run()
        #expect(parts.agent.outcomes[late] == .failed(.storageError))
        await main.relay.connectionClosed()
        await parts.relay.connectionClosed()
        #expect(!backend.holdsResources)
    }

    @Test("HASH with a stripe missing is SIZE_MISMATCH and keeps stripe 0; once the stripe arrives the main stream resumes at its end")
    func hashBeforeStripes() async throws {
        let backend = try await RelayBackend()
        let bytes = Self.blob(16 * Self.mib + 5000, seed: 9)
        var main = await Self.connection(backend)
        let id = main.upload(MemoryAgent.Job(key: "v.mov", data: bytes, striped: true))
        await main.run()
        #expect(main.agent.outcomes[id] == .failed(.sizeMismatch))
        let token = try #require(main.agent.resumeTokens[id])
        await #expect(backend.durableOffset("v.mov") == Int64(16 * Self.mib))

        var parts = await Self.connection(backend)
        let one = parts.upload(MemoryAgent.Job(key: "v.mov", data: bytes, resumeToken: token, part: 1))
        await parts.run()
        #expect(Self.stored(parts.agent.outcomes[one]))
        // The session holds stripe 0's durable bytes and the complete stripe against the quota.
        let use = try await backend.relay.catalog.quotaUse(account: "cam-7", excludingKey: "other", active: [:])
        #expect(use.staged == Int64(bytes.count))

        let resumed = main.upload(MemoryAgent.Job(key: "v.mov", data: bytes, resumeToken: token, striped: true))
        await main.run()
        #expect(main.agent.startedAt[resumed] == UInt64(16 * Self.mib))
        #expect(Self.stored(main.agent.outcomes[resumed]))
        await #expect(backend.object("v.mov") == bytes)
    }

    @Test("a stripe whose bytes differ from what was hashed fails the commit with HASH_MISMATCH, nothing visible")
    func lyingStripe() async throws {
        let backend = try await RelayBackend()
        let bytes = Self.blob(16 * Self.mib + 4096, seed: 11)
        var other = bytes
        other[other.count - 1] ^= 0xFF
        let (opened, id, token) = try await Self.openStriped(backend, "x", bytes)
        var main = opened
        var parts = await Self.connection(backend)
        parts.upload(MemoryAgent.Job(key: "x", data: other, resumeToken: token, part: 1))
        await parts.run()
        await Self.sendHash(&main, id)
        #expect(main.agent.outcomes[id] == .failed(.hashMismatch))
        await #expect(backend.object("x") == nil)
        await #expect(backend.durableOffset("x") == nil)
    }

    @Test(
        "one stream per stripe: a second PART of an open stripe is KEY_BUSY; a PART of a key with no striped upload, or with another token, is STORAGE_ERROR"
    )
    func refusals() async throws {
        let backend = try await RelayBackend()
        let bytes = Self.blob(16 * Self.mib + 10, seed: 5)
        let (opened, id, token) = try await Self.openStriped(backend, "k", bytes)
        var main = opened
        var first = await Self.connection(backend)
        var second = await Self.connection(backend)
        let open = first.upload(MemoryAgent.Job(key: "k", data: bytes, resumeToken: token, part: 1, holdHash: true))
        await first.run()
        #expect(first.agent.outcomes[open] == nil)
        let busy = second.upload(MemoryAgent.Job(key: "k", data: bytes, resumeToken: token, part: 1))
        let noUpload = second.upload(MemoryAgent.Job(key: "other", data: bytes, resumeToken: token, part: 1))
        await second.run()
        #expect(second.agent.outcomes[busy] == .failed(.keyBusy))
        #expect(second.agent.outcomes[noUpload] == .failed(.storageError))
        // The first PART's stream ends without HASH: its stripe is not complete, and a new stream sends it again.
        await first.relay.connectionClosed()
        let wrongToken = second.upload(MemoryAgent.Job(key: "k", data: bytes, resumeToken: [1, 2, 3], part: 1))
        await second.run()
        #expect(second.agent.outcomes[wrongToken] == .failed(.storageError))
        let retry = second.upload(MemoryAgent.Job(key: "k", data: bytes, resumeToken: token, part: 1))
        await second.run()
        #expect(Self.stored(second.agent.outcomes[retry]))
        #expect(second.agent.sentPayload[retry] == 10)
        await Self.sendHash(&main, id)
        await #expect(backend.object("k") == bytes)
    }

    @Test("OPEN of a striped session without STRIPED starts over; CANCEL of a PART keeps the upload")
    func sessionRules() async throws {
        let backend = try await RelayBackend()
        let bytes = Self.blob(16 * Self.mib + 100, seed: 7)
        let (opened, _, token) = try await Self.openStriped(backend, "s", bytes)
        var main = opened
        var parts = await Self.connection(backend)
        let part = parts.upload(MemoryAgent.Job(key: "s", data: bytes, resumeToken: token, part: 1, holdHash: true))
        await parts.run()
        parts.agentSends([parts.agent.machine.sendCancel(part, .cancelled, "test")].compactMap { $0 })
        await parts.run()
        await #expect(backend.durableOffset("s") != nil)
        await main.relay.connectionClosed()
        var plain = await Self.connection(backend)
        let whole = plain.upload(MemoryAgent.Job(key: "s", data: bytes, resumeToken: token))
        await plain.run()
        #expect(plain.agent.startedAt[whole] == 0)
        #expect(Self.stored(plain.agent.outcomes[whole]))
        await #expect(backend.object("s") == bytes)
    }

    @Test("expiry spares a striped session while a stream writes one of its stripes, its main stream away; then it expires")
    func expiryWhileStriping() async throws {
        let backend = try await RelayBackend()
        let bytes = Self.blob(16 * Self.mib + 300, seed: 13)
        let (opened, _, token) = try await Self.openStriped(backend, "e", bytes)
        var main = opened
        await main.relay.connectionClosed()
        var parts = await Self.connection(backend)
        parts.upload(MemoryAgent.Job(key: "e", data: bytes, resumeToken: token, part: 1, holdHash: true))
        await parts.run()
        let wired = backend.relay
        let keys = RelayRuntime.KeyGuard.claiming(wired.claims)
        try await RelayRuntime.cleanUp(catalog: wired.catalog, store: wired.store, expiry: .zero, logger: wired.logger, keys: keys)
        await #expect(backend.durableOffset("e") != nil, "a session with a stripe being written expired")
        await parts.relay.connectionClosed()
        try await RelayRuntime.cleanUp(catalog: wired.catalog, store: wired.store, expiry: .zero, logger: wired.logger, keys: keys)
        await #expect(backend.durableOffset("e") == nil)
        #expect(!backend.holdsResources)
    }
}
