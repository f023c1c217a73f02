import Foundation
import NIOCore
import Testing
import UploadChecksums
import UploadProtocol
@testable import UploadAgent
import UploadTestSupport

/// The agent's file source: any offset and length reads the file's bytes, and no byte past the size at open.
@Suite("File source")
struct FileSourceTests {
    @Test("reads at random offsets and lengths return the file's bytes (from a start offset, too)", arguments: [(7, 0), (8, 0), (9, 12_345)])
    func randomReads(seed: UInt64, start: Int) async throws {
        var rng = SeededGenerator(seed: seed)
        let directory = TemporaryDirectories.make()
        let file = makeFile(directory, "f.bin", size: 1_000_003, seed: seed)
        let source = FileSource(path: file.path, blockSize: 64 << 10, startOffset: UInt64(start))
        let info = try source.open()
        defer { source.close() }
        #expect(info.size == UInt64(file.data.count - start))
        #expect(info.fingerprint == FileSource.currentInfo(path: file.path)?.fingerprint || start > 0)
        let bytes = [UInt8](file.data.dropFirst(start))
        for _ in 0..<200 {
            let offset = Int(rng.next() % UInt64(bytes.count + 10))
            let length = Int(rng.next() % 100_000) + 1
            let read = try source.read(at: UInt64(offset), maxLength: length, allocator: ByteBufferAllocator())
            let expected = offset < bytes.count ? Array(bytes[offset..<min(bytes.count, offset + length)]) : []
            // A read may return fewer bytes than asked (the rest of its block), never others.
            #expect(read.readableBytes <= expected.count && read.readableBytes > 0 || expected.isEmpty)
            #expect(Array(read.readableBytesView) == Array(expected.prefix(read.readableBytes)), "at \(offset)")
        }
    }

    @Test("a block's memory is used again only once no chunk of it is alive: a chunk kept keeps its bytes")
    func blockReuse() async throws {
        let file = makeFile(TemporaryDirectories.make(), "v.bin", size: 4 << 16, seed: 11)
        let source = FileSource(path: file.path, blockSize: 1 << 16)
        _ = try source.open()
        defer { source.close() }
        let allocator = ByteBufferAllocator()
        // Kept, as a CHUNK waiting for the socket is: the next block must go elsewhere.
        let kept = try source.read(at: 0, maxLength: 1 << 16, allocator: allocator)
        let second = try source.read(at: 1 << 16, maxLength: 1 << 16, allocator: allocator)
        #expect(Array(kept.readableBytesView) == Array(file.data[0..<(1 << 16)]))
        #expect(Array(second.readableBytesView) == Array(file.data[(1 << 16)..<(2 << 16)]))
        // Let go, as a CHUNK sent is: the next read may reuse it, and still reads the right bytes.
        var third: ByteBuffer? = nil
        do {
            let dropped = try source.read(at: 2 << 16, maxLength: 1 << 16, allocator: allocator)
            #expect(dropped.readableBytes == 1 << 16)
        }
        third = try source.read(at: 3 << 16, maxLength: 1 << 16, allocator: allocator)
        #expect(third.map { Array($0.readableBytesView) } == Array(file.data[(3 << 16)..<(4 << 16)]))
        #expect(Array(second.readableBytesView) == Array(file.data[(1 << 16)..<(2 << 16)]))
    }

    @Test("a large file's blocks still in flight are read into again once their chunks are gone, never before")
    func blocksInFlightAreRecycled() async throws {
        let file = makeFile(TemporaryDirectories.make(), "big.bin", size: 6 << 20, seed: 13)
        let recycled = RecycledBlocks(capacity: 4)
        let source = FileSource(path: file.path, blockSize: 1 << 20, startOffset: 0, followSymlinks: false, recycled: recycled)
        _ = try source.open()
        defer { source.close() }
        let allocator = ByteBufferAllocator()
        func address(_ buffer: ByteBuffer) -> UInt? { buffer.withUnsafeReadableBytes { $0.baseAddress.map { UInt(bitPattern: $0) } } }
        func expectBlock(_ chunk: ByteBuffer?, _ index: Int) {
            #expect(chunk.map { Array($0.readableBytesView) } == Array(file.data[(index << 20)..<((index + 1) << 20)]), "block \(index)")
        }
        // Each read takes a whole block, kept as CHUNKs on their way are.
        var chunks: [ByteBuffer?] = try (0..<3).map { try source.read(at: UInt64($0) << 20, maxLength: 1 << 20, allocator: allocator) }
        let first = chunks[0].flatMap(address)
        let second = chunks[1].flatMap(address)
        #expect(recycled.count == 2, "blocks 0 and 1 wait, in flight")
        // Block 0's chunk is sent: the next block is read into its memory. Block 1's is not: it is left alone.
        chunks[0] = nil
        chunks.append(try source.read(at: 3 << 20, maxLength: 1 << 20, allocator: allocator))
        #expect(chunks[3].flatMap(address) == first, "block 3 reuses block 0's memory")
        #expect(chunks[3].flatMap(address) != second)
        expectBlock(chunks[1], 1)
        expectBlock(chunks[2], 2)
        expectBlock(chunks[3], 3)
        // Nothing free: a new block, and the bytes of every chunk kept stay theirs.
        chunks.append(try source.read(at: 4 << 20, maxLength: 1 << 20, allocator: allocator))
        let fresh = chunks[4].flatMap(address)
        #expect(fresh != first && fresh != second)
        for index in 1...4 { expectBlock(chunks[index], index) }
    }

    @Test(
        "files read one after another share recycled blocks: every read returns its own file's bytes, and a chunk kept from an earlier file keeps its own"
    )
    func recycledBlocks() async throws {
        let directory = TemporaryDirectories.make()
        let allocator = ByteBufferAllocator()
        var kept: [(ByteBuffer, Data)] = []
        for index in 0..<12 {
            let file = makeFile(directory, "f\(index)", size: (1 << 20) - index * 1000, seed: UInt64(40 + index))
            let source = FileSource(path: file.path)
            _ = try source.open()
            // Every other file's chunk is kept alive (a CHUNK not yet sent): its block must not be read into again.
            let whole = try source.read(at: 0, maxLength: 1 << 20, allocator: allocator)
            source.close()
            #expect(Array(whole.readableBytesView) == Array(file.data), "file \(index)")
            if index.isMultiple(of: 2) { kept.append((whole, file.data)) }
        }
        for (index, (chunk, data)) in kept.enumerated() {
            #expect(Array(chunk.readableBytesView) == Array(data), "kept chunk \(index) changed")
        }
        RecycledBlocks.shared.drain()
    }

    @Test("the read of a file's last bytes lets go of its block: an upload waiting for its commit holds no block")
    func lastReadLetsGoOfTheBlock() async throws {
        let file = makeFile(TemporaryDirectories.make(), "v.bin", size: 4 << 14, seed: 12)
        let source = FileSource(path: file.path, blockSize: 1 << 20)
        _ = try source.open()
        defer { source.close() }
        let allocator = ByteBufferAllocator()
        // One block holds the whole file; the reads after the first are slices of it.
        let first = try source.read(at: 0, maxLength: 1 << 14, allocator: allocator)
        let last = try source.read(at: 3 << 14, maxLength: 1 << 14, allocator: allocator)
        #expect(Array(first.readableBytesView) == Array(file.data[0..<(1 << 14)]))
        #expect(Array(last.readableBytesView) == Array(file.data[(3 << 14)...]))
        // New bytes in place of the old (same size): a block still held would return the old ones.
        let fresh = [UInt8](repeating: 0xA5, count: 1 << 14)
        let handle = try #require(FileHandle(forWritingAtPath: file.path))
        try handle.write(contentsOf: fresh)
        try handle.close()
        let again = try source.read(at: 0, maxLength: 1 << 14, allocator: allocator)
        #expect(again.readableBytesView.elementsEqual(fresh), "the block outlived the file's last read")
    }

    @Test("a read from the start with the probe's SHA-1 state (its first 256 KiB) hashes on from there: the whole SHA-1, once")
    func readAfterProbe() async throws {
        let file = makeFile(TemporaryDirectories.make(), "p.bin", size: 600_000, seed: 13)
        let bytes = [UInt8](file.data)
        let source = FileSource(path: file.path)
        let info = try source.open()
        defer { source.close() }
        var prefix = SHA1()
        prefix.update(bytes.prefix(Int(Frame.Open.probeLength)))
        let request = SourceReader.Request(
            streamID: 1, source: source, size: 600_000, offset: 0, budget: 600_000, chunkSize: 100_000, deflate: false, sha1: prefix,
            keepSnapshots: true, reopening: SourceReader.Reopening(fingerprint: info.fingerprint, limit: 1), corruptAt: nil
        )
        let batch = try SourceReader.read(request)
        #expect(batch.chunks.map(\.offset) == [0, 100_000, 200_000, 300_000, 400_000, 500_000])
        #expect(batch.sha1?.finalize() == SHA1.hash(bytes))
        // A snapshot is a resume point: only where the state covers exactly the bytes before it.
        #expect(batch.snapshots.map(\.0) == [300_000, 400_000, 500_000, 600_000])
        for (offset, state) in batch.snapshots {
            #expect(state.finalize() == SHA1.hash(bytes.prefix(Int(offset))), "snapshot at \(offset)")
        }
    }

    @Test(
        "a small file hashed for dedup keeps the bytes it was hashed from, and a read from them gives the chunks a read of the file gives; a larger one, or one that changed while read, keeps none"
    )
    func heldContent() async throws {
        try Self.withSource("small.jpg", size: 40_000, seed: 21) { directory, file, source in
            let prepared = try SourceReader.prepare(source, info: nil, knownSHA1: nil, dedup: true, reopenLimit: 1, journal: nil, hold: 64 << 10)
            let content = try #require(prepared.content)
            #expect(Array(content.readableBytesView) == [UInt8](file.data))
            #expect(prepared.sha1 == SHA1Digest(bytes: SHA1.hash([UInt8](file.data))))
            #expect(prepared.hashedBytes == 40_000)
            // Offsets inside the held bytes (a resume), in chunks: the same frames as from the file.
            let reopening = SourceReader.Reopening(fingerprint: prepared.info.fingerprint, limit: 1)
            var request = SourceReader.Request(
                streamID: 1, source: source, size: 40_000, offset: 12_000, budget: 40_000, chunkSize: 10_000, deflate: false, sha1: nil,
                keepSnapshots: false, reopening: reopening, corruptAt: nil
            )
            let fromFile = try SourceReader.read(request)
            request.held = content
            let fromHeld = try SourceReader.read(request)
            #expect(fromHeld.chunks.map(\.offset) == [12_000, 22_000, 32_000])
            #expect(fromHeld.chunks == fromFile.chunks)
            #expect(fromHeld.ended && fromHeld.nextOffset == 40_000)
            // Too large to hold: hashed, nothing kept.
            let large = makeFile(directory, "large.jpg", size: 70_000, seed: 22)
            let largeSource = FileSource(path: large.path)
            defer { largeSource.close() }
            let notHeld = try SourceReader.prepare(largeSource, info: nil, knownSHA1: nil, dedup: true, reopenLimit: 1, journal: nil, hold: 64 << 10)
            #expect(notHeld.content == nil && notHeld.sha1 != nil)
            // Changed since it was opened (grown after open): nothing kept, so the send reads it and finds the change.
            let changing = makeFile(directory, "changing.jpg", size: 30_000, seed: 23)
            let changingSource = FileSource(path: changing.path)
            defer { changingSource.close() }
            let info = try changingSource.open()
            let handle = try #require(FileHandle(forWritingAtPath: changing.path))
            try handle.seekToEnd()
            try handle.write(contentsOf: Data(repeating: 0x5A, count: 100))
            try handle.close()
            let changed = try SourceReader.prepare(
                changingSource, info: info, knownSHA1: nil, dedup: true, reopenLimit: 1, journal: nil, hold: 64 << 10)
            #expect(changed.content == nil)
        }
    }

    @Test(
        "a read whose budget is exactly the rest of a file ends it (HASH goes with the last bytes, not after a second read), and finds a change made since the open"
    )
    func budgetToTheEnd() async throws {
        try Self.withSource("thumb.jpg", size: 16_384, seed: 31) { _, file, source in
            let info = try source.open()
            func request(offset: UInt64, budget: Int, sha1: SHA1?) -> SourceReader.Request {
                SourceReader.Request(
                    streamID: 1, source: source, size: 16_384, offset: offset, budget: budget, chunkSize: 1 << 20, deflate: false, sha1: sha1,
                    keepSnapshots: false, reopening: SourceReader.Reopening(fingerprint: info.fingerprint, limit: 1), corruptAt: nil
                )
            }
            // The whole file in one budget: one read, ended, the SHA-1 of every byte.
            let whole = try SourceReader.read(request(offset: 0, budget: 16_384, sha1: SHA1()))
            #expect(whole.ended && whole.nextOffset == 16_384 && whole.chunks.map(\.offset) == [0])
            #expect(whole.sha1.flatMap { SHA1Digest(bytes: $0.finalize()) } == SHA1Digest(bytes: SHA1.hash([UInt8](file.data))))
            // In two budgets: the first does not end it, the second (exactly the rest) does.
            let first = try SourceReader.read(request(offset: 0, budget: 10_000, sha1: nil))
            #expect(!first.ended && first.nextOffset == 10_000)
            let rest = try SourceReader.read(request(offset: 10_000, budget: 6_384, sha1: nil))
            #expect(rest.ended && rest.nextOffset == 16_384 && rest.chunks.map(\.offset) == [10_000])
            // Rewritten in place since the open (same size, another time): the read that ends it refuses to.
            try Data(repeating: 0x42, count: 16_384).write(to: URL(fileURLWithPath: file.path))
            try FileManager.default.setAttributes([.modificationDate: Date(timeIntervalSince1970: 1_000_000)], ofItemAtPath: file.path)
            let error = #expect(throws: SourceError.self) { try SourceReader.read(request(offset: 0, budget: 16_384, sha1: nil)) }
            #expect(error?.description.contains("during the upload: not committed") == true)
        }
    }

    /// A file of `size` random bytes in a directory of its own, and its source, for `body`; closed and removed after.
    private static func withSource(
        _ name: String, size: Int, seed: UInt64,
        _ body: (_ directory: String, _ file: (path: String, data: Data), _ source: FileSource) throws -> Void
    ) throws {
        let directory = TemporaryDirectories.make()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let file = makeFile(directory, name, size: size, seed: seed)
        let source = FileSource(path: file.path)
        defer { source.close() }
        try body(directory, file, source)
    }

    @Test("a start offset past the end is refused with the sizes")
    func startPastEnd() async throws {
        let file = makeFile(TemporaryDirectories.make(), "short.bin", size: 100, seed: 3)
        let error = #expect(throws: SourceError.self) { try FileSource(path: file.path, startOffset: 101).open() }
        #expect(error?.description.contains("shorter than the start offset 101") == true)
    }

    @Test("a file that grows after open is read only up to its size at open")
    func grownFile() async throws {
        let directory = TemporaryDirectories.make()
        let file = makeFile(directory, "g.bin", size: 5000, seed: 9)
        let source = FileSource(path: file.path)
        _ = try source.open()
        defer { source.close() }
        let handle = FileHandle(forWritingAtPath: file.path)!
        handle.seekToEndOfFile()
        handle.write(Data(repeating: 0xEE, count: 10_000))
        handle.closeFile()
        let read = try source.read(at: 4000, maxLength: 1 << 20, allocator: ByteBufferAllocator())
        #expect(Array(read.readableBytesView) == Array(file.data[4000...]))
    }
}
