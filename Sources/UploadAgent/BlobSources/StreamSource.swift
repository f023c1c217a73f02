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
    /// Held for the whole of a read: reads of the descriptor never overlap.
    private let reading = NIOLock()
    private let closed = NIOLockedValueBox(false)
    /// How often a read waiting for input checks whether its upload ended.
    private static let pollMilliseconds: Int32 = 100

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
        // One read of the descriptor at a time; the state lock is never held while it blocks, so ACKs (on an event
        // loop) are never kept waiting by a source that has nothing to say yet.
        try self.reading.withLock {
            let wanted: Int
            switch try self.state.withLockedValue({ try self.plan($0, offset: offset, maxLength: maxLength) }) {
            case .retained(let slice): return slice
            case .nothing: return allocator.buffer(capacity: 0)
            case .fresh(let count): wanted = count
            }
            let (fresh, ended) = try self.readDescriptor(wanted, allocator: allocator)
            self.state.withLockedValue { state in
                state.retained.writeImmutableBuffer(fresh)
                if ended { state.ended = true }
            }
            return fresh
        }
    }

    private enum Plan {
        case retained(ByteBuffer)
        case nothing
        case fresh(Int)
    }

    private func plan(_ state: State, offset: UInt64, maxLength: Int) throws -> Plan {
        guard offset >= state.retainedStart else {
            throw SourceError("\(self.displayName) cannot go back to offset \(offset): bytes before \(state.retainedStart) are gone")
        }
        let end = state.retainedStart + UInt64(state.retained.readableBytes)
        if offset < end {
            let start = Int(offset - state.retainedStart)
            let length = min(maxLength, Int(end - offset))
            guard let slice = state.retained.getSlice(at: state.retained.readerIndex + start, length: length) else {
                throw SourceError("\(self.displayName): retained bytes \(offset)..<\(offset + UInt64(length)) are missing")
            }
            return .retained(slice)
        }
        guard offset == end else {
            throw SourceError("\(self.displayName) read at \(offset) skips past \(end)")
        }
        // At the end, or the retained bytes are at their limit (ACKs free room and pump again).
        let room = self.maxRetained - state.retained.readableBytes
        return state.ended || room <= 0 ? .nothing : .fresh(min(maxLength, room))
    }

    /// Reads up to `wanted` bytes: returns early when the stream pauses after some bytes came (they go out now), waits
    /// while none came, and gives up once ``close()`` was called.
    private func readDescriptor(_ wanted: Int, allocator: ByteBufferAllocator) throws -> (ByteBuffer, ended: Bool) {
        let fd = self.descriptor
        let name = self.displayName
        guard fd >= 0 else { throw SourceError("cannot read \(name): no file descriptor") }
        var fresh = allocator.buffer(capacity: wanted)
        var ended = false
        try fresh.writeWithUnsafeMutableBytes(minimumWritableBytes: wanted) { raw in
            guard let base = raw.baseAddress else { return 0 }
            var done = 0
            while done < wanted {
                var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                let ready = poll(&poller, 1, Self.pollMilliseconds)
                if ready < 0 && errno == EINTR { continue }
                guard ready >= 0 else { throw SourceError("cannot wait for \(name): \(String(cString: strerror(errno)))") }
                if ready == 0 {
                    if done > 0 { break }
                    if self.closed.withLockedValue({ $0 }) { throw SourceError("\(name) was closed while its upload waited for input") }
                    continue
                }
                let n = Glibc.read(fd, base + done, wanted - done)
                if n < 0 && (errno == EINTR || errno == EAGAIN) { continue }
                guard n >= 0 else { throw SourceError("cannot read \(name): \(String(cString: strerror(errno)))") }
                if n == 0 {
                    ended = true
                    break
                }
                done += n
            }
            return done
        }
        return (fresh, ended)
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

    /// The upload ended: a read still waiting for input gives up (the descriptor stays open; its owner closes it).
    public func close() {
        self.closed.withLockedValue { $0 = true }
    }
}
