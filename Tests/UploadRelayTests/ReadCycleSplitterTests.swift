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

    /// `count` bytes of plaintext from the client, as the ciphertext it would send.
    static func ciphertext(of count: Int, from client: EmbeddedChannel) throws -> ByteBuffer {
        client.writeAndFlush(ByteBuffer(repeating: 7, count: count), promise: nil)
        var all = ByteBuffer()
        while var bytes = try client.readOutbound(as: ByteBuffer.self) { all.writeBuffer(&bytes) }
        return all
    }

    @Test("two reads in one cycle: the first read's plaintext is handed on before the second read, each with its end")
    func plaintextPerRead() throws {
        let (client, server, recorder) = try Self.connectedPair(split: true)
        defer { Self.close(client, server) }
        let size = 192 << 10
        var ciphertext = try Self.ciphertext(of: size, from: client)
        let half = ciphertext.readableBytes / 2
        let first = try #require(ciphertext.getSlice(at: ciphertext.readerIndex, length: half))
        ciphertext.moveReaderIndex(forwardBy: half)
        server.pipeline.fireChannelRead(first)
        let afterFirst = recorder.plaintext
        // Three records of 16 KiB at least: half of 192 KiB of ciphertext holds five whole ones.
        #expect(afterFirst >= 48 << 10)
        #expect(afterFirst <= first.readableBytes)
        #expect(recorder.events.last == .complete)
        server.pipeline.fireChannelRead(ciphertext)
        server.pipeline.fireChannelReadComplete()
        #expect(recorder.plaintext == size)
        // Every plaintext read ends its own cycle, and the socket's cycle end adds none.
        #expect(recorder.events.filter { $0 == .complete }.count == 2)
        #expect(recorder.events.last == .complete)
    }

    @Test("without the splitter, TLS holds a cycle's plaintext until its end (the behaviour the splitter changes)")
    func plaintextPerCycleWithout() throws {
        let (client, server, recorder) = try Self.connectedPair(split: false)
        defer { Self.close(client, server) }
        let size = 192 << 10
        var ciphertext = try Self.ciphertext(of: size, from: client)
        let half = ciphertext.readableBytes / 2
        let first = try #require(ciphertext.getSlice(at: ciphertext.readerIndex, length: half))
        ciphertext.moveReaderIndex(forwardBy: half)
        server.pipeline.fireChannelRead(first)
        #expect(recorder.plaintext == 0)
        server.pipeline.fireChannelRead(ciphertext)
        server.pipeline.fireChannelReadComplete()
        #expect(recorder.plaintext == size)
        #expect(recorder.events.filter { $0 == .complete }.count == 1)
    }
}
