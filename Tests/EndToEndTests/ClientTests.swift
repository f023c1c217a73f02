import Foundation
import NIOConcurrencyHelpers
import NIOCore
import Testing
import UploadAgent
import UploadChecksums
import UploadTestSupport

/// The Swift API (`UploadClient`, `BlockingUploadClient`) with sources of the caller's own, against a real relay over
/// TLS in this process.
@Suite("End to end: the Swift API", .serialized)
struct ClientTests {
    @Test("a custom source that invalidates itself twice mid-upload is reopened and stored byte for byte")
    func invalidatedTwice() async throws {
        let relay = try await TestRelay().start()
        let client = UploadClient(configuration: configuration(relay))
        let size = 24 << 20
        let source = PatternSource(size: size, invalidateAt: [8 << 20, 16 << 20])
        let upload = client.upload(source, key: "generated/pattern.bin", dedup: false)
        var seen: [UploadProgress] = []
        for await progress in upload.progress { seen.append(progress) }
        let result = try await upload.result
        #expect(result.status == .stored)
        #expect(result.bytes == UInt64(size))
        #expect(source.reopens == 2)
        #expect(relay.stored("generated/pattern.bin") == PatternSource.bytes(0..<size))
        // Progress only moves forward and ends with every byte durable.
        #expect(zip(seen, seen.dropFirst()).allSatisfy { $0.acknowledged <= $1.acknowledged })
        #expect(seen.last?.acknowledged == UInt64(size))
        #expect(seen.last?.fractionAcknowledged == 1)
        try await client.shutdown()
        await relay.stop()
    }

    @Test("a source reopened with another fingerprint stops its upload, and nothing is committed")
    func reopenedAsSomethingElse() async throws {
        let relay = try await TestRelay().start()
        let client = UploadClient(configuration: configuration(relay))
        let source = PatternSource(size: 6 << 20, invalidateAt: [3 << 20], fingerprintAfterReopen: [9, 9, 9])
        let failure = await #expect(throws: UploadFailure.self) {
            try await client.upload(source, key: "swapped.bin", dedup: false).result
        }
        #expect(failure?.result.error?.contains("different fingerprint") == true, "\(failure?.description ?? "")")
        #expect(relay.stored("swapped.bin") == nil)
        try await client.shutdown()
        await relay.stop()
    }

    @Test("a source that stays invalid fails after the configured reopens in a row")
    func alwaysInvalid() async throws {
        let relay = try await TestRelay().start()
        var configuration = configuration(relay)
        configuration.maxReopensInARow = 2
        let client = UploadClient(configuration: configuration)
        let source = PatternSource(size: 1 << 20, invalidateAt: [4096], forever: true)
        let failure = await #expect(throws: UploadFailure.self) {
            try await client.upload(source, key: "stuck.bin", dedup: false).result
        }
        #expect(failure?.result.error?.contains("after 2 reopen(s)") == true, "\(failure?.description ?? "")")
        #expect(source.reopens == 2)
        #expect(relay.stored("stuck.bin") == nil)
        try await client.shutdown()
        await relay.stop()
    }

    @Test("30 uploads at once through one client, one of them a stream, all stored; a second upload of a busy key is refused")
    func manyAtOnce() async throws {
        let relay = try await TestRelay().start()
        let client = UploadClient(configuration: configuration(relay))
        let uploads = (0..<30).map { i in
            client.upload(PatternSource(size: 1000 * i + 1, seekable: i != 7), key: "many/\(i)")
        }
        let duplicate = client.upload(PatternSource(size: 10), key: "many/3")
        let refused = await duplicate.outcome
        #expect(refused.status == .failed)
        #expect(refused.error?.contains("already under way") == true)
        for (i, upload) in uploads.enumerated() {
            let result = try await upload.result
            #expect(result.bytes == UInt64(1000 * i + 1))
            #expect(relay.stored("many/\(i)") == PatternSource.bytes(0..<(1000 * i + 1)))
        }
        try await client.shutdown()
        await relay.stop()
    }

    @Test("cancel stops an upload under way: its result says so and nothing is committed; the client goes on")
    func cancel() async throws {
        let relay = try await TestRelay().start()
        let client = UploadClient(configuration: configuration(relay))
        let source = PatternSource(size: 8 << 20, stallAt: 4 << 20)
        let upload = client.upload(source, key: "cancelled.bin", dedup: false)
        for await progress in upload.progress where progress.sent >= 2 << 20 {
            upload.cancel()
            break
        }
        source.release()
        let failure = await #expect(throws: UploadFailure.self) { try await upload.result }
        #expect(failure?.result.error?.contains("cancelled") == true, "\(failure?.description ?? "")")
        #expect(relay.stored("cancelled.bin") == nil)
        // The same key goes up afterwards on the same client.
        let again = try await client.upload(PatternSource(size: 5000), key: "cancelled.bin").result
        #expect(again.status == .stored)
        try await client.shutdown()
        await relay.stop()
    }

    @Test("the blocking client uploads from a thread of its own, with progress")
    func blocking() async throws {
        let relay = try await TestRelay().start()
        let client = BlockingUploadClient(configuration: configuration(relay))
        let steps = NIOLockedValueBox(0)
        let result: Result<UploadResult, any Error> = await withCheckedContinuation { continuation in
            Thread.detachNewThread {
                let outcome = Result {
                    try client.upload(PatternSource(size: 3 << 20), key: "blocking.bin", progress: { _ in steps.withLockedValue { $0 += 1 } })
                }
                try? client.shutdown()
                continuation.resume(returning: outcome)
            }
        }
        #expect(try result.get().status == .stored)
        #expect(steps.withLockedValue { $0 } > 0)
        #expect(relay.stored("blocking.bin") == PatternSource.bytes(0..<(3 << 20)))
        await relay.stop()
    }

    @Test("Examples/JoinedUpload: three pieces go up as one object, byte for byte; a missing piece exits 1 naming it")
    func joinedExample() async throws {
        let relay = try await TestRelay().start()
        let binary = packageRoot + "/.build/debug/upload-joined"
        try #require(FileManager.default.isExecutableFile(atPath: binary), "\(binary) is missing: run `swift build` first (tools/test does)")
        let directory = TestRelay.makeDirectory()
        let pieces = [3 << 20, 1, 2 << 20 + 5].enumerated().map {
            makeFile(directory, "CLIP000\($0.offset + 1).MP4", size: $0.element, seed: UInt64($0.offset))
        }
        let environment = ["UPLOAD_RELAY": "127.0.0.1:\(relay.port)", "UPLOAD_TOKEN": relay.token, "UPLOAD_CA": relay.caPath]
        let run = try await CommandLineTests.run(binary, ["clips/joined.mp4"] + pieces.map(\.path), environment: environment)
        #expect(run.status == 0, "\(run.stderr)")
        let joined = pieces.reduce(Data()) { $0 + $1.data }
        #expect(relay.stored("clips/joined.mp4") == joined)
        #expect(
            run.stdout.contains("stored clips/joined.mp4 \(joined.count) bytes sha1 \(SHA1.hash(joined).map { String(format: "%02x", $0) }.joined())")
        )
        #expect(run.stderr.contains("100% on the relay"))
        let missing = try await CommandLineTests.run(
            binary, ["clips/missing.mp4", pieces[0].path, directory + "/CLIP0009.MP4"], environment: environment)
        #expect(missing.status == 1)
        #expect(missing.stderr.contains("CLIP0009.MP4"), "\(missing.stderr)")
        #expect(relay.stored("clips/missing.mp4") == nil)
        await relay.stop()
    }

    private func configuration(_ relay: TestRelay) -> AgentConfiguration {
        var configuration = AgentConfiguration(relayHost: "127.0.0.1", relayPort: relay.port, token: relay.token, caPath: relay.caPath)
        configuration.retryFor = .seconds(20)
        return configuration
    }
}

/// Generated bytes (a function of the offset), that can invalidate itself at given offsets, come back as something
/// else, or stall at an offset until released: a source the way an app writes one.
final class PatternSource: BlobSource, @unchecked Sendable {
    let size: Int
    let isSeekable: Bool
    private let lock = NSCondition()
    private var pendingInvalidations: [Int]
    private let forever: Bool
    private let fingerprintAfterReopen: [UInt8]?
    private var stallAt: Int?
    private var reopened = 0

    init(
        size: Int, seekable: Bool = true, invalidateAt: [Int] = [], forever: Bool = false, fingerprintAfterReopen: [UInt8]? = nil, stallAt: Int? = nil
    ) {
        self.size = size
        self.isSeekable = seekable
        self.pendingInvalidations = invalidateAt
        self.forever = forever
        self.fingerprintAfterReopen = fingerprintAfterReopen
        self.stallAt = stallAt
    }

    /// The pattern repeats every 65,521 bytes (a prime, so it never lines up with chunks or reads).
    private static let period = 65_521
    private static let table: [UInt8] = (0..<period).map { UInt8(truncatingIfNeeded: ($0 &* 2_654_435_761) >> 13 ^ $0) }

    static func bytes(_ range: Range<Int>) -> Data {
        var data = Data(capacity: range.count)
        var position = range.lowerBound
        while position < range.upperBound {
            let start = position % Self.period
            let count = min(Self.period - start, range.upperBound - position)
            Self.table[start..<(start + count)].withUnsafeBytes { data.append(contentsOf: $0) }
            position += count
        }
        return data
    }

    var displayName: String { "pattern(\(self.size))" }
    var reopens: Int { self.lock.withLock { self.reopened } }

    func open() throws -> SourceInfo {
        SourceInfo(size: self.isSeekable ? UInt64(self.size) : nil, fingerprint: [1, 2, 3])
    }

    /// A read that reaches the stall offset returns the bytes before it; one that starts there waits for ``release()``.
    func read(at offset: UInt64, maxLength: Int, allocator: ByteBufferAllocator) throws -> ByteBuffer {
        let start = Int(offset)
        var end = min(self.size, start + maxLength)
        try self.lock.withLock {
            if let next = self.pendingInvalidations.first, next < end {
                if !self.forever { self.pendingInvalidations.removeFirst() }
                throw SourceInvalidated("the generator was replaced at \(next)")
            }
            while let stall = self.stallAt, stall <= start {
                self.lock.wait()
            }
            if let stall = self.stallAt, stall < end { end = stall }
        }
        var buffer = allocator.buffer(capacity: max(0, end - start))
        buffer.writeBytes(Self.bytes(start..<max(start, end)))
        return buffer
    }

    func reopen() throws -> SourceInfo {
        self.lock.withLock { self.reopened += 1 }
        return SourceInfo(size: self.isSeekable ? UInt64(self.size) : nil, fingerprint: self.fingerprintAfterReopen ?? [1, 2, 3])
    }

    /// Lets a stalled read go on.
    func release() {
        self.lock.withLock {
            self.stallAt = nil
            self.lock.broadcast()
        }
    }

    func close() {}
}
