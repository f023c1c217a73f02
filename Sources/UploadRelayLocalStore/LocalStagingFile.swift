#if canImport(Glibc)
import UploadRelay
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import CUploadSystem
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// A staging file: writes at offsets, fsync on demand. Used by one stream at a time (its calls are serial). Its
/// system calls run on the store's thread pool: a caller's task waits for them without holding its thread.
///
/// With direct I/O (`O_DIRECT`) the bytes bypass the page cache: each write goes to the disk at once in whole
/// blocks, through an aligned buffer borrowed from ``DirectScratch`` for that write, and the last partial block
/// waits in a block of the file's own until the next write; ``sync()`` writes it padded with zeros. So an open
/// upload holds one block, whatever its size, and the buffers follow the writes under way. ``seal()`` cuts
/// the file to the bytes written before commit. A buffered write pays a copy into the page cache, the largest cost per
/// byte after SHA-1, for bytes that are read again only if the relay restarts. Direct I/O needs writes in order; the
/// first write elsewhere, or a file system that refuses it, turns the file back to plain writes, with the same bytes
/// and durability.
final class LocalStagingFile: StagingFile, @unchecked Sendable {
    /// Offsets, lengths and buffer addresses of direct writes are multiples of this.
    static let block = 4096

    private static func roundDown<T: BinaryInteger>(_ value: T) -> T { value / T(Self.block) * T(Self.block) }
    private static func roundUp(_ value: Int) -> Int { Self.roundDown(value + Self.block - 1) }

    let name: String
    let path: String
    /// The staging directory: synced by the first ``sync()`` of a new file, so that its name survives a crash.
    private let directory: String
    /// Whether the file's name is durable in ``directory`` (a file reopened for a resume; a new one after its first sync).
    private var nameIsDurable: Bool
    private var descriptor: Int32
    /// One past the last byte written: the size the file has at commit.
    private(set) var end: Int64
    /// Present while writes go direct.
    private var direct: DirectTail?
    /// Set by the first failed call, by ``seal()`` and by ``close()``: every later write, sync or seal throws it.
    /// After a failure the buffer and the file may disagree about what was written, so nothing more is trusted;
    /// the upload goes on, if at all, from its durable offset in a newly opened staging file.
    private var unusable: StoreError?
    /// The most bytes one direct write takes (the size of the scratch buffers it borrows).
    private let directCapacity: Int
    /// Where its blocking calls run.
    private let threadPool: NIOThreadPool
    /// Its store's record of its open stagings, which this one leaves when freed.
    private let registry: StagingRegistry<LocalStagingFile>

    /// Bytes in `[start, start + fill)` of the file, fewer than a block, not yet on disk; `start` is block-aligned.
    private struct DirectTail {
        /// One block, aligned.
        var memory: UnsafeMutableRawPointer
        var start: Int64
        var fill: Int
    }

    /// `offset` is where the file ends now (what ``LocalDirectoryStore/openStaging(_:)`` cut it to).
    /// `directBuffer` > 0 asks for direct I/O through a buffer of that many bytes, rounded up to whole blocks.
    init(
        name: String, path: String, directory: String, descriptor: Int32, offset: Int64, directBuffer: Int, nameIsDurable: Bool,
        threadPool: NIOThreadPool, registry: StagingRegistry<LocalStagingFile>
    ) {
        self.threadPool = threadPool
        self.registry = registry
        self.name = name
        self.path = path
        self.directory = directory
        self.nameIsDurable = nameIsDurable
        self.descriptor = descriptor
        self.end = offset
        self.directCapacity = max(2 * Self.block, Self.roundUp(directBuffer))
        if directBuffer > 0 {
            self.direct = Self.startDirect(descriptor: descriptor, at: offset)
        }
    }

    deinit {
        self.close()
        self.registry.forget(ObjectIdentifier(self))
    }

    /// Whether writes currently bypass the page cache.
    var isDirect: Bool { self.direct != nil }

    /// The memory this file holds for direct writes between them (0 without direct I/O): one block.
    var directBufferBytes: Int { self.direct == nil ? 0 : Self.block }

    private static func startDirect(descriptor: Int32, at offset: Int64) -> DirectTail? {
        let flag = upload_o_direct_flag()
        let flags = fcntl(descriptor, F_GETFL)
        guard flag != 0, flags >= 0, fcntl(descriptor, F_SETFL, flags | flag) == 0 else { return nil }
        let capacity = Self.block
        var memory: UnsafeMutableRawPointer? = nil
        guard posix_memalign(&memory, Self.block, capacity) == 0, let memory else {
            Self.clearDirectFlag(descriptor)
            return nil
        }
        let start = Self.roundDown(offset)
        let fill = Int(offset - start)
        if fill > 0 {
            // A resume inside a block: the block's first bytes are on disk; read them so the block is written whole again.
            var got = 0
            repeat { got = pread(descriptor, memory, Self.block, off_t(start)) } while got < 0 && errno == EINTR
            guard got >= fill else {
                free(memory)
                Self.clearDirectFlag(descriptor)
                return nil
            }
        }
        return DirectTail(memory: memory, start: start, fill: fill)
    }

    private static func clearDirectFlag(_ descriptor: Int32) {
        let flags = fcntl(descriptor, F_GETFL)
        if flags >= 0 { _ = fcntl(descriptor, F_SETFL, flags & ~upload_o_direct_flag()) }
    }

    func write(_ bytes: ByteBuffer, at offset: Int64) async throws {
        try await self.threadPool.runBlocking {
            try self.guardingUse { try self.write0(bytes, at: offset) }
        }
    }

    /// Runs `body` unless the file is unusable; makes it unusable when `body` throws.
    private func guardingUse(_ body: () throws -> Void) throws {
        if let unusable = self.unusable { throw unusable }
        do {
            try body()
        } catch {
            let isNoSpace = (error as? StoreError)?.isNoSpace ?? false
            self.unusable = StoreError("\(self.path) is unusable after an earlier failure: \(error)", isNoSpace: isNoSpace)
            throw error
        }
    }

    private func write0(_ bytes: ByteBuffer, at offset: Int64) throws {
        if self.direct != nil && offset != self.end {
            // Direct writes go in order; anything else goes through the page cache from now on.
            try self.leaveDirect()
        }
        try bytes.withUnsafeReadableBytes { raw in
            var done = 0
            while done < raw.count, let tail = self.direct {
                // One direct write: the tail, then as many new bytes as a scratch buffer holds; whole blocks go to
                // the disk, what is left of a block becomes the tail.
                let n = min(raw.count - done, self.directCapacity - tail.fill)
                let total = tail.fill + n
                let whole = Self.roundDown(total)
                if whole == 0 {
                    (tail.memory + tail.fill).copyMemory(from: raw.baseAddress! + done, byteCount: n)
                    self.direct?.fill = total
                    done += n
                    continue
                }
                let code = DirectScratch.with(capacity: self.directCapacity) { scratch -> Int32 in
                    scratch.copyMemory(from: tail.memory, byteCount: tail.fill)
                    (scratch + tail.fill).copyMemory(from: raw.baseAddress! + done, byteCount: n)
                    let code = self.pwriteAll(scratch, count: whole, at: tail.start)
                    if code == 0 { tail.memory.copyMemory(from: scratch + whole, byteCount: total - whole) }
                    return code
                }
                guard let code, code != EINVAL else {
                    // No scratch memory, or a file system that took O_DIRECT but refuses these writes: the tail and
                    // the rest through the page cache.
                    try self.leaveDirect()
                    break
                }
                try self.check(code, count: whole, at: tail.start)
                self.direct = DirectTail(memory: tail.memory, start: tail.start + Int64(whole), fill: total - whole)
                done += n
            }
            if done < raw.count {
                try self.writeAll(raw.baseAddress! + done, count: raw.count - done, at: offset + Int64(done))
            }
        }
        self.end = max(self.end, offset + Int64(bytes.readableBytes))
    }

    /// Writes the tail to disk, padded with zeros to a block; it stays for the writes that follow.
    private func flushDirect() throws {
        guard let tail = self.direct, tail.fill > 0 else { return }
        (tail.memory + tail.fill).initializeMemory(as: UInt8.self, repeating: 0, count: Self.block - tail.fill)
        let code = self.pwriteAll(tail.memory, count: Self.block, at: tail.start)
        if code == EINVAL {
            // The file system took O_DIRECT but refuses these writes: the same bytes through the page cache.
            try self.leaveDirect()
            return
        }
        try self.check(code, count: Self.block, at: tail.start)
    }

    /// From now on, plain writes through the page cache: first the bytes still in the buffer, exactly.
    private func leaveDirect() throws {
        guard let buffer = self.direct else { return }
        self.direct = nil
        defer { free(buffer.memory) }
        Self.clearDirectFlag(self.descriptor)
        try self.writeAll(buffer.memory, count: buffer.fill, at: buffer.start)
    }

    private func writeAll(_ base: UnsafeRawPointer, count: Int, at offset: Int64) throws {
        try self.check(self.pwriteAll(base, count: count, at: offset), count: count, at: offset)
    }

    /// 0, or the errno of the write that failed.
    private func pwriteAll(_ base: UnsafeRawPointer, count total: Int, at offset: Int64) -> Int32 {
        var done = 0
        while done < total {
            let n = pwrite(self.descriptor, base + done, total - done, off_t(offset) + off_t(done))
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { return n == 0 ? EIO : errno }
            done += n
        }
        return 0
    }

    private func check(_ code: Int32, count: Int, at offset: Int64) throws {
        guard code != 0 else { return }
        throw StoreError(
            "cannot write \(count) bytes at offset \(offset) of \(self.path): \(FileSystem.reason(code))",
            isNoSpace: code == ENOSPC || code == EDQUOT
        )
    }

    /// Makes every written byte survive a crash. With direct I/O the file may then extend past ``end`` to a
    /// block boundary, with zeros; a resume cuts it back to its durable offset, a commit to ``end`` (``seal()``).
    func sync() async throws {
        try await self.threadPool.runBlocking { try self.syncNow() }
    }

    /// ``sync()``, on the caller's thread.
    func syncNow() throws {
        try self.guardingUse {
            try self.flushDirect()
            try self.dataSync()
            guard !self.nameIsDurable else { return }
            try FileSystem.syncDirectory(self.directory)
            // Bytes in a file whose name is gone (removed as an orphan while its upload waited) are not durable.
            var info = stat()
            guard fstat(self.descriptor, &info) == 0, info.st_nlink > 0 else {
                throw StoreError("staging file \(self.path) was removed while its upload was open")
            }
            self.nameIsDurable = true
        }
    }

    func read(_ count: Int, at offset: Int64) async throws -> ByteBuffer {
        try await self.threadPool.runBlocking {
            var bytes = ByteBuffer()
            _ = try bytes.writeWithUnsafeMutableBytes(minimumWritableBytes: count) { buffer in
                try self.read(into: UnsafeMutableRawBufferPointer(rebasing: buffer[0..<count]), at: offset)
            }
            return bytes
        }
    }

    private func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws -> Int {
        if let unusable = self.unusable { throw unusable }
        // Plain reads need plain I/O: what the direct buffer holds goes to the file first.
        try self.leaveDirect()
        guard let base = buffer.baseAddress else { return 0 }
        var done = 0
        while done < buffer.count {
            let n = pread(self.descriptor, base + done, buffer.count - done, off_t(offset) + off_t(done))
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else {
                throw StoreError("cannot read \(buffer.count) bytes at offset \(offset) of \(self.path): \(FileSystem.reason())")
            }
            if n == 0 { break }
            done += n
        }
        return done
    }

    /// Makes the file exactly the bytes written, durable (unless `sync` is false: the caller syncs the whole file
    /// system for a group of them): what commit renames into place. No write follows.
    func seal(sync: Bool = true) throws {
        try self.guardingUse {
            try self.flushDirect()
            if let tail = self.direct {
                self.direct = nil
                free(tail.memory)
            }
            guard ftruncate(self.descriptor, off_t(self.end)) == 0 else {
                throw StoreError("cannot cut \(self.path) to \(self.end) bytes: \(FileSystem.reason())")
            }
            if sync { try self.dataSync() }
        }
        self.unusable = StoreError("\(self.path) is sealed for commit: no more writes")
    }

    /// Makes a sealed file's bytes durable (``seal(sync:)`` without its sync).
    func syncSealed() throws {
        try self.dataSync()
    }

    private func dataSync() throws {
        guard fdatasync(self.descriptor) == 0 else {
            let code = errno
            throw StoreError("cannot fsync \(self.path): \(FileSystem.reason(code))", isNoSpace: code == ENOSPC)
        }
    }

    /// Closes the file. Bytes still in the direct buffer are written first (not synced) and the block padding cut
    /// off, so the file holds exactly what was written, as after plain writes.
    func close() {
        if self.direct != nil {
            // leaveDirect frees the buffer whether or not its write succeeds.
            try? self.leaveDirect()
            _ = ftruncate(self.descriptor, off_t(self.end))
        }
        if self.descriptor >= 0 {
            Glibc.close(self.descriptor)
            self.descriptor = -1
        }
        if self.unusable == nil {
            self.unusable = StoreError("\(self.path) is closed")
        }
    }
}

/// The aligned buffers direct writes borrow, one per write under way (so at most one per I/O thread), kept for the
/// next writes instead of one per open upload: 100 agents uploading at once held 100 MiB and more of them before.
enum DirectScratch {
    /// Idle buffers kept; more are freed.
    static let maxIdle = 8

    private struct Buffer: @unchecked Sendable {
        var memory: UnsafeMutableRawPointer
        var capacity: Int
    }

    private static let idle = NIOLockedValueBox<[Buffer]>([])

    /// Runs `body` with an aligned buffer of at least `capacity` bytes; nil when no memory could be had.
    static func with<T>(capacity: Int, _ body: (UnsafeMutableRawPointer) throws -> T) rethrows -> T? {
        let kept = Self.idle.withLockedValue { idle -> Buffer? in
            guard let index = idle.lastIndex(where: { $0.capacity >= capacity }) else { return nil }
            return idle.remove(at: index)
        }
        guard let buffer = kept ?? Self.allocate(capacity) else { return nil }
        defer {
            let kept = Self.idle.withLockedValue { idle -> Bool in
                guard idle.count < Self.maxIdle else { return false }
                idle.append(buffer)
                return true
            }
            if !kept { free(buffer.memory) }
        }
        return try body(buffer.memory)
    }

    private static func allocate(_ capacity: Int) -> Buffer? {
        var memory: UnsafeMutableRawPointer? = nil
        guard posix_memalign(&memory, LocalStagingFile.block, capacity) == 0, let memory else { return nil }
        return Buffer(memory: memory, capacity: capacity)
    }

    /// Idle buffers now (tests).
    static var idleCount: Int { Self.idle.withLockedValue { $0.count } }
}
