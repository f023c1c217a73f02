#if canImport(Glibc)
import Glibc
#endif
import NIOConcurrencyHelpers
import NIOCore

/// A non-seekable stream such as stdin: size unknown until its end (SPEC §10).
///
/// It keeps every byte read but not yet acknowledged, at most ``maxRetained``, so an upload can
/// resume after a reconnect from the relay's durable offset. When the retained bytes reach the
/// limit the agent stops reading until ACKs arrive: memory stays bounded.
public final class StreamSource: BlobSource {
    public let displayName: String
    public var isSeekable: Bool { false }
    /// The most unacknowledged bytes kept for a resume.
    public let maxRetained: Int
    private let descriptor: Int32

    private struct State {
        /// Bytes from `retainedStart` up to what was read.
        var retained: ByteBuffer
        var retainedStart: UInt64 = 0
        var ended = false
    }

    private let state: NIOLockedValueBox<State>

    /// Reads from a file descriptor the caller owns (0 for stdin).
    public init(descriptor: Int32 = 0, displayName: String = "stdin", maxRetained: Int = 64 << 20) {
        self.descriptor = descriptor
        self.displayName = displayName
        self.maxRetained = maxRetained
        self.state = NIOLockedValueBox(State(retained: ByteBufferAllocator().buffer(capacity: 0)))
    }

    public func open() throws -> SourceInfo {
        SourceInfo(size: nil, fingerprint: [])
    }

    public func read(at offset: UInt64, maxLength: Int, allocator: ByteBufferAllocator) throws -> ByteBuffer {
        try self.state.withLockedValue { state in
            guard offset >= state.retainedStart else {
                throw SourceError("\(self.displayName) cannot go back to offset \(offset): bytes before \(state.retainedStart) are gone")
            }
            let end = state.retainedStart + UInt64(state.retained.readableBytes)
            if offset < end {
                let start = Int(offset - state.retainedStart)
                return state.retained.getSlice(at: state.retained.readerIndex + start, length: min(maxLength, Int(end - offset)))!
            }
            guard offset == end else {
                throw SourceError("\(self.displayName) read at \(offset) skips past \(end)")
            }
            if state.ended { return allocator.buffer(capacity: 0) }
            let room = self.maxRetained - state.retained.readableBytes
            guard room > 0 else { return allocator.buffer(capacity: 0) }
            var fresh = allocator.buffer(capacity: min(maxLength, room))
            let fd = self.descriptor
            let name = self.displayName
            try fresh.writeWithUnsafeMutableBytes(minimumWritableBytes: min(maxLength, room)) { raw in
                var done = 0
                let wanted = min(maxLength, room)
                while done < wanted {
                    let n = Glibc.read(fd, raw.baseAddress! + done, wanted - done)
                    if n < 0 && errno == EINTR { continue }
                    guard n >= 0 else { throw SourceError("cannot read \(name): \(String(cString: strerror(errno)))") }
                    if n == 0 { break }
                    done += n
                }
                return done
            }
            if fresh.readableBytes < min(maxLength, room) {
                state.ended = true
            }
            state.retained.writeImmutableBuffer(fresh)
            return fresh
        }
    }

    public func isEnd(at offset: UInt64) -> Bool {
        self.state.withLockedValue { $0.ended && offset >= $0.retainedStart + UInt64($0.retained.readableBytes) }
    }

    public func acknowledge(upTo offset: UInt64) {
        self.state.withLockedValue { state in
            guard offset > state.retainedStart else { return }
            let drop = min(Int(offset - state.retainedStart), state.retained.readableBytes)
            state.retained.moveReaderIndex(forwardBy: drop)
            state.retainedStart += UInt64(drop)
            if state.retained.readerIndex > 8 << 20 {
                state.retained.discardReadBytes()
            }
        }
    }

    public func close() {}
}
