import NIOCore

/// Collects bytes as they arrive from a connection and hands out whole frames (SPEC §1).
///
/// Wraps a ``FrameDecoder`` with the cumulation buffer a channel handler needs: append each read,
/// then call ``next()`` until it returns nil. Frame payloads are slices of that buffer.
public struct FrameReader: Sendable {
    public var decoder: FrameDecoder
    private var buffer: ByteBuffer? = nil

    public init(decoder: FrameDecoder = FrameDecoder()) {
        self.decoder = decoder
    }

    /// The largest frame accepted; raise it once this side has announced its limit (SPEC §1.3).
    public var maxFrameSize: Int {
        get { self.decoder.maxFrameSize }
        set { self.decoder.maxFrameSize = newValue }
    }

    /// Whether bytes of a frame that has not fully arrived are held.
    public var hasPartialFrame: Bool { (self.buffer?.readableBytes ?? 0) > 0 }

    /// Adds bytes read from the connection.
    ///
    /// A read that starts with no frame in pieces is kept as it is (a frame wholly inside it is never copied). A frame
    /// that arrives in pieces is gathered in a buffer of its own, sized for the whole frame from its length: each of
    /// its bytes is copied once, with no compaction of a larger buffer and no copy-on-write of one whose earlier frames'
    /// payloads are still in use.
    public mutating func append(_ bytes: ByteBuffer) {
        guard var buffer = self.buffer, buffer.readableBytes > 0 else {
            self.buffer = bytes
            return
        }
        self.buffer = nil
        var bytes = bytes
        if buffer.readerIndex > 0 || buffer.writableBytes < bytes.readableBytes {
            // The frame's announced length, bounded by what the decoder accepts (it refuses more once it looks).
            let announced = buffer.getInteger(at: buffer.readerIndex, as: UInt32.self).map { min(Int($0), self.decoder.maxFrameSize) } ?? 0
            var gathered = ByteBufferAllocator().buffer(capacity: max(announced, buffer.readableBytes + bytes.readableBytes))
            gathered.writeBuffer(&buffer)
            buffer = gathered
        }
        buffer.writeBuffer(&bytes)
        self.buffer = buffer
    }

    /// The next whole frame, or nil until more bytes arrive. Throws a connection-scoped ``ProtocolError``.
    public mutating func next() throws -> Frame? {
        guard var buffer = self.buffer else { return nil }
        self.buffer = nil
        defer {
            if buffer.readableBytes > 0 {
                self.buffer = buffer
            }
        }
        return try self.decoder.decodeFrame(from: &buffer)
    }
}
