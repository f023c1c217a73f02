import Logging
import NIOCore
import NIOEmbedded
import NIOTLS
import Testing
import UploadChecksums
import UploadPayload
import UploadProtocol
import UploadTestSupport

@testable import UploadRelay

/// ``RelayConnectionHandler`` on a `NIOAsyncTestingChannel`: it turns channel events into session inputs and runs the
/// actions it gets back, timers on the loop's clock and catalog and storage work on the real thread pool.
@Suite("Relay connection handler")
struct RelayConnectionHandlerTests {
    /// A handler on a testing channel, connected, TLS done with `alpn`.
    static func connectedChannel(_ backend: RelayBackend, alpn: String? = ProtocolLimits.alpn) async throws -> NIOAsyncTestingChannel {
        let channel = NIOAsyncTestingChannel()
        let dependencies = backend.relay.connectionDependencies
        try await channel.testingEventLoop.executeInContext {
            let handler = RelayConnectionHandler(
                dependencies: dependencies, logger: Logger(label: "handler-test"), eventLoop: channel.testingEventLoop)
            try channel.pipeline.syncOperations.addHandler(handler)
        }
        try await channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1))
        channel.pipeline.fireUserInboundEventTriggered(TLSUserEvent.handshakeCompleted(negotiatedProtocol: alpn))
        return channel
    }

    static func send(_ frames: Frame..., to channel: NIOAsyncTestingChannel) async throws {
        var bytes = ByteBuffer()
        for frame in frames { bytes.writeImmutableBuffer(FrameEncoder.encodeToBuffer(frame)) }
        try await channel.writeInbound(bytes)
    }

    /// The frames the handler writes, until one matches `last`.
    static func frames(from channel: NIOAsyncTestingChannel, until last: (Frame) -> Bool) async throws -> [Frame] {
        var reader = FrameReader()
        reader.maxFrameSize = ProtocolLimits().maxFrameSize
        var frames: [Frame] = []
        while true {
            reader.append(try await channel.waitForOutboundWrite(as: ByteBuffer.self))
            while let frame = try reader.next() {
                frames.append(frame)
                if last(frame) { return frames }
            }
        }
    }

    static let hello = Frame.hello(Frame.Hello(maxFrameSize: 65_536, features: [], credential: Array("good-token".utf8), agentName: "handler-test"))

    @Test("HELLO, OPEN, CHUNK, HASH: WELCOME after the catalog, OFFSET, and RESULT after storage on the pool, the object stored")
    func upload() async throws {
        let backend = try await RelayBackend()
        let channel = try await Self.connectedChannel(backend)
        try await Self.send(Self.hello, to: channel)
        let welcome = try await Self.frames(from: channel) { $0.type == .welcome }
        #expect(welcome.count == 1)

        let bytes = ByteBuffer(string: "hello, relay")
        let chunk = ChunkPayload.seal(bytes, streamID: 1, offset: 0, deflate: false)
        let sha1 = try #require(SHA1Digest(bytes: SHA1.hash(Array(bytes.readableBytesView))))
        try await Self.send(
            .open(Frame.Open(streamID: 1, key: "docs/h.txt", size: UInt64(bytes.readableBytes))),
            to: channel
        )
        let offset = try await Self.frames(from: channel) { $0.type == .offset }
        #expect(offset.last == .offset(Frame.Offset(streamID: 1, disposition: .start, offset: 0, resumeToken: Self.resumeToken(offset.last))))
        try await Self.send(.chunk(chunk), .hash(Frame.Hash(streamID: 1, size: UInt64(bytes.readableBytes), sha1: sha1)), to: channel)
        let answers = try await Self.frames(from: channel) { $0.type == .result }
        #expect(answers.last == .result(Frame.Result(streamID: 1, status: .stored, size: UInt64(bytes.readableBytes), sha1: sha1, key: "docs/h.txt")))
        await #expect(backend.object("docs/h.txt") == Array(bytes.readableBytesView))
        try await channel.close()
    }

    static func resumeToken(_ frame: Frame?) -> [UInt8] {
        if case .offset(let offset) = frame { return offset.resumeToken }
        return []
    }

    @Test("TLS without the protocol's ALPN id: closed before any frame is read or written")
    func wrongALPN() async throws {
        let backend = try await RelayBackend()
        let channel = try await Self.connectedChannel(backend, alpn: nil)
        try await channel.closeFuture.get()
        #expect(try await channel.readOutbound(as: ByteBuffer.self) == nil)
    }

    @Test("no HELLO within the handshake timeout: the timer on the loop's clock fires, ERROR TIMEOUT, closed")
    func handshakeTimeout() async throws {
        let backend = try await RelayBackend { $0.limits.handshakeTimeout = .seconds(5) }
        let channel = try await Self.connectedChannel(backend)
        await channel.testingEventLoop.advanceTime(by: .seconds(4))
        #expect(channel.isActive)
        await channel.testingEventLoop.advanceTime(by: .seconds(2))
        let frames = try await Self.frames(from: channel) { $0.type == .error }
        guard case .error(let error) = frames.last else {
            Issue.record("no ERROR: \(frames)")
            return
        }
        #expect(error.streamID == .connection && error.code == .timeout)
        try await channel.closeFuture.get()
    }
}
