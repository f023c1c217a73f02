import NIOCore

/// Collects bytes as they arrive from a connection and hands out whole frames (SPEC §1).
///
/// Wraps a ``FrameDecoder`` with the cumulation buffer a channel handler needs: append each read,
/// then call ``next()`` until it returns nil. A CHUNK's data is a buffer of its own, of the data's size; other frames'
/// payloads are slices of the reads, used before the next one.
public struct FrameReader: Sendable {
    public var decoder: FrameDecoder
    private var buffer: ByteBuffer? = nil
    /// A CHUNK arriving in pieces, gathered in two parts: its header and fields, and its data in a buffer of exactly the
    /// data's size. Gathered whole, a 1 MiB CHUNK (1 MiB and 22 bytes) took a buffer of 2 MiB: buffers come in powers of
    /// two, so half of every gathered chunk's memory held nothing (126 MB of a relay's 144 MB heap with 100 agents).
    private var chunk: GatheredChunk? = nil

    private struct GatheredChunk: Sendable {
        /// The frame's header and the CHUNK's fields.
        var prefix: ByteBuffer
        var data: ByteBuffer
        /// The data's length, from the frame's.
        let dataLength: Int

        var missing: Int { self.dataLength - self.data.readableBytes }
    }

    public init(decoder: FrameDecoder = FrameDecoder()) {
        self.decoder = decoder
    }

    /// The largest frame accepted; raise it once this side has announced its limit (SPEC §1.3).
    public var maxFrameSize: Int {
        get { self.decoder.maxFrameSize }
        set { self.decoder.maxFrameSize = newValue }
    }

    /// Whether bytes of a frame that has not fully arrived are held.
    public var hasPartialFrame: Bool { self.chunk != nil || (self.buffer?.readableBytes ?? 0) > 0 }

    /// Adds bytes read from the connection.
    ///
    /// A read that starts with no frame in pieces is kept as it is (a frame wholly inside it is never copied). A frame
    /// that arrives in pieces is gathered in a buffer of its own, sized for the whole frame from its length (a CHUNK's
    /// data in one sized for the data alone): each of its bytes is copied once, with no compaction of a larger buffer and
    /// no copy-on-write of one whose earlier frames' payloads are still in use.
    public mutating func append(_ bytes: ByteBuffer) {
        var bytes = bytes
        if var chunk = self.chunk {
            self.chunk = nil
            var taken = bytes.readSlice(length: min(chunk.missing, bytes.readableBytes))!
            chunk.data.writeBuffer(&taken)
            self.chunk = chunk
            guard bytes.readableBytes > 0 else { return }
            // Bytes after the chunk: frames of their own, after it.
            self.buffer = bytes
            return
        }
        guard var buffer = self.buffer, buffer.readableBytes > 0 else {
            self.buffer = bytes
            return
        }
        self.buffer = nil
        if let chunk = self.gatherChunk(&buffer, &bytes) {
            self.chunk = chunk
            if bytes.readableBytes > 0 { self.buffer = bytes }
            return
        }
        if buffer.readerIndex > 0 || buffer.writableBytes < bytes.readableBytes {
            buffer = Self.owned(buffer, capacity: max(self.announcedLength(buffer), buffer.readableBytes + bytes.readableBytes))
        }
        buffer.writeBuffer(&bytes)
        self.buffer = buffer
    }

    /// A CHUNK in pieces (`partial` holds the start of the frame, `bytes` what came next), started in two parts once its
    /// fields are in and it does not end in `bytes`: nil otherwise, or when it is no well-formed CHUNK so far (the
    /// decoder then says why, once it is whole). Takes from `bytes` what it gathers.
    private func gatherChunk(_ partial: inout ByteBuffer, _ bytes: inout ByteBuffer) -> GatheredChunk? {
        let start = partial.readerIndex
        guard let length = partial.getInteger(at: start, as: UInt32.self).map(Int.init), length <= self.decoder.maxFrameSize,
            partial.getInteger(at: start + 4, as: UInt8.self) == FrameType.chunk.rawValue,
            let flags = partial.getInteger(at: start + 5, as: UInt8.self)
        else { return nil }
        // Header, offset and CRC-32, and the raw length of a deflated chunk.
        let fields = FrameHeader.size + 12 + (flags & Frame.Chunk.deflatedFlag != 0 ? 4 : 0)
        let arrived = partial.readableBytes + bytes.readableBytes
        guard length > fields, partial.readableBytes < length, arrived >= fields, arrived < length else { return nil }
        var prefix = ByteBufferAllocator().buffer(capacity: fields)
        var head = partial.readSlice(length: min(fields, partial.readableBytes))!
        prefix.writeBuffer(&head)
        var rest = bytes.readSlice(length: fields - prefix.readableBytes)!
        prefix.writeBuffer(&rest)
        var data = ExactBuffer.make(capacity: length - fields)
        data.writeBuffer(&partial)
        data.writeBuffer(&bytes)
        return GatheredChunk(prefix: prefix, data: data, dataLength: length - fields)
    }

    /// The next whole frame, or nil until more bytes arrive. Throws a connection-scoped ``ProtocolError``.
    public mutating func next() throws -> Frame? {
        if let chunk = self.chunk {
            guard chunk.missing == 0 else { return nil }
            self.chunk = nil
            return try self.decoder.decodeGatheredChunk(prefix: chunk.prefix, data: chunk.data)
        }
        guard var buffer = self.buffer else { return nil }
        self.buffer = nil
        let frame: Frame?
        do {
            frame = try self.decoder.decodeFrame(from: &buffer)
        } catch {
            self.buffer = buffer
            throw error
        }
        guard let frame else {
            self.keep(partial: buffer)
            return nil
        }
        if buffer.readableBytes > 0 { self.buffer = buffer }
        guard case .chunk(var chunk) = frame else { return frame }
        chunk.data = ExactBuffer.copy(chunk.data)
        return .chunk(chunk)
    }

    /// The start of a frame, all that is left of the reads once no whole frame is: kept in memory of its own (a
    /// CHUNK's data already in a buffer of the data's size), so that nothing of the frames holds on to the buffer the
    /// reads came in. That buffer is TLS's, which it fills again with the next read: shared, it is copied first, at its
    /// whole capacity, and the copy it gave away stays alive as long as any slice of it (45 of a relay's 87 MB of heap
    /// with 100 agents sending thumbnails, held by the CHUNKs waiting for storage).
    private mutating func keep(partial: ByteBuffer) {
        guard partial.readableBytes > 0 else { return }
        var partial = partial
        var none = ByteBuffer()
        if let chunk = self.gatherChunk(&partial, &none) {
            self.chunk = chunk
            return
        }
        self.buffer = Self.owned(partial, capacity: max(self.announcedLength(partial), partial.readableBytes))
    }

    /// The length announced by the frame `partial` starts, bounded by what the decoder accepts (it refuses more once it
    /// looks); 0 before its four bytes are in.
    private func announcedLength(_ partial: ByteBuffer) -> Int {
        partial.getInteger(at: partial.readerIndex, as: UInt32.self).map { min(Int($0), self.decoder.maxFrameSize) } ?? 0
    }

    /// `bytes` copied into a buffer of their own of at least `capacity`.
    private static func owned(_ bytes: ByteBuffer, capacity: Int) -> ByteBuffer {
        var bytes = bytes
        var own = ByteBufferAllocator().buffer(capacity: capacity)
        own.writeBuffer(&bytes)
        return own
    }
}
