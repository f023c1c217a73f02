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
    private let services: RelayServices
    private let endpoint: StatusEndpoint
    private let group: any EventLoopGroup
    private let tls: NIOLockedValueBox<NIOSSLContext?>
    private let state = NIOLockedValueBox<State>(.starting(waiting: [], stopRequested: false))

    private enum State {
        case starting(waiting: [CheckedContinuation<SocketAddress, any Error>], stopRequested: Bool)
        case running(listener: any Channel, address: SocketAddress, connections: [ObjectIdentifier: any Channel])
        case stopped
    }

    /// HTTP/1.1 only: the ALPN name agents' TLS stacks and HTTP clients offer for it.
    public static let alpn = "http/1.1"

    public init(services: RelayServices, endpoint: StatusEndpoint, group: any EventLoopGroup) throws {
        self.services = services
        self.endpoint = endpoint
        self.group = group
        self.tls = NIOLockedValueBox(try Self.makeTLSContext(services.configuration, endpoint: endpoint))
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
        let context = try Self.makeTLSContext(self.services.configuration, endpoint: self.endpoint)
        self.tls.withLockedValue { $0 = context }
    }

    /// Waits until the endpoint listens, and returns where.
    public func waitUntilListening() async throws -> SocketAddress {
        try await withCheckedThrowingContinuation { continuation in
            let ready = self.state.withLockedValue { state -> Result<SocketAddress, any Error>? in
                switch state {
                case .starting(var waiting, let stopRequested):
                    waiting.append(continuation)
                    state = .starting(waiting: waiting, stopRequested: stopRequested)
                    return nil
                case .running(_, let address, _):
                    return .success(address)
                case .stopped:
                    return .failure(RelayServerError.noAddress)
                }
            }
            if let ready { continuation.resume(with: ready) }
        }
    }

    /// Binds the listener (once; later calls return where it listens), so that an address in use fails the relay's
    /// start rather than leaving it up without its endpoint. ``run()`` binds it when this was not called.
    @discardableResult
    public func bind() async throws -> SocketAddress {
        let (_, address) = try await self.listen()
        return address
    }

    private func listen() async throws -> (any Channel, SocketAddress) {
        if let running = self.state.withLockedValue({ state -> (any Channel, SocketAddress)? in
            if case .running(let listener, let address, _) = state { return (listener, address) }
            return nil
        }) {
            return running
        }
        let endpoint = self.endpoint
        let tls = self.tls
        let space = self.services.space
        let responder = StatusResponder(catalog: self.services.catalog, logger: self.services.logger, storageFull: { space.isFull })
        let services = self.services
        let threadPool = self.services.threadPool
        let logger = self.services.logger
        let listener: any Channel
        do {
            listener = try await ServerBootstrap(group: self.group)
                .serverChannelOption(.backlog, value: 128)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
                // One socket read per read the handler lets through: what a client sends ahead is taken a piece at a time.
                .childChannelOption(.maxMessagesPerRead, value: 1)
                .childChannelInitializer { [weak self] channel in
                    guard let self, self.admit(channel) else {
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
                                HTTPRequestDecoder(leftOverBytesStrategy: .dropBytes, informationalResponseStrategy: .drop, limitConfiguration: limits),
                                maximumBufferSize: endpoint.maxBufferedBytes
                            )
                        )
                        try sync.addHandler(NIOHTTPResponseHeadersValidator())
                        try sync.addHandler(StatusHTTPHandler(endpoint: endpoint, responder: responder, services: services, threadPool: threadPool))
                    }
                }
                .bind(host: endpoint.host, port: endpoint.port)
                .get()
        } catch {
            let waiting = self.state.withLockedValue { state -> [CheckedContinuation<SocketAddress, any Error>] in
                defer { state = .stopped }
                if case .starting(let waiting, _) = state { return waiting }
                return []
            }
            for continuation in waiting { continuation.resume(throwing: error) }
            throw error
        }
        guard let address = listener.localAddress else {
            listener.close(promise: nil)
            throw RelayServerError.noAddress
        }
        let waiting = self.state.withLockedValue { state -> [CheckedContinuation<SocketAddress, any Error>] in
            guard case .starting(let waiting, let stopRequested) = state else { return [] }
            state = .running(listener: listener, address: address, connections: [:])
            if stopRequested { listener.close(promise: nil) }
            return waiting
        }
        for continuation in waiting { continuation.resume(returning: address) }
        logger.info(
            endpoint.routes.contains(.status) ? "status endpoint listening" : "operations endpoint listening (/metrics, /healthz, /readyz)",
            metadata: ["address": "\(address)"]
        )
        return (listener, address)
    }

    public func run() async throws {
        let (listener, _) = try await self.listen()
        try await withTaskCancellationOrGracefulShutdownHandler {
            try await listener.closeFuture.get()
        } onCancelOrGracefulShutdown: {
            self.shutdown()
        }
        let connections = self.state.withLockedValue { state -> [any Channel] in
            defer { state = .stopped }
            if case .running(_, _, let connections) = state { return Array(connections.values) }
            return []
        }
        for connection in connections { connection.close(promise: nil) }
    }

    /// Closes the listener; ``run()`` then closes the connections and returns. Calling this again does nothing.
    public func shutdown() {
        let listener = self.state.withLockedValue { state -> (any Channel)? in
            switch state {
            case .starting(let waiting, _):
                state = .starting(waiting: waiting, stopRequested: true)
                return nil
            case .running(let listener, _, _):
                return listener
            case .stopped:
                return nil
            }
        }
        listener?.close(promise: nil)
    }

    private func admit(_ channel: any Channel) -> Bool {
        let id = ObjectIdentifier(channel)
        let admitted = self.state.withLockedValue { state -> Bool in
            guard case .running(let listener, let address, var connections) = state, listener.isActive,
                connections.count < self.endpoint.maxConnections
            else { return false }
            connections[id] = channel
            state = .running(listener: listener, address: address, connections: connections)
            return true
        }
        guard admitted else { return false }
        channel.closeFuture.whenComplete { _ in
            self.state.withLockedValue { state in
                guard case .running(let listener, let address, var connections) = state else { return }
                connections.removeValue(forKey: id)
                state = .running(listener: listener, address: address, connections: connections)
            }
        }
        return true
    }
}
