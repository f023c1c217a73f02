import Foundation
import NIOCore
import NIOEmbedded
import NIOSSL
import Testing

@testable import UploadRelay

/// ``ReadCycleSplitter`` before a real NIOSSL server handler: the plaintext of each read from the socket is handed on
/// before the next read, so TLS's plaintext buffer holds one read's worth, not a wakeup's.
@Suite("Read cycles before TLS")
struct ReadCycleSplitterTests {
    /// What reaches the handler after TLS: plaintext reads (their sizes) and read-cycle ends.
    final class Recorder: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        enum Event: Equatable {
            case read(Int)
            case complete
        }
        var events: [Event] = []
        var plaintext: Int { self.events.reduce(0) { if case .read(let n) = $1 { $0 + n } else { $0 } } }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            self.events.append(.read(self.unwrapInboundIn(data).readableBytes))
        }

        func channelReadComplete(context: ChannelHandlerContext) {
            self.events.append(.complete)
        }
    }

    /// A client and a server channel with TLS between them, handshake done; the server's pipeline has the splitter
    /// when `split`.
    static func connectedPair(split: Bool) throws -> (client: EmbeddedChannel, server: EmbeddedChannel, recorder: Recorder) {
        // The relay's own --dev certificate, made in a directory removed at once.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("read-cycles-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let paths = DevCertificates.Paths(dataDirectory: directory)
        try DevCertificates.ensure(paths)
        let serverConfiguration = TLSConfiguration.makeServerConfiguration(
            certificateChain: try NIOSSLCertificate.fromPEMFile(paths.serverCertificate).map { .certificate($0) },
            privateKey: .privateKey(try NIOSSLPrivateKey(file: paths.serverKey, format: .pem))
        )
        var clientConfiguration = TLSConfiguration.makeClientConfiguration()
        clientConfiguration.certificateVerification = .none
        clientConfiguration.trustRoots = .certificates([])
        let client = EmbeddedChannel()
        let server = EmbeddedChannel()
        let recorder = Recorder()
        if split { try server.pipeline.syncOperations.addHandler(ReadCycleSplitter()) }
        try server.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: NIOSSLContext(configuration: serverConfiguration)))
        try server.pipeline.syncOperations.addHandler(recorder)
        try client.pipeline.syncOperations.addHandler(
            NIOSSLClientHandler(context: NIOSSLContext(configuration: clientConfiguration), serverHostname: nil)
        )
        let address = try SocketAddress(ipAddress: "127.0.0.1", port: 1)
        try server.connect(to: address).wait()
        try client.connect(to: address).wait()
        // The handshake: bytes back and forth until neither side has any to send.
        var moved = true
        while moved {
            moved = false
            while let bytes = try client.readOutbound(as: ByteBuffer.self) {
                try server.writeInbound(bytes)
                moved = true
            }
            while let bytes = try server.readOutbound(as: ByteBuffer.self) {
                try client.writeInbound(bytes)
                moved = true
            }
        }
        recorder.events.removeAll()
        return (client, server, recorder)
    }

    /// Closes both channels. TLS waits for the peer's close_notify, which never comes here, until its shutdown
    /// timeout: the embedded loop's clock is moved past it.
    static func close(_ channels: EmbeddedChannel...) {
        for channel in channels {
            channel.close(promise: nil)
            channel.embeddedEventLoop.advanceTime(by: .minutes(10))
            _ = try? channel.finish(acceptAlreadyClosed: true)
        }
    }

    /// What the handler after TLS saw of one read cycle of two socket reads: 192 KiB of plaintext from the client, its
    /// ciphertext fed to the server in two halves, then the cycle's end.
    struct TwoReads {
        static let size = 192 << 10
        /// The first read's ciphertext bytes.
        var firstRead: Int
        /// The plaintext handed on before the second read.
        var afterFirst: Int
        /// Whether the first read's plaintext came with its own cycle end.
        var firstEnded: Bool
        var events: [Recorder.Event]
        var plaintext: Int
    }

    static func twoReads(split: Bool) throws -> TwoReads {
        let (client, server, recorder) = try Self.connectedPair(split: split)
        defer { Self.close(client, server) }
        client.writeAndFlush(ByteBuffer(repeating: 7, count: TwoReads.size), promise: nil)
        var ciphertext = ByteBuffer()
        while var bytes = try client.readOutbound(as: ByteBuffer.self) { ciphertext.writeBuffer(&bytes) }
        let half = ciphertext.readableBytes / 2
        let first = try #require(ciphertext.getSlice(at: ciphertext.readerIndex, length: half))
        ciphertext.moveReaderIndex(forwardBy: half)
        server.pipeline.fireChannelRead(first)
        let afterFirst = recorder.plaintext
        let firstEnded = recorder.events.last == .complete
        server.pipeline.fireChannelRead(ciphertext)
        server.pipeline.fireChannelReadComplete()
        return TwoReads(
            firstRead: half, afterFirst: afterFirst, firstEnded: firstEnded, events: recorder.events, plaintext: recorder.plaintext)
    }

    @Test("two reads in one cycle: the first read's plaintext is handed on before the second read, each with its end")
    func plaintextPerRead() throws {
        let seen = try Self.twoReads(split: true)
        // Three records of 16 KiB at least: half of 192 KiB of ciphertext holds five whole ones.
        #expect(seen.afterFirst >= 48 << 10)
        #expect(seen.afterFirst <= seen.firstRead)
        #expect(seen.firstEnded)
        #expect(seen.plaintext == TwoReads.size)
        // Every plaintext read ends its own cycle, and the socket's cycle end adds none.
        #expect(seen.events.filter { $0 == .complete }.count == 2)
        #expect(seen.events.last == .complete)
    }

    @Test("without the splitter, TLS holds a cycle's plaintext until its end (the behaviour the splitter changes)")
    func plaintextPerCycleWithout() throws {
        let seen = try Self.twoReads(split: false)
        #expect(seen.afterFirst == 0)
        #expect(seen.plaintext == TwoReads.size)
        #expect(seen.events.filter { $0 == .complete }.count == 1)
    }
}
