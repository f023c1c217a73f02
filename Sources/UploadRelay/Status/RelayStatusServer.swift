import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import ServiceLifecycle

/// The HTTPS status endpoint (``StatusEndpoint``): a `Service` beside ``RelayServer``, on the same certificate, event
/// loops, I/O pool and catalog. A graceful shutdown closes its listener and its connections at once (its answers are
/// reads: nothing is lost).
public final class RelayStatusServer: Service, Sendable {
    private let relay: Relay
    private let endpoint: StatusEndpoint
    private let group: any EventLoopGroup
    private let tls: NIOLockedValueBox<NIOSSLContext?>
    private let lifecycle: ListenerLifecycle

    /// HTTP/1.1 only: the ALPN name agents' TLS stacks and HTTP clients offer for it.
    public static let alpn = "http/1.1"

    public init(relay: Relay, endpoint: StatusEndpoint, group: any EventLoopGroup) throws {
        self.relay = relay
        self.endpoint = endpoint
        self.group = group
        self.tls = NIOLockedValueBox(try Self.makeTLSContext(relay.configuration, endpoint: endpoint))
        self.lifecycle = ListenerLifecycle(
            maxConnections: endpoint.maxConnections,
            strangers: StrangerLimits(
                perSource: min(endpoint.maxConnectionsPerSource, endpoint.maxConnections), total: endpoint.maxConnections, evictsOldest: false))
    }

    private static func makeTLSContext(_ configuration: RelayConfiguration, endpoint: StatusEndpoint) throws -> NIOSSLContext? {
        guard endpoint.tls else { return nil }
        var tls = try RelayServer.tlsConfiguration(configuration)
        tls.applicationProtocols = [Self.alpn]
        // A client that does not answer the relay's close_notify holds its place this long at most after the close.
        tls.shutdownTimeout = TimeAmount(endpoint.tlsShutdownTimeout)
        return try NIOSSLContext(configuration: tls)
    }

    /// Reads the certificate and key again (see ``RelayServer/reloadCertificate()``); a plain-HTTP endpoint has none.
    public func reloadCertificate() throws {
        let context = try Self.makeTLSContext(self.relay.configuration, endpoint: self.endpoint)
        self.tls.withLockedValue { $0 = context }
    }

    /// Waits until the endpoint listens, and returns where.
    public func waitUntilListening() async throws -> SocketAddress {
        try await self.lifecycle.waitUntilListening()
    }

    /// Binds the listener (once; later calls return where it listens), so that an address in use fails the relay's
    /// start rather than leaving it up without its endpoint. ``run()`` binds it when this was not called.
    @discardableResult
    public func bind() async throws -> SocketAddress {
        try await self.listen().address
    }

    private func listen() async throws -> (listener: any Channel, address: SocketAddress) {
        let endpoint = self.endpoint
        let tls = self.tls
        let space = self.relay.space
        let responder = StatusResponder(catalog: self.relay.catalog, logger: self.relay.logger, storageFull: { space.isFull })
        let (metrics, health, executor) = (self.relay.metrics, self.relay.health, self.relay.executor)
        let logger = self.relay.logger
        let lifecycle = self.lifecycle
        let name = endpoint.routes.contains(.status) ? "status" : "operations"
        let refusals = BoundedLog(logger: logger)
        return try await lifecycle.listen {
            let listener = try await ServerBootstrap(group: self.group)
                .serverChannelOption(.backlog, value: 128)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
                // One socket read per read the handler lets through: what a client sends ahead is taken a piece at a time.
                .childChannelOption(.maxMessagesPerRead, value: 1)
                .childChannelInitializer { channel in
                    if let refusal = lifecycle.admit(channel) {
                        metrics.refused(refusal, listener: name)
                        refusals.warning(refusal.description, metadata: ["listener": "\(name)"])
                        return channel.close()
                    }
                    return channel.eventLoop.makeCompletedFuture {
                        let sync = channel.pipeline.syncOperations
                        if let tls = tls.withLockedValue({ $0 }) { try sync.addHandler(NIOSSLServerHandler(context: tls)) }
                        var limits = NIOHTTPDecoderLimitConfiguration()
                        limits.maxHeaderFieldSize = endpoint.maxHeadBytes
                        limits.maxHeaderListSize = endpoint.maxHeadBytes
                        limits.maxHeaderFieldCount = endpoint.maxHeaders
                        // The HTTP/1.1 codec, its buffer bounded (NIO's pipeline set-up leaves it unbounded, and the
                        // decoder keeps every byte after a CONNECT or an Upgrade); unreadable requests are refused by
                        // StatusHTTPHandler, with the reason in JSON as every refusal.
                        try sync.addHandler(HTTPResponseEncoder(configuration: .init()))
                        try sync.addHandler(
                            ByteToMessageHandler(
                                HTTPRequestDecoder(
                                    leftOverBytesStrategy: .dropBytes, informationalResponseStrategy: .drop, limitConfiguration: limits),
                                maximumBufferSize: endpoint.maxBufferedBytes
                            )
                        )
                        try sync.addHandler(NIOHTTPResponseHeadersValidator())
                        try sync.addHandler(StatusHTTPHandler(endpoint: endpoint, responder: responder, health: health, executor: executor))
                    }
                }
                .bind(host: endpoint.host, port: endpoint.port)
                .get()
            logger.info(
                endpoint.routes.contains(.status) ? "status endpoint listening" : "operations endpoint listening (/metrics, /healthz, /readyz)",
                metadata: ["address": "\(listener.localAddress.map { "\($0)" } ?? "?")"]
            )
            return listener
        }
    }

    public func run() async throws {
        let listener = try await self.listen().listener
        try await withTaskCancellationOrGracefulShutdownHandler {
            try await listener.closeFuture.get()
        } onCancelOrGracefulShutdown: {
            self.shutdown()
        }
        for connection in self.lifecycle.finish() { connection.close(promise: nil) }
    }

    /// Closes the listener; ``run()`` then closes the connections and returns. Calling this again does nothing.
    public func shutdown() {
        self.lifecycle.stopNow()
    }
}
