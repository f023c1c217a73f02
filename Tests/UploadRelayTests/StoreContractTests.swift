import Foundation
import NIOCore
import NIOPosix
import Testing
import UploadChecksums
import UploadProtocol
import UploadRelayLocalStore
import UploadRelayS3Store
import UploadS3
import UploadTestSupport

@testable import UploadRelay
import UploadRelayTesting

/// One suite, every store: each test runs against the local directory, the S3 store (on the SeaweedFS tools/test
/// starts; each test gets a bucket of its own) and the in-memory store. What one answers, the others must, as far as
/// their capabilities say.
@Suite("Store contract: local directory, S3 and in memory")
struct StoreContractTests {
    enum Backend: String, CaseIterable, Sendable, CustomStringConvertible {
        case local, s3, memory
        var description: String { self.rawValue }
    }

    /// A fresh, empty store of `backend`, whatever it made removed after `body`.
    static func withStore(_ backend: Backend, _ body: (any BlobStore) async throws -> Void) async throws {
        switch backend {
        case .local:
            let directory = TemporaryDirectories.make(prefix: "upload-store-")
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let store = try LocalDirectoryStore(root: directory + "/store", stagingDirectory: directory + "/staging")
            try await body(store)
        case .memory:
            let store = InMemoryStore()
            try await body(store)
        case .s3:
            try await S3TestServer.withBucket { client, bucket in
                let directory = TemporaryDirectories.make(prefix: "upload-store-s3-")
                defer { try? FileManager.default.removeItem(atPath: directory) }
                // The ledger the relay's catalog keeps, so that the store lists the multipart uploads it began.
                let store = try S3Store(
                    client: client, bucket: bucket, prefix: "relay", spoolDirectory: directory + "/spool", ledger: InMemoryCatalog())
                try await body(store)
            }
        }
    }

    static func bytes(_ count: Int, seed: UInt8) -> [UInt8] {
        (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ Int(seed) &* 7 &+ ($0 >> 9)) }
    }

    static func write(_ bytes: [UInt8], to staging: any StagingFile, at offset: Int64, piece: Int = 100_000) async throws {
        var position = 0
        while position < bytes.count {
            let end = min(bytes.count, position + piece)
            try await staging.write(ByteBuffer(bytes: bytes[position..<end]), at: offset + Int64(position))
            position = end
        }
    }

    static func sha1(_ bytes: [UInt8]) -> SHA1Digest? {
        var sha1 = SHA1()
        bytes.withUnsafeBytes { sha1.update($0) }
        return SHA1Digest(bytes: sha1.finalize())
    }

    static func key(_ value: String) throws -> ObjectKey { try ObjectKey(validating: value) }

    /// Stages `bytes` for `key` under a new name and commits them.
    @discardableResult
    static func store(_ bytes: [UInt8], as key: String, account: String = "a1", in store: any BlobStore) async throws -> ObjectIdentity {
        let request = try StagingRequest.named(UUID().uuidString, expectedSize: Int64(bytes.count), account: account, key: key)
        let staging = try await store.openStaging(request)
        try await Self.write(bytes, to: staging, at: 0)
        return try await store.commit(staging, as: Self.key(key), account: account)
    }

    @Test(
        "a staging written in pieces and committed is the object, byte for byte: its identity, SHA-1 and location answer, and the staging is gone",
        arguments: Backend.allCases)
    func commit(_ backend: Backend) async throws {
        try await Self.withStore(backend) { store in
            let bytes = Self.bytes(300_000, seed: 1)
            let staging = try await store.openStaging(.named("s1", expectedSize: Int64(bytes.count), key: "photos/a.jpg"))
            try await Self.write(bytes, to: staging, at: 0, piece: 65_536)
            #expect(try await store.identity(of: Self.key("photos/a.jpg"), account: "a1") == nil, "an object before its commit")
            let identity = try await store.commit(staging, as: Self.key("photos/a.jpg"), account: "a1")
            #expect(identity.size == Int64(bytes.count))
            #expect(try await store.identity(of: Self.key("photos/a.jpg"), account: "a1") == identity)
            #expect(try await store.contentSHA1(of: Self.key("photos/a.jpg"), account: "a1") == Self.sha1(bytes))
            #expect(try store.location(of: Self.key("photos/a.jpg"), account: "a1").hasSuffix("a1/photos/a.jpg"))
            #expect(try await !store.hasStaging(staging.name))
            #expect(try await store.conflict(for: Self.key("photos/b.jpg"), account: "a1") == nil)
        }
    }

    @Test(
        "a resume: the bytes a sync made durable are there when the staging is opened again at their offset, what came after them is not, and the object is exact",
        arguments: Backend.allCases)
    func resume(_ backend: Backend) async throws {
        try await Self.withStore(backend) { store in
            // Past S3's least part (5 MiB), so that its sync makes a part.
            let bytes = Self.bytes(7 << 20, seed: 2)
            let durable = 6 << 20
            let first = try await store.openStaging(.named("s2", expectedSize: Int64(bytes.count), key: "videos/v.mp4"))
            try await Self.write(Array(bytes[0..<durable]), to: first, at: 0, piece: 1 << 20)
            guard case .durable(let parts) = try await first.sync(through: Int64(durable)) else {
                Issue.record("a sync through a whole part kept its bytes back")
                return
            }
            // Written after the sync, never acknowledged, and past the blob's end: a resume cuts them, and writes again.
            try await first.write(ByteBuffer(bytes: [UInt8](repeating: 0xEE, count: bytes.count - durable + 4096)), at: Int64(durable))
            let name = first.name
            first.close()
            let again = try await store.openStaging(
                StagingRequest(
                    name: name, account: "a1", key: Self.key("videos/v.mp4"), expectedSize: Int64(bytes.count),
                    layout: .sequential(offset: Int64(durable), parts: parts)
                )
            )
            try await Self.write(Array(bytes[durable...]), to: again, at: Int64(durable), piece: 300_000)
            _ = try await store.commit(again, as: Self.key("videos/v.mp4"), account: "a1")
            #expect(try await store.contentSHA1(of: Self.key("videos/v.mp4"), account: "a1") == Self.sha1(bytes))
        }
    }

    @Test("a resume beyond what the staging holds, or of a staging that is gone, throws StoreError and places nothing", arguments: Backend.allCases)
    func resumeRefused(_ backend: Backend) async throws {
        try await Self.withStore(backend) { store in
            let staging = try await store.openStaging(.named("s3"))
            try await staging.write(ByteBuffer(bytes: Self.bytes(10, seed: 3)), at: 0)
            // A file makes them durable; S3 keeps them back (under a part): either way, 20 bytes are not there.
            _ = try await staging.sync(through: 10)
            let name = staging.name
            staging.close()
            await #expect(throws: StoreError.self) { try await store.openStaging(.named(name, offset: 20)) }
            await #expect(throws: StoreError.self) { try await store.openStaging(.named("never-made", offset: 4096)) }
            #expect(try await store.identity(of: Self.key("staged.bin"), account: "a1") == nil)
        }
    }

    @Test("a staging opened again at offset 0 starts over: nothing of what it held reaches the object", arguments: Backend.allCases)
    func startOver(_ backend: Backend) async throws {
        try await Self.withStore(backend) { store in
            let old = try await store.openStaging(.named("s4"))
            try await old.write(ByteBuffer(bytes: Self.bytes(50_000, seed: 4)), at: 0)
            _ = try await old.sync(through: 50_000)
            let name = old.name
            old.close()
            let fresh = try await store.openStaging(.named(name))
            let bytes = Self.bytes(1000, seed: 5)
            try await fresh.write(ByteBuffer(bytes: bytes), at: 0)
            _ = try await store.commit(fresh, as: Self.key("staged.bin"), account: "a1")
            #expect(try await store.contentSHA1(of: Self.key("staged.bin"), account: "a1") == Self.sha1(bytes))
            #expect(try await store.identity(of: Self.key("staged.bin"), account: "a1")?.size == 1000)
        }
    }

    @Test(
        "replacing an object gives a new identity; a copy (dedup) is made only from the object it was verified as; removal leaves nothing, twice",
        arguments: Backend.allCases)
    func duplicateReplaceRemove(_ backend: Backend) async throws {
        try await Self.withStore(backend) { store in
            let first = Self.bytes(20_000, seed: 6)
            let identity = try await Self.store(first, as: "a.bin", in: store)
            let copy = try await store.duplicate(Self.key("a.bin"), expected: identity, as: Self.key("copy/b.bin"), account: "a1")
            #expect(copy.size == identity.size)
            #expect(try await store.identity(of: Self.key("copy/b.bin"), account: "a1") == copy)
            #expect(try await store.contentSHA1(of: Self.key("copy/b.bin"), account: "a1") == Self.sha1(first))

            let second = Self.bytes(20_000, seed: 7)
            let replaced = try await Self.store(second, as: "a.bin", in: store)
            #expect(replaced != identity)
            #expect(try await store.contentSHA1(of: Self.key("a.bin"), account: "a1") == Self.sha1(second))
            // Verified as the first version: the copy is refused, and places nothing.
            await #expect(throws: StoreError.self) {
                try await store.duplicate(Self.key("a.bin"), expected: identity, as: Self.key("c.bin"), account: "a1")
            }
            #expect(try await store.identity(of: Self.key("c.bin"), account: "a1") == nil)

            try await store.removeObject(Self.key("a.bin"), account: "a1")
            #expect(try await store.identity(of: Self.key("a.bin"), account: "a1") == nil)
            #expect(try await store.contentSHA1(of: Self.key("a.bin"), account: "a1") == nil)
            try await store.removeObject(Self.key("a.bin"), account: "a1")
            #expect(try await store.identity(of: Self.key("copy/b.bin"), account: "a1") == copy)
        }
    }

    @Test("two accounts with the same key each hold their own bytes; removing one's leaves the other's", arguments: Backend.allCases)
    func accounts(_ backend: Backend) async throws {
        try await Self.withStore(backend) { store in
            let mine = Self.bytes(5000, seed: 8)
            let theirs = Self.bytes(7000, seed: 9)
            try await Self.store(mine, as: "same/key.jpg", account: "alice", in: store)
            try await Self.store(theirs, as: "same/key.jpg", account: "bob", in: store)
            #expect(try await store.contentSHA1(of: Self.key("same/key.jpg"), account: "alice") == Self.sha1(mine))
            #expect(try await store.contentSHA1(of: Self.key("same/key.jpg"), account: "bob") == Self.sha1(theirs))
            #expect(
                try store.location(of: Self.key("same/key.jpg"), account: "alice") != store.location(of: Self.key("same/key.jpg"), account: "bob"))
            try await store.removeObject(Self.key("same/key.jpg"), account: "alice")
            #expect(try await store.identity(of: Self.key("same/key.jpg"), account: "alice") == nil)
            #expect(try await store.identity(of: Self.key("same/key.jpg"), account: "bob")?.size == 7000)
        }
    }

    @Test(
        "a group commit answers each item in order, each the identity the store then reports (20 items: more than an S3 store makes at once)",
        arguments: Backend.allCases)
    func groupCommit(_ backend: Backend) async throws {
        try await Self.withStore(backend) { store in
            var items: [StoreCommit] = []
            var contents: [[UInt8]] = []
            for index in 0..<20 {
                let bytes = Self.bytes(1000 * (index + 1), seed: UInt8(10 + index))
                let staging = try await store.openStaging(.named("g\(index)", expectedSize: Int64(bytes.count), key: "group/\(index).bin"))
                try await staging.write(ByteBuffer(bytes: bytes), at: 0)
                items.append(StoreCommit(staging: staging, key: try Self.key("group/\(index).bin"), account: "a1", sha1: Self.sha1(bytes)))
                contents.append(bytes)
            }
            let results = await store.commit(items)
            #expect(results.count == 20)
            for (index, result) in results.enumerated() {
                let identity = try result.get()
                #expect(identity.size == Int64(contents[index].count))
                #expect(try await store.identity(of: Self.key("group/\(index).bin"), account: "a1") == identity)
                #expect(try await store.contentSHA1(of: Self.key("group/\(index).bin"), account: "a1") == Self.sha1(contents[index]))
            }
        }
    }

    @Test(
        "a store commits only the stagings it opened: another store's, even of the same kind, is refused and places nothing",
        arguments: Backend.allCases)
    func foreignStaging(_ backend: Backend) async throws {
        try await Self.withStore(backend) { store in
            try await Self.withStore(backend) { other in
                let bytes = Self.bytes(1000, seed: 9)
                let staging = try await other.openStaging(.named("s9", expectedSize: Int64(bytes.count), key: "x.jpg"))
                try await Self.write(bytes, to: staging, at: 0)
                await #expect(throws: StoreError.self) { try await store.commit(staging, as: Self.key("x.jpg"), account: "a1") }
                #expect(try await store.identity(of: Self.key("x.jpg"), account: "a1") == nil)
                // The store that opened it still commits it.
                let identity = try await other.commit(staging, as: Self.key("x.jpg"), account: "a1")
                #expect(identity.size == Int64(bytes.count))
            }
        }
    }

    @Test("a removed staging is gone, and removing one that is missing is fine", arguments: Backend.allCases)
    func removeStaging(_ backend: Backend) async throws {
        try await Self.withStore(backend) { store in
            let staging = try await store.openStaging(.named("r1", expectedSize: 6 << 20))
            try await Self.write(Self.bytes(6 << 20, seed: 13), to: staging, at: 0, piece: 1 << 20)
            _ = try await staging.sync(through: 6 << 20)
            let name = staging.name
            staging.close()
            #expect(try await store.hasStaging(name), "a staging with durable bytes is not there: \(name)")
            try await store.removeStaging(name)
            #expect(try await !store.hasStaging(name))
            try await store.removeStaging(name)
            try await store.removeStaging("never-made")
        }
    }

    @Test(
        "stripes, where the store takes them: handles write their stripes at their offsets, the bytes read back whole, and commit as one object; elsewhere a striped staging is refused",
        arguments: Backend.allCases)
    func stripes(_ backend: Backend) async throws {
        try await Self.withStore(backend) { store in
            let bytes = Self.bytes(3000, seed: 14)
            let striped = try StagingRequest(
                name: "striped", account: "a1", key: Self.key("big.bin"), expectedSize: 3000, layout: .striped(size: 3000, creating: true)
            )
            guard store.capabilities.stripes else {
                await #expect(throws: StoreError.self) { try await store.openStaging(striped) }
                return
            }
            let main = try await store.openStaging(striped)
            var other = striped
            other.layout = .striped(size: 3000, creating: false)
            let part = try await store.openStaging(other)
            try await part.write(ByteBuffer(bytes: bytes[2000..<3000]), at: 2000)
            try await main.write(ByteBuffer(bytes: bytes[0..<1000]), at: 0)
            try await part.write(ByteBuffer(bytes: bytes[1000..<2000]), at: 1000)
            try await part.sync()
            try await main.sync()
            part.close()
            let back = try await main.read(3000, at: 0)
            #expect(back.readableBytes == 3000 && Array(back.readableBytesView) == bytes)
            _ = try await store.commit(main, as: Self.key("big.bin"), account: "a1")
            #expect(try await store.contentSHA1(of: Self.key("big.bin"), account: "a1") == Self.sha1(bytes))
            var gone = striped
            gone.name = "never-made"
            gone.layout = .striped(size: 3000, creating: false)
            await #expect(throws: StoreError.self) { try await store.openStaging(gone) }
        }
    }
}
