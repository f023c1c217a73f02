#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
@_spi(CustomByteBufferAllocator) import NIOCore

/// Buffers of exactly the size asked for. `ByteBufferAllocator.buffer(capacity:)` rounds every capacity up to a power
/// of two, so a CHUNK of 327 KiB (an agent sends what its credit allows, and a connection's share of the relay's memory
/// is rarely a power of two) would take 512 KiB, and the chunk data a relay holds could reach half again what the
/// windows allow. These come from malloc at their size, through NIO's allocator hooks
/// (an SPI of NIOCore's, `CustomByteBufferAllocator`; growing one beyond its size reallocates as usual).
enum ExactBuffer {
    static let allocator = ByteBufferAllocator(
        allocate: { size in malloc(max(1, size)) },
        reallocate: { pointer, _, size in realloc(pointer, max(1, size)) },
        deallocate: { pointer in free(pointer) },
        copy: { destination, source, count in destination.copyMemory(from: source, byteCount: count) }
    )

    /// An empty buffer with room for exactly `capacity` bytes.
    static func make(capacity: Int) -> ByteBuffer {
        guard capacity > 0, let memory = malloc(capacity) else { return ByteBuffer() }
        return ByteBuffer(
            takingOwnershipOf: UnsafeMutableRawBufferPointer(start: memory, count: capacity), allocator: Self.allocator,
            readerIndex: 0, writerIndex: 0)
    }

    /// `bytes`' readable bytes, copied into a buffer of exactly their size.
    static func copy(_ bytes: ByteBuffer) -> ByteBuffer {
        var bytes = bytes
        var own = Self.make(capacity: bytes.readableBytes)
        own.writeBuffer(&bytes)
        return own
    }
}
