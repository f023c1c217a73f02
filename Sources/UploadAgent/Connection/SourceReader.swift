import NIOCore
import UploadChecksums
import UploadPayload
import UploadProtocol

/// Reading a source, as plain functions run on the thread pool: no connection state, no credit. The
/// ``AgentSession`` decides what to read (offset and budget, already reserved against credit); these only read.
enum SourceReader {
    /// What one read asks for.
    struct Request: Sendable {
        var streamID: StreamID
        var source: any BlobSource
        /// The source's size, when known.
        var size: UInt64?
        var offset: UInt64
        /// Credit reserved for this read: the most payload bytes it may produce (0 only to detect the end).
        var budget: Int
        var chunkSize: Int
        var deflate: Bool
        /// The SHA-1 of the bytes before `offset`, when the agent computes it while sending; or of more bytes (the probe's,
        /// read before OPEN), which the read then does not hash again.
        var sha1: SHA1?
        var keepSnapshots: Bool
        /// What the source was when opened, and how often it may be reopened in a row (``BlobSource/reopen()``).
        var reopening: Reopening
        /// Test-only fault: corrupt the chunk holding this offset after its CRC was computed.
        var corruptAt: UInt64?
        /// Where offset 0 of the stream is in the source: a PART stream's offsets start at its stripe (SPEC §6.7).
        var base: UInt64 = 0
        /// The whole source, as it was read and hashed before OPEN (``Prepared/content``): read from here, not the
        /// source, and not checked for a change again (it was, once read).
        var held: ByteBuffer? = nil
    }

    /// What one read produced.
    struct Batch: Sendable {
        var chunks: [Frame.Chunk] = []
        /// SHA-1 states at chunk ends, for resumes at any ACK.
        var snapshots: [(UInt64, SHA1)] = []
        var sha1: SHA1?
        /// The source ended at `nextOffset`.
        var ended = false
        var nextOffset: UInt64
        /// The chunks were sealed with deflate asked (each kept deflated only where it shrank).
        var deflateTried = false
    }

    /// How a read recovers from ``SourceInvalidated``: reopen, check the fingerprint, read on at the same offset.
    struct Reopening: Sendable {
        /// The fingerprint the upload started with: a reopened source must show the same.
        var fingerprint: [UInt8]
        /// Reopens allowed with no successful read in between (``AgentConfiguration/maxReopensInARow``).
        var limit: Int
    }

    /// `source.read`, reopening the source when it says it became invalid.
    static func read(
        _ source: any BlobSource, at offset: UInt64, maxLength: Int, allocator: ByteBufferAllocator, reopening: Reopening
    ) throws -> ByteBuffer {
        var reopened = 0
        while true {
            do {
                return try source.read(at: offset, maxLength: maxLength, allocator: allocator)
            } catch let invalid as SourceInvalidated {
                guard reopened < reopening.limit else {
                    throw SourceError(
                        "\(source.displayName) became invalid at byte \(offset) and stayed so after \(reopened) reopen(s): \(invalid.reason)"
                    )
                }
                reopened += 1
                let info = try source.reopen()
                guard info.fingerprint == reopening.fingerprint else {
                    throw SourceError(
                        "\(source.displayName) was reopened at byte \(offset) (\(invalid.reason)) with a different fingerprint: its content changed, so this upload stops and nothing is committed"
                    )
                }
            }
        }
    }

    static func read(_ request: Request, bandwidth: BandwidthLimit? = nil) throws -> Batch {
        var batch = Batch(sha1: request.sha1, nextOffset: request.offset, deflateTried: request.deflate)
        let allocator = ByteBufferAllocator()
        let source = request.source
        var used = 0
        while used < request.budget || request.budget == 0 {
            if let size = request.size, batch.nextOffset >= size {
                batch.ended = true
                break
            }
            var limit = min(request.chunkSize, request.budget - used)
            if let size = request.size { limit = Int(clamping: min(UInt64(limit), size - batch.nextOffset)) }
            let data: ByteBuffer
            if let held = request.held {
                let start = Int(clamping: request.base + batch.nextOffset)
                data =
                    held.getSlice(at: held.readerIndex + min(start, held.readableBytes), length: max(0, min(limit, held.readableBytes - start)))
                    ?? ByteBuffer()
            } else {
                data = try Self.read(
                    source, at: request.base + batch.nextOffset, maxLength: limit, allocator: allocator, reopening: request.reopening
                )
            }
            if data.readableBytes == 0 {
                batch.ended = source.isEnd(at: request.base + batch.nextOffset)
                if let size = request.size, batch.ended, batch.nextOffset < size {
                    throw SourceError(
                        "\(source.displayName) ended at \(batch.nextOffset) bytes but was \(size) when opened: it changed during the upload")
                }
                break
            }
            bandwidth?.take(data.readableBytes)
            if var sha1 = batch.sha1 {
                // A state ahead of the read (the probe's first bytes, SPEC §7.1) holds the read's first bytes already.
                let skip = Int(clamping: min(UInt64(data.readableBytes), sha1.byteCount - min(sha1.byteCount, batch.nextOffset)))
                data.withUnsafeReadableBytes { sha1.update(UnsafeRawBufferPointer(rebasing: $0.dropFirst(skip))) }
                batch.sha1 = sha1
            }
            var chunk = ChunkPayload.seal(data, streamID: request.streamID, offset: batch.nextOffset, deflate: request.deflate, allocator: allocator)
            if let corruptAt = request.corruptAt, corruptAt >= batch.nextOffset, corruptAt < batch.nextOffset + UInt64(data.readableBytes) {
                chunk = Self.corrupted(chunk, allocator: allocator)
            }
            batch.chunks.append(chunk)
            batch.nextOffset += UInt64(data.readableBytes)
            used += data.readableBytes
            if request.keepSnapshots, let sha1 = batch.sha1, sha1.byteCount == batch.nextOffset {
                batch.snapshots.append((batch.nextOffset, sha1))
            }
            // A stream that paused (a short read) sends what came now instead of waiting to fill the batch.
            if !source.isSeekable && data.readableBytes < limit { break }
        }
        // A batch that used its whole budget on a source's last bytes ends it too: HASH goes with them, not after a
        // second read (a trip to the pool) that only finds the end (a small file's whole budget is its size).
        if let size = request.size, batch.nextOffset >= size { batch.ended = true }
        if batch.ended, request.held == nil, let change = source.changeSinceOpen() {
            // Never commit a mix of two versions (the file changed while it was read): the relay discards what it
            // staged.
            throw SourceError(change)
        }
        return batch
    }

    /// Bytes hashed per read of a source: what a file source keeps as its block between reads.
    static let hashPieceBytes = 1 << 20

    /// The SHA-1 of the first `offset` bytes: the relay knows a prefix this run never sent (the agent restarted), so
    /// it is hashed locally, with no network, from the latest SHA-1 state the agent kept below it (`from`), if any.
    /// `keeping` sees each piece read, after it is hashed.
    static func hashPrefix(
        of source: any BlobSource, from start: (UInt64, SHA1)? = nil, upTo offset: UInt64, reopening: Reopening, whenShort: String? = nil,
        keeping: (ByteBuffer) -> Void = { _ in }
    ) throws -> SHA1 {
        var sha1 = start?.1 ?? SHA1()
        var position: UInt64 = start?.0 ?? 0
        let allocator = ByteBufferAllocator()
        while position < offset {
            let piece = try Self.read(
                source, at: position, maxLength: Int(min(UInt64(Self.hashPieceBytes), offset - position)), allocator: allocator,
                reopening: reopening
            )
            guard piece.readableBytes > 0 else {
                throw SourceError(whenShort ?? "\(source.displayName) is shorter than the relay's \(offset) bytes")
            }
            piece.withUnsafeReadableBytes { sha1.update($0) }
            keeping(piece)
            position += UInt64(piece.readableBytes)
        }
        return sha1
    }

    /// A source opened for OPEN.
    struct Prepared: Sendable {
        var info: SourceInfo
        /// Known before OPEN (dedup), or nil.
        var sha1: SHA1Digest?
        /// Bytes read to hash it now (0 when known before, from the job or the hash cache).
        var hashedBytes: UInt64 = 0
        /// The SHA-1 of the first ``Frame/Open/probeLength`` bytes, when dedup asks the relay with a probe (SPEC §7.1).
        var probe: SHA1Digest? = nil
        /// The running SHA-1 after those bytes: sending from the start hashes on from there.
        var probePrefix: SHA1? = nil
        /// The whole source, when it was small enough to keep (``AgentConfiguration/heldSourceBytes``) and did not
        /// change while it was read: what the SHA-1 is of, and what is sent.
        var content: ByteBuffer? = nil
    }

    /// Opens the source and, for dedup, hashes it whole before OPEN (seekable sources of known size only), unless the
    /// journal's hash cache knows the SHA-1 of this fingerprint.
    ///
    /// With `probe` (the relay granted the dedup probe, SPEC §7.1) a source larger than the probe length is hashed over
    /// its first 256 KiB only: the whole SHA-1 comes while it is sent, in the same read, unless the relay answers CONFIRM.
    static func prepare(
        _ source: any BlobSource, info known: SourceInfo?, knownSHA1: SHA1Digest?, dedup: Bool, probe: Bool = false, reopenLimit: Int,
        journal: (any JobJournal)?, hold: Int = 0
    ) throws -> Prepared {
        let info = try known ?? source.open()
        if let knownSHA1 { return Prepared(info: info, sha1: knownSHA1) }
        guard dedup, source.isSeekable, let size = info.size else { return Prepared(info: info, sha1: nil) }
        if let cached = journal?.cachedSHA1(fingerprint: info.fingerprint) {
            return Prepared(info: info, sha1: cached)
        }
        if probe && size > Frame.Open.probeLength {
            let prefix = try Self.hashPrefix(
                of: source, upTo: Frame.Open.probeLength, reopening: Reopening(fingerprint: info.fingerprint, limit: reopenLimit),
                whenShort: "\(source.displayName) shrank while it was hashed"
            )
            return Prepared(
                info: info, sha1: nil, hashedBytes: Frame.Open.probeLength, probe: SHA1Digest(bytes: prefix.finalize()), probePrefix: prefix
            )
        }
        let reopening = Reopening(fingerprint: info.fingerprint, limit: reopenLimit)
        // Small: kept as read, so that sending it reads nothing again. Copied into a buffer of its size: a piece may be a
        // slice of a larger block, which keeping it would hold.
        var content = size <= UInt64(hold) ? ByteBufferAllocator().buffer(capacity: Int(size)) : nil
        let sha1 = try Self.hashPrefix(
            of: source, upTo: size, reopening: reopening, whenShort: "\(source.displayName) shrank while it was hashed"
        ) { content?.writeImmutableBuffer($0) }
        let digest = SHA1Digest(bytes: sha1.finalize())
        if let digest { journal?.hashed(fingerprint: info.fingerprint, sha1: digest) }
        // A source that changed while it was read is read again when sent, which finds the change and stops.
        if content != nil, source.changeSinceOpen() != nil { content = nil }
        return Prepared(info: info, sha1: digest, hashedBytes: size, content: content)
    }

    private static func corrupted(_ chunk: Frame.Chunk, allocator: ByteBufferAllocator) -> Frame.Chunk {
        var copy = allocator.buffer(capacity: chunk.data.readableBytes)
        copy.writeImmutableBuffer(chunk.data)
        let index = copy.readerIndex + copy.readableBytes / 2
        if let byte = copy.getInteger(at: index, as: UInt8.self) { copy.setInteger(byte ^ 0x01, at: index) }
        var result = chunk
        result.data = copy
        return result
    }
}
