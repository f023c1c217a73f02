import NIOCore
import NIOPosix
import UploadChecksums
import UploadPayload
import UploadProtocol

/// Sends one item's bytes on one stream: reads the source only while credit is held, computes
/// CRC32 (and SHA-1 when not known beforehand) off the event loop, and ends with HASH.
final class StreamSender {
    let id: StreamID
    let job: UploadJob
    private let pool: NIOThreadPool
    private let eventLoop: any EventLoop
    private let configuration: AgentConfiguration
    private let deflate: Bool
    /// The running SHA-1, nil when the job knows its SHA-1 already.
    private var sha1: SHA1? = nil
    private var reading = false
    private var started = false
    private(set) var hashSent = false
    private var stopped = false

    /// How the sender talks back to its connection.
    struct Hooks {
        /// Claims up to this many bytes of credit for one read; returns how many were claimed.
        var reserve: (StreamID, Int) -> Int
        var maxChunkPayload: () -> Int
        var nextOffset: (StreamID) -> UInt64?
        /// Writes a batch of chunks, flushes once, and gives back the credit the batch did not use.
        var sendChunks: (StreamID, [Frame.Chunk]) -> Void
        var sendHash: (Frame.Hash) -> Void
        var fail: (StreamID, String) -> Void
    }

    private let hooks: Hooks

    init(id: StreamID, job: UploadJob, pool: NIOThreadPool, eventLoop: any EventLoop, configuration: AgentConfiguration, deflate: Bool, hooks: Hooks) {
        self.id = id
        self.job = job
        self.pool = pool
        self.eventLoop = eventLoop
        self.configuration = configuration
        self.deflate = deflate
        self.hooks = hooks
    }

    /// OFFSET START or RESUME arrived: begin at `offset`.
    func start(at offset: UInt64) {
        if self.job.knownSHA1 == nil {
            if offset == 0 {
                self.sha1 = SHA1()
            } else if let snapshot = self.job.snapshots[offset] {
                self.sha1 = snapshot
            } else if self.job.item.source.isSeekable {
                // The relay knows a prefix this run never sent (the agent restarted): hash it locally, no network.
                self.rehashPrefix(upTo: offset)
                return
            } else {
                self.hooks.fail(self.id, "\(self.job.item.source.displayName) cannot resume at \(offset): those bytes are no longer held")
                return
            }
        }
        self.started = true
        self.pump()
    }

    private func rehashPrefix(upTo offset: UInt64) {
        let source = self.job.item.source
        self.reading = true
        self.pool.runIfActive(eventLoop: self.eventLoop) { () -> SHA1 in
            var sha1 = SHA1()
            var position: UInt64 = 0
            let allocator = ByteBufferAllocator()
            while position < offset {
                let piece = try source.read(at: position, maxLength: Int(min(4 << 20, offset - position)), allocator: allocator)
                guard piece.readableBytes > 0 else { throw SourceError("\(source.displayName) is shorter than the relay's \(offset) bytes") }
                piece.withUnsafeReadableBytes { sha1.update($0) }
                position += UInt64(piece.readableBytes)
            }
            return sha1
        }.assumeIsolated().whenComplete { result in
            self.reading = false
            switch result {
            case .success(let sha1):
                self.sha1 = sha1
                self.started = true
                self.pump()
            case .failure(let error):
                self.hooks.fail(self.id, "\(error)")
            }
        }
    }

    /// The stream closed: stop reading.
    func stop() {
        self.stopped = true
    }

    /// The most bytes read (and hashed) in one trip to the thread pool.
    static let batchBytes = 2 << 20

    private struct Batch: Sendable {
        var chunks: [Frame.Chunk] = []
        var snapshots: [(UInt64, SHA1)] = []
        var sha1: SHA1? = nil
        var ended = false
        var nextOffset: UInt64
    }

    /// Reads and sends as much as credit allows, then HASH at the end.
    ///
    /// Each read first claims its credit from the connection state machine, so reads of several streams
    /// planned at once never count on the same bytes (issue 6, finding 1).
    func pump() {
        guard self.started, !self.reading, !self.hashSent, !self.stopped else { return }
        guard let offset = self.hooks.nextOffset(self.id) else { return }
        let source = self.job.item.source
        let size = self.job.info?.size
        let atEnd = size.map { offset >= $0 } ?? false
        // Small batches keep reading here overlapped with the relay's work on the previous batch.
        let wanted = size.map { Int(clamping: min(UInt64(Self.batchBytes), $0 - min(offset, $0))) } ?? Self.batchBytes
        let budget = atEnd ? 0 : self.hooks.reserve(self.id, wanted)
        guard budget > 0 || atEnd else { return }
        self.reading = true
        let chunkSize = max(1, min(self.configuration.chunkSize, self.hooks.maxChunkPayload()))
        let id = self.id
        let startSHA1 = self.sha1
        let keepSnapshots = self.job.knownSHA1 == nil
        let deflate = self.deflate
        let corruptAt = self.configuration.faults.corruptChunkAtOffset
        self.pool.runIfActive(eventLoop: self.eventLoop) { () -> Batch in
            var batch = Batch(sha1: startSHA1, nextOffset: offset)
            let allocator = ByteBufferAllocator()
            var used = 0
            while used < budget || budget == 0 {
                if let size, batch.nextOffset >= size {
                    batch.ended = true
                    break
                }
                var limit = min(chunkSize, budget - used)
                if let size { limit = Int(clamping: min(UInt64(limit), size - batch.nextOffset)) }
                let data = try source.read(at: batch.nextOffset, maxLength: limit, allocator: allocator)
                if data.readableBytes == 0 {
                    batch.ended = source.isEnd(at: batch.nextOffset)
                    if let size, batch.ended, batch.nextOffset < size {
                        throw SourceError("\(source.displayName) ended at \(batch.nextOffset) bytes but was \(size) when opened: it changed during the upload")
                    }
                    break
                }
                if batch.sha1 != nil {
                    data.withUnsafeReadableBytes { batch.sha1!.update($0) }
                }
                var chunk = ChunkPayload.seal(data, streamID: id, offset: batch.nextOffset, deflate: deflate, allocator: allocator)
                if let corruptAt, corruptAt >= batch.nextOffset, corruptAt < batch.nextOffset + UInt64(data.readableBytes) {
                    chunk = Self.corrupted(chunk, allocator: allocator)
                }
                batch.chunks.append(chunk)
                batch.nextOffset += UInt64(data.readableBytes)
                used += data.readableBytes
                if keepSnapshots, let sha1 = batch.sha1 {
                    batch.snapshots.append((batch.nextOffset, sha1))
                }
            }
            if batch.ended, let change = source.changeSinceOpen() {
                // Never commit a mix of two versions (issue 6, finding 8): the relay discards what it staged.
                throw SourceError(change)
            }
            return batch
        }.assumeIsolated().whenComplete { result in
            self.reading = false
            guard !self.stopped else { return }
            switch result {
            case .success(let batch):
                self.sha1 = batch.sha1
                for (offset, sha1) in batch.snapshots {
                    self.job.snapshots[offset] = sha1
                }
                for chunk in batch.chunks {
                    self.job.sentBytes += UInt64(chunk.payloadLength)
                    self.job.bytesRead = max(self.job.bytesRead, chunk.offset + UInt64(chunk.payloadLength))
                }
                self.hooks.sendChunks(self.id, batch.chunks)
                guard !self.stopped else { return }
                if batch.ended {
                    self.sendHash(size: batch.nextOffset)
                } else if !batch.chunks.isEmpty {
                    self.pump()
                }
                // An empty batch that did not end: a stream source waits for ACKs to free room; they pump again.
            case .failure(let error):
                self.hooks.fail(self.id, "\(error)")
            }
        }
    }

    private func sendHash(size: UInt64) {
        guard let digest = self.job.knownSHA1 ?? self.sha1.map({ SHA1Digest(bytes: $0.finalize())! }) else { return }
        self.hashSent = true
        self.job.bytesRead = size
        self.hooks.sendHash(Frame.Hash(streamID: self.id, size: size, sha1: self.configuration.faults.lieAboutSHA1 ?? digest))
    }

    private static func corrupted(_ chunk: Frame.Chunk, allocator: ByteBufferAllocator) -> Frame.Chunk {
        var copy = allocator.buffer(capacity: chunk.data.readableBytes)
        copy.writeImmutableBuffer(chunk.data)
        let index = copy.readerIndex + copy.readableBytes / 2
        copy.setInteger(copy.getInteger(at: index, as: UInt8.self)! ^ 0x01, at: index)
        var result = chunk
        result.data = copy
        return result
    }
}
