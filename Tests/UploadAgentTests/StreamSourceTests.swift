import Foundation
import NIOConcurrencyHelpers
import NIOCore
import Testing

@testable import UploadAgent

/// StreamSource over a real pipe: a read waiting for input never holds up ACKs, a pause sends what came, and close
/// ends a wait that would otherwise last for ever.
@Suite("StreamSource", .timeLimit(.minutes(1)))
struct StreamSourceTests {
    @Test("an ACK while a read waits for input returns at once; the read then gets the bytes that came")
    func acknowledgeWhileReading() async throws {
        let pipe = Pipe()
        defer { try? pipe.fileHandleForWriting.close() }
        let source = StreamSource(descriptor: pipe.fileHandleForReading.fileDescriptor)
        pipe.fileHandleForWriting.write(Data(repeating: 7, count: 1000))
        let first = try source.read(at: 0, maxLength: 4096, allocator: ByteBufferAllocator())
        #expect(first.readableBytes == 1000, "a pause after 1000 bytes sends them instead of waiting for 4096")
        // A read that waits: nothing is written yet.
        let reader = Task.detached { try source.read(at: 1000, maxLength: 4096, allocator: ByteBufferAllocator()) }
        // With the reader blocked in the pipe, an ACK (what the event loop does) still goes through.
        source.acknowledge(upTo: 1000)
        #expect(!source.isEnd(at: 1000))
        pipe.fileHandleForWriting.write(Data(repeating: 8, count: 10))
        let second = try await reader.value
        #expect(Array(second.readableBytesView) == Array(repeating: 8, count: 10))
        try pipe.fileHandleForWriting.close()
        #expect(try source.read(at: 1010, maxLength: 4096, allocator: ByteBufferAllocator()).readableBytes == 0)
        #expect(source.isEnd(at: 1010))
        // Bytes before the ACK are gone; after it they are still there for a resume.
        #expect(throws: SourceError.self) { try source.read(at: 0, maxLength: 10, allocator: ByteBufferAllocator()) }
        #expect(try source.read(at: 1005, maxLength: 100, allocator: ByteBufferAllocator()).readableBytes == 5)
    }

    @Test("close ends a read that waits for input that never comes")
    func closeEndsWait() async throws {
        let pipe = Pipe()
        defer { try? pipe.fileHandleForWriting.close() }
        let source = StreamSource(descriptor: pipe.fileHandleForReading.fileDescriptor)
        let reader = Task.detached { try source.read(at: 0, maxLength: 4096, allocator: ByteBufferAllocator()) }
        source.close()
        await #expect(throws: SourceError.self) { try await reader.value }
    }
}
