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
    public mutating func append(_ bytes: ByteBuffer) {
        if self.buffer == nil {
            self.buffer = bytes
        } else {
            var bytes = bytes
            self.buffer!.writeBuffer(&bytes)
        }
    }

    /// The next whole frame, or nil until more bytes arrive. Throws a connection-scoped ``ProtocolError``.
    public mutating func next() throws -> Frame? {
        guard var buffer = self.buffer else { return nil }
        self.buffer = nil
        defer {
            if buffer.readableBytes > 0 {
                if buffer.readerIndex > 1 << 20 { buffer.discardReadBytes() }
                self.buffer = buffer
            }
        }
        return try self.decoder.decodeFrame(from: &buffer)
    }
}
