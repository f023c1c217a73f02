import CUploadSystem
import Foundation
import Logging
import NIOCore
import Testing
import UploadChecksums
import UploadProtocol
@testable import UploadRelay
@testable import UploadRelayBackends
@testable import UploadRelayLocalStore
@testable import UploadRelaySQLite
import UploadTestSupport

/// The local store and the relay's housekeeping, against a real file system.
@Suite("Local store")
struct StoreTests {
    @Test("commit makes the object appear whole under its key; staging is gone")
    func commit() async throws {
        let root = TemporaryDirectories.make()
        let store = try LocalDirectoryStore(root: root + "/store", stagingDirectory: root + "/staging")
        let staging = try await store.openStaging(.named("s1"))
        try await staging.write(ByteBuffer(string: "hello "), at: 0)
        try await staging.write(ByteBuffer(string: "world"), at: 6)
        let key = try ObjectKey(validating: "a/b/c.txt")
        #expect(!FileManager.default.fileExists(atPath: root + "/store/a1/a/b/c.txt"))
        _ = try await store.commit(staging, as: key, account: "a1")
        #expect(FileManager.default.contents(atPath: root + "/store/a1/a/b/c.txt") == Data("hello world".utf8))
        #expect(try await store.stagingFiles().isEmpty)
        #expect(try await store.identity(of: key, account: "a1")?.size == 11)
        #expect(try await store.identity(of: key, account: "a2") == nil)
    }

    @Test(
        "a group commit (its files synced at once): each object whole; one whose place another of the group took is refused, naming it, and nothing of it is visible"
    )
    func groupCommitConflicts() async throws {
        let root = TemporaryDirectories.make()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let store = try LocalDirectoryStore(root: root + "/store", stagingDirectory: root + "/staging")
        // x/y.bin makes x a folder before x comes; p comes before p/q.bin would need it as a folder.
        let keys = ["x/y.bin", "x", "p", "p/q.bin", "one.bin", "two/three.bin"]
        var items: [StoreCommit] = []
        for (index, key) in keys.enumerated() {
            let staging = try await store.openStaging(.named("g\(index)", expectedSize: 16 << 10, key: key))
            try await staging.write(ByteBuffer(bytes: [UInt8](repeating: UInt8(index), count: 16 << 10)), at: 0)
            items.append(StoreCommit(staging: staging, key: try ObjectKey(validating: key), account: "a1", sha1: nil))
        }
        let results = await store.commit(items)
        #expect(results.count == keys.count)
        for (index, key) in keys.enumerated() {
            switch (key, results[index]) {
            case ("x", .failure(let error)):
                #expect("\(error)".contains("folder"), "\(error)")
            case ("p/q.bin", .failure(let error)):
                #expect("\(error)".contains("p"), "\(error)")
                #expect(!FileManager.default.fileExists(atPath: root + "/store/a1/p/q.bin"))
            case (_, .success(let identity)):
                #expect(!["x", "p/q.bin"].contains(key), "\(key) was committed")
                #expect(FileManager.default.contents(atPath: root + "/store/a1/" + key) == Data(repeating: UInt8(index), count: 16 << 10))
                #expect(try await store.identity(of: ObjectKey(validating: key), account: "a1") == identity)
            case (_, .failure(let error)):
                Issue.record("\(key) failed: \(error)")
            }
        }
        // The refused ones' bytes are still staged (the session decides), never under a key.
        #expect(FileManager.default.contents(atPath: root + "/store/a1/x/y.bin") == Data(repeating: 0, count: 16 << 10))
        #expect(FileManager.default.contents(atPath: root + "/store/a1/p") == Data(repeating: 2, count: 16 << 10))
        #expect(try await store.stagingFiles().count == 2)
    }

    @Test(
        "startup recovery: a commit renamed but not recorded is recorded; one not renamed is given up; an object whose file is gone is forgotten (finding 12)"
    )
    func recovery() async throws {
        let root = TemporaryDirectories.make()
        let store = try LocalDirectoryStore(root: root + "/store", stagingDirectory: root + "/staging")
        let catalog = try SQLiteCatalog(path: root + "/catalog.sqlite")
        try await catalog.addAccount(name: "cam", tokenHash: [1], quota: 1000)
        // 1. Crash between the rename and the record.
        let renamed = try await store.openStaging(.named("s1"))
        try await renamed.write(ByteBuffer(string: "hello"), at: 0)
        let hello = SHA1Digest(bytes: SHA1.hash(Array("hello".utf8)))!.hex
        let first = PendingCommit(account: "cam", key: "a.txt", size: 5, sha1: hello, sessionID: nil)
        try await catalog.beginCommit(first)
        _ = try await store.commit(renamed, as: ObjectKey(validating: "a.txt"), account: "cam")
        // 2. Crash before the rename: the reservation must not outlive it.
        let second = PendingCommit(account: "cam", key: "b.txt", size: 900, sha1: hello, sessionID: nil)
        try await catalog.beginCommit(second)
        // 3. An object whose file went away.
        let gone = PendingCommit(account: "cam", key: "c.txt", size: 7, sha1: hello, sessionID: nil)
        try await catalog.beginCommit(gone)
        try await catalog.finishCommit(gone, identity: ObjectIdentity(device: 0, inode: 0, size: 7, modified: 0))
        var quiet = Logger(label: "test")
        quiet.logLevel = .critical
        try await RelayRuntime.recover(catalog: catalog, store: store, logger: quiet)
        let a = try await #require(try catalog.object(account: "cam", key: "a.txt"))
        #expect(a.identity == (try await store.identity(of: ObjectKey(validating: "a.txt"), account: "cam")))
        #expect(try await catalog.object(account: "cam", key: "b.txt") == nil)
        #expect(try await catalog.object(account: "cam", key: "c.txt") == nil)
        #expect(try await catalog.pendingCommits().isEmpty)
        #expect(try await catalog.account(named: "cam")?.usedBytes == 5)
        #expect(try await catalog.quotaUse(account: "cam", excludingKey: "x").left == 995)
    }

    @Test("a resume needs its staging file with at least the durable bytes; a missing one is never recreated as zeros")
    func resumeNeedsStaging() async throws {
        let root = TemporaryDirectories.make()
        let store = try LocalDirectoryStore(root: root + "/store", stagingDirectory: root + "/staging")
        await #expect(throws: StoreError.self) { try await store.openStaging(.named("gone", offset: 4096)) }
        #expect(!FileManager.default.fileExists(atPath: root + "/staging/gone"))
        let staging = try await store.openStaging(.named("short"))
        try await staging.write(ByteBuffer(string: "abc"), at: 0)
        staging.close()
        await #expect(throws: StoreError.self) { try await store.openStaging(.named("short", offset: 10)) }
        let resumed = try await store.openStaging(.named("short", offset: 2))
        resumed.close()
        #expect(FileManager.default.contents(atPath: root + "/staging/short") == Data("ab".utf8))
    }

    @Test("a symbolic link inside the store cannot lead a key outside it")
    func symlinkEscape() async throws {
        let root = TemporaryDirectories.make()
        let outside = TemporaryDirectories.make()
        let store = try LocalDirectoryStore(root: root + "/store", stagingDirectory: root + "/staging")
        try FileManager.default.createDirectory(atPath: root + "/store/a1", withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: root + "/store/a1/evil", withDestinationPath: outside)
        let staging = try await store.openStaging(.named("s"))
        try await staging.write(ByteBuffer(string: "x"), at: 0)
        await #expect(throws: StoreError.self) { try await store.commit(staging, as: try ObjectKey(validating: "evil/file"), account: "a1") }
        #expect(!FileManager.default.fileExists(atPath: outside + "/file"))
    }
}

/// Staging writes with direct I/O: whatever the sizes, syncs and resume points, the committed bytes are the bytes written.
@Suite("Staging with direct I/O")
struct DirectStagingTests {
    /// Writes `data` in random pieces with random syncs, through a store with a small direct buffer.
    func stage(_ data: [UInt8], from start: Int = 0, into staging: any StagingFile, rng: inout SeededGenerator) async throws {
        var offset = start
        while offset < data.count {
            let n = min(data.count - offset, Int(rng.next() % 20_000) + 1)
            try await staging.write(ByteBuffer(bytes: data[offset..<offset + n]), at: Int64(offset))
            offset += n
            if rng.next() % 4 == 0 { try await staging.sync() }
        }
    }

    /// A store in a fresh directory: `root/store`, staging in `root/staging`.
    static func makeStore(directBuffer: Int = LocalDirectoryStore.defaultDirectBuffer) throws -> (String, LocalDirectoryStore) {
        let root = TemporaryDirectories.make()
        return (root, try LocalDirectoryStore(root: root + "/store", stagingDirectory: root + "/staging", directBuffer: directBuffer))
    }

    /// Whether the file system of `directory` opens files with O_DIRECT, asked without the store's code.
    static func supportsDirectIO(_ directory: String) -> Bool {
        let probe = directory + "/direct-probe"
        let fd = open(probe, O_RDWR | O_CREAT | upload_o_direct_flag(), 0o600)
        defer { unlink(probe) }
        guard fd >= 0, upload_o_direct_flag() != 0 else { return false }
        close(fd)
        return true
    }

    func randomBytes(_ count: Int, _ rng: inout SeededGenerator) -> [UInt8] {
        (0..<count).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
    }

    @Test("random pieces and syncs, then commit: the object is exactly the bytes, and the writes went direct", arguments: [1, 2, 3])
    func randomPieces(seed: UInt64) async throws {
        var rng = SeededGenerator(seed: seed)
        let (root, store) = try Self.makeStore(directBuffer: 64 << 10)
        let data = self.randomBytes(300_000 + Int(rng.next() % 10_000), &rng)
        let staging = try await store.openStaging(.named("s"))
        // Where the file system takes O_DIRECT, the staging file must really use it (elsewhere it falls back).
        #expect((staging as? LocalStagingFile)?.isDirect == Self.supportsDirectIO(root), "direct I/O not in use in \(root)")
        try await self.stage(data, into: staging, rng: &rng)
        _ = try await store.commit(staging, as: ObjectKey(validating: "o.bin"), account: "a1")
        #expect(FileManager.default.contents(atPath: root + "/store/a1/o.bin") == Data(data))
    }

    @Test("a resume inside a block keeps the durable bytes before it and the object is whole", arguments: [4, 5, 6])
    func resumeInsideBlock(seed: UInt64) async throws {
        var rng = SeededGenerator(seed: seed)
        let (root, store) = try Self.makeStore(directBuffer: 64 << 10)
        let data = self.randomBytes(200_000, &rng)
        let durable = 4096 * 17 + 1 + Int(rng.next() % 4000)
        // First run: the durable prefix, synced; then bytes that were never acknowledged, then the connection dies.
        let first = try await store.openStaging(.named("s"))
        try await self.stage(Array(data[..<durable]), into: first, rng: &rng)
        try await first.sync()
        try await first.write(ByteBuffer(bytes: self.randomBytes(10_000, &rng)), at: Int64(durable))
        first.close()
        try await self.resumeAndCommit(store, root: root, data, durable: durable, rng: &rng)
    }

    /// Reopens staging file "s" at `durable`, writes the rest of `data` and commits: the object must be `data`.
    func resumeAndCommit(_ store: LocalDirectoryStore, root: String, _ data: [UInt8], durable: Int, rng: inout SeededGenerator) async throws {
        // The resume cuts back to the durable offset and goes on from there.
        let resumed = try await store.openStaging(.named("s", offset: Int64(durable)))
        #expect((resumed as? LocalStagingFile)?.isDirect == Self.supportsDirectIO(root))
        try await self.stage(data, from: durable, into: resumed, rng: &rng)
        _ = try await store.commit(resumed, as: ObjectKey(validating: "o.bin"), account: "a1")
        #expect(FileManager.default.contents(atPath: root + "/store/a1/o.bin") == Data(data))
    }

    @Test(
        "direct writes: each open upload holds one block between writes, whatever its size, and the writes borrow shared buffers; 40 uploads written in odd pieces, interleaved, are each exact"
    )
    func directTailPerUpload() async throws {
        var rng = SeededGenerator(seed: 17)
        let (root, store) = try Self.makeStore(directBuffer: 1 << 20)
        let direct = Self.supportsDirectIO(root)
        var files: [(LocalStagingFile, [UInt8])] = []
        for index in 0..<40 {
            let staging = try await store.openStaging(.named("s\(index)")) as! LocalStagingFile
            files.append((staging, self.randomBytes((1 << 20) + Int(rng.next() % 50_000), &rng)))
        }
        var written = [Int](repeating: 0, count: files.count)
        while let index = written.indices.filter({ written[$0] < files[$0].1.count }).randomElement(using: &rng) {
            let (staging, data) = files[index]
            let length = min(data.count - written[index], Int(rng.next() % 300_000) + 1)
            try await staging.write(ByteBuffer(bytes: data[written[index]..<(written[index] + length)]), at: Int64(written[index]))
            written[index] += length
            #expect(staging.directBufferBytes == (direct ? LocalStagingFile.block : 0))
        }
        #expect(DirectScratch.idleCount <= DirectScratch.maxIdle)
        for (index, (staging, data)) in files.enumerated() {
            try await staging.sync()
            _ = try await store.commit(staging, as: ObjectKey(validating: "f\(index)"), account: "a1")
            #expect(FileManager.default.contents(atPath: root + "/store/a1/f\(index)") == Data(data), "f\(index)")
        }
    }

    @Test("an upload that announces fewer bytes than the direct buffer writes through the page cache; one of unknown size or more goes direct")
    func smallAnnouncedUploadsSkipDirectIO() async throws {
        let (root, store) = try Self.makeStore(directBuffer: 1 << 20)
        let direct = Self.supportsDirectIO(root)
        let small = try await store.openStaging(.named("small", expectedSize: 16_384)) as! LocalStagingFile
        let unknown = try await store.openStaging(.named("unknown", expectedSize: nil)) as! LocalStagingFile
        let large = try await store.openStaging(.named("large", expectedSize: 1 << 20)) as! LocalStagingFile
        #expect(!small.isDirect)
        #expect(unknown.isDirect == direct && large.isDirect == direct)
        let bytes = (0..<16_384).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        try await small.write(ByteBuffer(bytes: bytes), at: 0)
        _ = try await store.commit(small, as: ObjectKey(validating: "photos/small.jpg"), account: "a1")
        #expect(FileManager.default.contents(atPath: root + "/store/a1/photos/small.jpg") == Data(bytes))
        unknown.close()
        large.close()
    }

    @Test("a crash after a sync leaves a padded file; the resume cuts it to the durable offset and the object is whole")
    func crashAfterSync() async throws {
        var rng = SeededGenerator(seed: 11)
        let (root, store) = try Self.makeStore(directBuffer: 64 << 10)
        let data = self.randomBytes(150_000, &rng)
        let durable = 4096 * 9 + 1234
        let first = try await store.openStaging(.named("s"))
        try await first.write(ByteBuffer(bytes: data[..<durable]), at: 0)
        try await first.sync()
        try await first.write(ByteBuffer(bytes: self.randomBytes(70_000, &rng)), at: Int64(durable))
        // What the disk holds at this moment is what a kill -9 leaves: keep it, and put it back after close.
        let path = root + "/staging/s"
        let onDisk = FileManager.default.contents(atPath: path)!
        #expect(onDisk.count >= durable && onDisk.prefix(durable) == Data(data[..<durable]))
        first.close()
        #expect(FileManager.default.createFile(atPath: path, contents: onDisk))
        try await self.resumeAndCommit(store, root: root, data, durable: durable, rng: &rng)
    }

    @Test("after seal or close a staging file refuses writes and syncs instead of pretending")
    func noUseAfterSealOrClose() async throws {
        let (root, store) = try Self.makeStore()
        let sealed = try await store.openStaging(.named("a"))
        try await sealed.write(ByteBuffer(string: "abc"), at: 0)
        _ = try await store.commit(sealed, as: ObjectKey(validating: "a.txt"), account: "a1")
        await #expect(throws: StoreError.self) { try await sealed.write(ByteBuffer(string: "d"), at: 3) }
        let closed = try await store.openStaging(.named("b"))
        closed.close()
        await #expect(throws: StoreError.self) { try await closed.sync() }
        #expect(FileManager.default.contents(atPath: root + "/store/a1/a.txt") == Data("abc".utf8))
    }

    @Test("a write out of order turns the file to plain writes, with the same bytes")
    func outOfOrder() async throws {
        let (root, store) = try Self.makeStore(directBuffer: 8192)
        let staging = try await store.openStaging(.named("s"))
        try await staging.write(ByteBuffer(repeating: 0x61, count: 10_000), at: 0)
        try await staging.write(ByteBuffer(repeating: 0x62, count: 100), at: 50)
        #expect((staging as? LocalStagingFile)?.isDirect == false)
        try await staging.write(ByteBuffer(repeating: 0x63, count: 5), at: 10_000)
        _ = try await store.commit(staging, as: ObjectKey(validating: "o.bin"), account: "a1")
        var expected = [UInt8](repeating: 0x61, count: 10_005)
        expected.replaceSubrange(50..<150, with: repeatElement(0x62, count: 100))
        expected.replaceSubrange(10_000..<10_005, with: repeatElement(0x63, count: 5))
        #expect(FileManager.default.contents(atPath: root + "/store/a1/o.bin") == Data(expected))
    }
}
