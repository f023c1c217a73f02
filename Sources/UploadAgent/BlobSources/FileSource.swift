#if canImport(Glibc)
import Glibc
#endif
import NIOConcurrencyHelpers
import NIOCore
import UploadChecksums

/// A regular file, read with `pread` in large blocks; chunks are slices of a block, not copies.
public final class FileSource: BlobSource {
    public let path: String
    public var displayName: String { self.path }
    public var isSeekable: Bool { true }
    /// Bytes read from the file at a time, whatever the chunk size (at least a read's `maxLength`). The last block read
    /// is kept for the next reads: each upload in flight holds one.
    public let blockSize: Int
    /// Where in the file the blob begins: the blob is the file's bytes from here to its end (the new part of a log
    /// that grows, the payload after a header of known length).
    public let startOffset: UInt64
    /// Whether a symbolic link at `path` is followed to its target. By default it is not: the open fails, and nothing
    /// but the file named is ever read (`upload-agent send --follow-symlinks` asks for targets).
    public let followSymlinks: Bool
    /// Where blocks read before wait to be read into again (``RecycledBlocks/shared``, but in tests).
    let recycled: RecycledBlocks

    private struct State {
        var descriptor: Int32 = -1
        var size: UInt64 = 0
        var block: ByteBuffer? = nil
        var blockOffset: UInt64 = 0
        /// Device, inode, size and modification time when opened.
        var identity: Identity? = nil
    }

    private struct Identity: Equatable {
        var device: UInt64
        var inode: UInt64
        var size: Int64
        var seconds: Int
        var nanoseconds: Int

        init(_ info: stat) {
            self.device = UInt64(info.st_dev)
            self.inode = UInt64(info.st_ino)
            self.size = Int64(info.st_size)
            self.seconds = info.st_mtim.tv_sec
            self.nanoseconds = info.st_mtim.tv_nsec
        }
    }

    private let state = NIOLockedValueBox(State())

    public convenience init(path: String, blockSize: Int = 1 << 20, startOffset: UInt64 = 0, followSymlinks: Bool = false) {
        self.init(path: path, blockSize: blockSize, startOffset: startOffset, followSymlinks: followSymlinks, recycled: .shared)
    }

    init(path: String, blockSize: Int, startOffset: UInt64, followSymlinks: Bool, recycled: RecycledBlocks) {
        self.recycled = recycled
        self.path = path
        self.blockSize = max(1, blockSize)
        self.startOffset = startOffset
        self.followSymlinks = followSymlinks
    }

    deinit {
        self.close()
    }

    public func open() throws -> SourceInfo {
        // O_NOFOLLOW: a link put where a file was checked (or appeared after a scan) is never opened through.
        let fd = Glibc.open(self.path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | (self.followSymlinks ? 0 : O_NOFOLLOW))
        guard fd >= 0 else {
            if errno == ELOOP && !self.followSymlinks {
                throw SourceError("\(self.path) is a symbolic link: not followed (--follow-symlinks uploads what links point to)")
            }
            throw SourceError("cannot open \(self.path): \(String(cString: strerror(errno)))")
        }
        // Opened without blocking so that a FIFO put in a file's place cannot hang the open; reads are plain.
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK)
        var info = stat()
        guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
            Glibc.close(fd)
            throw SourceError("\(self.path) is not a regular file")
        }
        guard UInt64(info.st_size) >= self.startOffset else {
            Glibc.close(fd)
            throw SourceError("\(self.path) is \(info.st_size) bytes, shorter than the start offset \(self.startOffset)")
        }
        let size = UInt64(info.st_size) - self.startOffset
        self.state.withLockedValue {
            $0.descriptor = fd
            $0.size = size
            $0.identity = Identity(info)
        }
        return SourceInfo(size: size, fingerprint: Self.fingerprint(info, startOffset: self.startOffset))
    }

    /// Device, inode, size and modification time (and the start offset, when not 0): a new version of the file gets a
    /// new fingerprint.
    static func fingerprint(_ info: stat, startOffset: UInt64 = 0) -> [UInt8] {
        var text = "\(info.st_dev):\(info.st_ino):\(info.st_size):\(info.st_mtim.tv_sec).\(info.st_mtim.tv_nsec)"
        if startOffset > 0 { text += "@\(startOffset)" }
        return text.withUTF8 { SHA1.hash($0) }
    }

    /// The size and fingerprint a regular file at `path` has now (what ``open()`` would report), or nil when there is
    /// no regular file there: a symbolic link is none unless `followSymlinks`.
    public static func currentInfo(path: String, followSymlinks: Bool = false) -> SourceInfo? {
        var info = stat()
        guard (followSymlinks ? stat(path, &info) : lstat(path, &info)) == 0, (info.st_mode & S_IFMT) == S_IFREG else { return nil }
        return SourceInfo(size: UInt64(info.st_size), fingerprint: Self.fingerprint(info))
    }

    public func read(at offset: UInt64, maxLength: Int, allocator: ByteBufferAllocator) throws -> ByteBuffer {
        try self.state.withLockedValue { state in
            guard state.descriptor >= 0 else { throw SourceError("\(self.path) is not open") }
            if offset >= state.size { return allocator.buffer(capacity: 0) }
            let block: ByteBuffer
            if let cached = state.block, offset >= state.blockOffset, offset < state.blockOffset + UInt64(cached.readableBytes) {
                block = cached
            } else {
                block = try self.readBlock(&state, at: offset, maxLength: maxLength, allocator: allocator)
            }
            let start = Int(offset - state.blockOffset)
            // Kept for the reads to come, unless this one takes the file's last bytes: the block then goes with its
            // chunks, not with the source (many small uploads at once, or uploads waiting for their commit, must not
            // hold a block each).
            let last = maxLength >= block.readableBytes - start && state.blockOffset + UInt64(block.readableBytes) >= state.size
            state.block = last ? nil : block
            if last { self.recycled.put(block) }
            return try Self.slice(block, from: start, length: maxLength, path: self.path)
        }
    }

    /// Reads the block at `offset`: at least `maxLength` bytes, up to the size at open.
    private func readBlock(_ state: inout State, at offset: UInt64, maxLength: Int, allocator: ByteBufferAllocator) throws -> ByteBuffer {
        let wanted = Int(min(UInt64(max(self.blockSize, maxLength)), state.size - offset))
        // The block read before is read into again when no chunk of it is alive (all sent); else it goes to the recycled
        // ones, its chunks on their way, and one of those whose chunks are all sent is used: no allocation. Moved out of
        // the state, so that the source's own reference is not counted as a chunk's.
        var previous = state.block.take()
        var block: ByteBuffer
        if previous?.clearedForReuse(atLeast: wanted) == true, let reused = previous.take() {
            block = reused
        } else {
            if let previous = previous.take() { self.recycled.put(previous) }
            block = self.recycled.take(atLeast: wanted) ?? allocator.buffer(capacity: wanted)
        }
        let fd = state.descriptor
        let path = self.path
        let fileOffset = off_t(offset + self.startOffset)
        try block.writeWithUnsafeMutableBytes(minimumWritableBytes: wanted) { raw in
            guard let base = raw.baseAddress else { return 0 }
            var done = 0
            while done < wanted {
                let n = pread(fd, base + done, wanted - done, fileOffset + off_t(done))
                if n < 0 && errno == EINTR { continue }
                guard n >= 0 else { throw SourceError("cannot read \(path) at \(offset): \(String(cString: strerror(errno)))") }
                if n == 0 { break }
                done += n
            }
            return done
        }
        guard block.readableBytes > 0 else {
            throw SourceError("\(path) ended at \(offset) bytes but was \(state.size) when opened: it changed during the upload")
        }
        state.blockOffset = offset
        return block
    }

    /// Up to `length` bytes of `block` from `start`, sharing its storage.
    private static func slice(_ block: ByteBuffer, from start: Int, length: Int, path: String) throws -> ByteBuffer {
        guard let slice = block.getSlice(at: block.readerIndex + start, length: min(length, block.readableBytes - start)) else {
            throw SourceError("\(path): no bytes at \(start) of a block of \(block.readableBytes)")
        }
        return slice
    }

    public func changeSinceOpen() -> String? {
        guard let opened = self.state.withLockedValue({ $0.identity }) else { return nil }
        var info = stat()
        guard (self.followSymlinks ? stat(self.path, &info) : lstat(self.path, &info)) == 0 else {
            return "\(self.path) was removed during the upload: not committed (nothing of it is kept on the relay)"
        }
        let now = Identity(info)
        guard now != opened else { return nil }
        let what =
            now.inode != opened.inode || now.device != opened.device
            ? "replaced by another file" : now.size != opened.size ? "resized from \(opened.size) to \(now.size) bytes" : "modified"
        return "\(self.path) was \(what) during the upload: not committed, to never store a mix of two versions (run again to upload the new version)"
    }

    public func close() {
        self.state.withLockedValue {
            if $0.descriptor >= 0 {
                Glibc.close($0.descriptor)
                $0.descriptor = -1
            }
            $0.block = nil
        }
    }
}

/// Blocks read before, kept to be read into again once no chunk of theirs is alive (all sent). A block of 256 KiB or
/// more is mapped on its own (the agent returns large buffers at once, see `upload-agent`'s main) and a fresh one costs a
/// page fault and a zeroed page per 4 KiB read into it: on 1,000 files of 1 MiB about a tenth of the agent's CPU, and as
/// much on one large file, whose blocks are still in flight (the connection's window, 8 MiB) when the next is read.
/// The last ``capacity`` blocks put wait here, in flight or free: a free one costs memory only until the window's
/// worth of blocks after it were put, and none once the queue has nothing left to upload (``drain()``).
final class RecycledBlocks: Sendable {
    /// The agent's (every ``FileSource`` made with the public initializer).
    static let shared = RecycledBlocks()
    let capacity: Int
    /// Only blocks of the size reads use (the default block size and the chunk sizes near it).
    static let sizes = (256 << 10)...(2 << 20)
    private let blocks = NIOLockedValueBox<[ByteBuffer]>([])

    init(capacity: Int = 12) {
        self.capacity = capacity
    }

    func put(_ block: ByteBuffer) {
        guard Self.sizes.contains(block.capacity) else { return }
        self.blocks.withLockedValue { blocks in
            blocks.append(block)
            if blocks.count > self.capacity { blocks.removeFirst() }
        }
    }

    /// Lets go of every block kept (the agent has nothing to read for now).
    func drain() {
        self.blocks.withLockedValue { $0.removeAll() }
    }

    /// The oldest block kept that holds `wanted` bytes and that nothing else refers to any more (every chunk of it is
    /// gone), emptied; nil when none is.
    func take(atLeast wanted: Int) -> ByteBuffer? {
        self.blocks.withLockedValue { blocks in
            // In place: a copy of the buffer would be a second reference to its memory.
            for index in blocks.indices where blocks[index].clearedForReuse(atLeast: wanted) {
                return blocks.remove(at: index)
            }
            return nil
        }
    }

    /// Blocks kept now (tests).
    var count: Int { self.blocks.withLockedValue { $0.count } }
}

extension ByteBuffer {
    /// Emptied to be read into again, when it holds `wanted` bytes and nothing else refers to its memory (every chunk of
    /// it is gone); false, unchanged, otherwise.
    fileprivate mutating func clearedForReuse(atLeast wanted: Int) -> Bool {
        self.capacity >= wanted && self.modifyIfUniquelyOwned({ $0.clear() }) != nil
    }
}
