import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import Testing
import UploadRelay
import UploadProtocol

/// Starting and stopping the relay in-process: the path every other test ends on.
@Suite("Relay lifecycle")
struct LifecycleTests {
    @Test("a connection that never says HELLO is closed after the handshake timeout")
    func handshakeTimeout() async throws {
        let relay = try await TestRelay { $0.limits.handshakeTimeout = .milliseconds(300) }.start()
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #expect(fd >= 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(relay.port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        #expect(connected == 0)
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        // Silent client: the relay must hang up on its own (read returns 0 or a reset, not a timeout).
        var byte: UInt8 = 0
        let started = Date()
        var n = 0
        repeat { n = read(fd, &byte, 1) } while n > 0
        #expect(n == 0 || errno == ECONNRESET, "read ended with errno \(errno)")
        #expect(Date().timeIntervalSince(started) < 9)
        close(fd)
        await relay.stop()
    }

    @Test("a relay that cannot bind says why to whoever waits for it to listen, instead of leaving them waiting", .timeLimit(.minutes(1)))
    func bindFailureReachesWaiters() async throws {
        let first = try await TestRelay().start()
        let second = try await TestRelay { $0.port = first.port }
        let server = second.server
        let waiter = Task { try await server.waitUntilListening() }
        await #expect(throws: (any Error).self) { try await second.server.run() }
        await #expect(throws: (any Error).self) { _ = try await waiter.value }
        // Asked after the failure, too.
        await #expect(throws: (any Error).self) { _ = try await second.server.waitUntilListening() }
        await second.stop()
        await first.stop()
    }

    @Test(
        "stop ends run(), closes every connection and frees the port: idle, or with a peer silent after TLS",
        .timeLimit(.minutes(2))
    )
    func stopCycles() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        for round in 0..<12 {
            let relay = try await TestRelay().start()
            // Odd rounds: a peer whose TLS handshake completed (so the relay admitted it) and that never says HELLO.
            let peer = round.isMultiple(of: 2) ? nil : try await SilentPeer.connect(port: relay.port, ca: relay.caPath, group: group)
            await relay.stop()
            if let peer {
                // The relay closed the connection; this would hang (and the time limit fail the test) if it had not.
                try await peer.closeFuture.get()
            }
            await #expect(throws: (any Error).self, "round \(round): the port still accepts after stop") {
                try await ClientBootstrap(group: group).connect(host: "127.0.0.1", port: relay.port).get().close()
            }
        }
        try await group.shutdownGracefully()
    }
}

/// A TLS client that completes its handshake with the relay and then says nothing.
enum SilentPeer {
    static func connect(port: Int, ca: String, group: any EventLoopGroup, alpn: String = RelayServer.alpn) async throws -> any Channel {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .file(ca)
        tls.applicationProtocols = [alpn]
        let context = try NIOSSLContext(configuration: tls)
        let handshake = group.next().makePromise(of: Void.self)
        let channel = try await ClientBootstrap(group: group)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: context, serverHostname: "localhost"))
                    try channel.pipeline.syncOperations.addHandler(HandshakeWatcher(promise: handshake))
                }
            }
            .connect(host: "127.0.0.1", port: port)
            .get()
        try await handshake.futureResult.get()
        return channel
    }

    final class HandshakeWatcher: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let promise: EventLoopPromise<Void>
        init(promise: EventLoopPromise<Void>) { self.promise = promise }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if case .handshakeCompleted = event as? TLSUserEvent {
                self.promise.succeed(())
            }
            context.fireUserInboundEventTriggered(event)
        }

        func channelInactive(context: ChannelHandlerContext) {
            self.promise.fail(ChannelError.eof)
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            self.promise.fail(error)
            context.close(promise: nil)
        }
    }
}
