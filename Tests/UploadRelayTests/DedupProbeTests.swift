import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import Testing
import UploadChecksums
import UploadPayload
import UploadProtocol
@testable import UploadRelay
import UploadTestSupport
import NIOPosix

/// The relay's side of the dedup probe (SPEC §7.1): which OPENs are answered CONFIRM, and the probe digests it records.
@Suite("Dedup probe at the relay")
struct DedupProbeTests {
    static let probeLength = Int(Frame.Open.probeLength)

    static func digest(_ bytes: [UInt8]) -> SHA1Digest { SHA1Digest(bytes: SHA1.hash(bytes))! }

    static func open(_ key: String, size: Int, probe: [UInt8], overwrite: Bool = false) -> Frame.Open {
        Frame.Open(streamID: 1, key: key, size: UInt64(size), overwrite: overwrite, probe: Self.digest(probe))
    }

    static func decide(_ open: Frame.Open, _ relay: Relay) async throws -> String {
        let account = try await #require(try relay.catalog.account(named: "cam-7"))
        switch await relay.policy.open(account: account, open: open, key: try ObjectKey(validating: open.key ?? "")) {
        case .confirm: return "confirm"
        case .stored: return "stored"
        case .upload(_, let staging, _, _, _, _):
            staging.close()
            try await relay.store.removeStaging(staging.name)
            return "upload"
        case .stripe(_, let staging, _):
            staging.close()
            return "stripe"
        case .refuse(let code, _): return "refuse \(code.name)"
        }
    }

    @Test(
        "CONFIRM for an object of that size with that probe digest, or with none recorded; START otherwise; ALREADY_EXISTS for a key that cannot hold it"
    )
    func decisions() async throws {
        let relay = try await CommitGroupTests.relay(pool: .singleton)
        let policy = relay.policy
        var first = [UInt8](repeating: 7, count: 2 * Self.probeLength + 10)
        first[Self.probeLength + 5] = 1  // past the probe: the probe digest is that of the first 256 KiB only
        var a = try await CommitGroupTests.staged("a.mp4", first, relay: relay)
        a.probeSHA1 = Self.digest(Array(first.prefix(Self.probeLength))).hex
        var c = try await CommitGroupTests.staged("c.mp4", [UInt8](repeating: 9, count: 3 * Self.probeLength), relay: relay)
        c.probeSHA1 = nil  // committed before probes existed
        await #expect(policy.commit([a, c]).allSatisfy { (try? $0.get()) == .stored })

        let prefix = Array(first.prefix(Self.probeLength))
        await #expect(try Self.decide(Self.open("b.mp4", size: first.count, probe: prefix), relay) == "confirm")
        await #expect(try Self.decide(Self.open("a.mp4", size: first.count, probe: prefix), relay) == "confirm", "the key's own object")
        await #expect(try Self.decide(Self.open("b.mp4", size: first.count, probe: [1]), relay) == "upload", "other first bytes")
        await #expect(try Self.decide(Self.open("b.mp4", size: first.count + 1, probe: prefix), relay) == "upload", "another size")
        await #expect(try Self.decide(Self.open("d.mp4", size: 3 * Self.probeLength, probe: [2]), relay) == "confirm", "no probe recorded")
        await #expect(try Self.decide(Self.open("a.mp4", size: 5 * Self.probeLength, probe: [3]), relay) == "refuse ALREADY_EXISTS")
        await #expect(try Self.decide(Self.open("a.mp4", size: 5 * Self.probeLength, probe: [3], overwrite: true), relay) == "upload")
    }

    @Test("an upload records the SHA-1 of its first 256 KiB as it writes, whatever the chunk boundaries; none for a blob of 256 KiB or less")
    func recordsProbeDigest() async throws {
        let relay = try await CommitGroupTests.relay(pool: .singleton)
        var rng = SeededGenerator(seed: 91)
        for (key, size, chunkSize) in [
            ("big.bin", 3 * Self.probeLength + 123, 100_000), ("even.bin", 2 * Self.probeLength, 1 << 16), ("small.bin", Self.probeLength, 100_000),
        ] {
            let bytes = (0..<size).map { _ in UInt8.random(in: 0...255, using: &rng) }
            let account = try await #require(try relay.catalog.account(named: "cam-7"))
            let open = Frame.Open(streamID: 1, key: key, size: UInt64(size))
            guard
                case .upload(let session, let staging, let sha1, let recorded, _, _) =
                    await relay.policy.open(account: account, open: open, key: try ObjectKey(validating: key))
            else {
                Issue.record("\(key): not an upload")
                continue
            }
            let storage = UploadStorage(
                key: try ObjectKey(validating: key), account: account, overwrite: false, session: session, recorded: recorded,
                staging: staging, sha1: sha1, context: relay.connectionDependencies.storage, logger: Logger(label: "test")
            )
            // Chunks of 100,000 bytes (one straddles the probe's end), or of 64 KiB (one ends there).
            var offset = 0
            var chunks: [Frame.Chunk] = []
            while offset < size {
                let end = min(size, offset + chunkSize)
                chunks.append(ChunkPayload.seal(ByteBuffer(bytes: bytes[offset..<end]), streamID: 1, offset: UInt64(offset), deflate: false))
                offset = end
            }
            _ = await storage.perform(.write(chunks, at: 0))
            let hash = Frame.Hash(streamID: 1, size: UInt64(size), sha1: Self.digest(bytes))
            let outcome = await storage.perform(.commit(hash, written: Int64(size)))
            guard case .committed(.success(.stored)) = outcome else {
                Issue.record("\(key): \(outcome)")
                continue
            }
            let object = try await #require(try relay.catalog.object(account: "cam-7", key: key))
            #expect(object.probeSHA1 == (size > Self.probeLength ? Self.digest(Array(bytes.prefix(Self.probeLength))).hex : nil), "\(key)")
        }
    }
}
