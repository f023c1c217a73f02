import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL
import ServiceLifecycle
import UploadProtocol

/// `upload-relay serve`: accepts agents over TLS and runs each connection's ``RelayConnectionHandler``.
///
/// A `Service`: run it in a `ServiceGroup`; on graceful shutdown (SIGTERM) every connection gets
/// GOAWAY, in-flight uploads reach a durable point and are acknowledged, then the relay exits.
public final class RelayServer: Service, Sendable {
    public let services: RelayServices
    private let group: any EventLoopGroup
    private let tls: NIOSSLContext
    private let state = NIOLockedValueBox<State>(State())
    private let bound = NIOLockedValueBox<[CheckedContinuation<SocketAddress, any Error>]>([])

    private struct State {
        var channel: (any Channel)? = nil
        var address: SocketAddress? = nil
        var connections: [ObjectIdentifier: any Channel] = [:]
        var shuttingDown = false
    }

    /// The ALPN protocol name (SPEC §2.1).
    public static let alpn = ProtocolLimits.alpn

    public init(services: RelayServices, group: any EventLoopGroup) throws {
        self.services = services
        self.group = group
        let configuration = services.configuration
        let chain = try NIOSSLCertificate.fromPEMFile(configuration.certificatePath).map { NIOSSLCertificateSource.certificate($0) }
        let key = try NIOSSLPrivateKey(file: configuration.privateKeyPath, format: .pem)
        var tls = TLSConfiguration.makeServerConfiguration(certificateChain: chain, privateKey: .privateKey(key))
        tls.minimumTLSVersion = .tlsv13
        tls.applicationProtocols = [Self.alpn]
        self.tls = try NIOSSLContext(configuration: tls)
    }

    /// The address the relay listens on, once bound (useful with port 0).
    public var localAddress: SocketAddress? {
        self.state.withLockedValue { $0.address }
    }

    /// Waits until the relay listens, and returns where.
    public func waitUntilListening() async throws -> SocketAddress {
        if let address = self.localAddress { return address }
        return try await withCheckedThrowingContinuation { continuation in
            let ready: SocketAddress? = self.state.withLockedValue { state in
                if let address = state.address { return address }
                self.bound.withLockedValue { $0.append(continuation) }
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }

    public func run() async throws {
        let configuration = self.services.configuration
        let tls = self.tls
        let services = self.services
        let logger = self.services.logger
        let channel = try await ServerBootstrap(group: self.group)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelOption(.maxMessagesPerRead, value: 16)
            .childChannelInitializer { [weak self] channel in
                guard let self, self.admit(channel) else {
                    logger.warning("refusing connection: too many connections or shutting down")
                    return channel.close()
                }
                return channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    try sync.addHandler(NIOSSLServerHandler(context: tls))
                    try sync.addHandler(RelayConnectionHandler(services: services, logger: logger, eventLoop: channel.eventLoop))
                }
            }
            .bind(host: configuration.host, port: configuration.port)
            .get()
        let address = channel.localAddress
        let (waiting, stopAtOnce) = self.state.withLockedValue { state -> ([CheckedContinuation<SocketAddress, any Error>], Bool) in
            state.channel = channel
            state.address = address
            let waiting = self.bound.withLockedValue { list in
                defer { list.removeAll() }
                return list
            }
            return (waiting, state.shuttingDown && state.connections.isEmpty)
        }
        if stopAtOnce {
            // shutdown() came while binding.
            channel.close(promise: nil)
        }
        if let address {
            for continuation in waiting { continuation.resume(returning: address) }
        }
        logger.info("upload-relay listening", metadata: ["address": "\(address.map { "\($0)" } ?? "?")"])
        let maintenance = self.startMaintenance()
        try await withGracefulShutdownHandler {
            try await channel.closeFuture.get()
        } onGracefulShutdown: {
            self.shutdown()
        }
        let stopped = maintenance.loop.makePromise(of: Void.self)
        maintenance.task.cancel(promise: stopped)
        try? await stopped.futureResult.get()
        logger.info("upload-relay stopped")
    }

    /// Every ``RelayConfiguration/maintenanceInterval``: connections of newly revoked accounts close (issue 6 finding 6),
    /// and sessions past their expiry go (finding 4), except those whose key an upload holds right now.
    private func startMaintenance() -> (task: RepeatedTask, loop: any EventLoop) {
        let services = self.services
        let interval = TimeAmount(services.configuration.maintenanceInterval)
        let loop = self.group.next()
        // Starts empty: an account revoked before the first look has its connections closed then too.
        let revoked = NIOLockedValueBox<Set<String>>([])
        let lastExpiry = NIOLockedValueBox(NIODeadline.now())
        let expiryEvery = min(TimeAmount.nanoseconds(TimeAmount(services.configuration.sessionExpiry).nanoseconds / 4), .minutes(10))
        let task = loop.scheduleRepeatedAsyncTask(initialDelay: interval, delay: interval) { _ in
            services.threadPool.runIfActive(eventLoop: loop) { () -> Set<String> in
                let now = Set(try services.catalog.accounts().filter(\.revoked).map(\.name))
                let due = lastExpiry.withLockedValue { last in
                    guard NIODeadline.now() - last >= expiryEvery else { return false }
                    last = .now()
                    return true
                }
                let keys = RelayRuntime.KeyGuard(
                    take: { services.claims.tryClaim(KeyClaims.name(account: $0, key: $1)) },
                    give: { services.claims.release(KeyClaims.name(account: $0, key: $1)) }
                )
                // Commits a failure left pending are settled under their key (review: they held quota until a restart).
                try RelayRuntime.recover(catalog: services.catalog, store: services.store, logger: services.logger, keys: keys, objects: false)
                if due {
                    let expiry = services.configuration.sessionExpiry
                    try RelayRuntime.cleanUp(
                        catalog: services.catalog, store: services.store, expiry: expiry, logger: services.logger, keys: keys,
                        orphansBefore: Date().addingTimeInterval(-Double(expiry.components.seconds))
                    )
                }
                return now
            }.map { now in
                let newly = revoked.withLockedValue { known -> Set<String> in
                    defer { known = now }
                    return now.subtracting(known)
                }
                guard !newly.isEmpty else { return }
                let connections = self.state.withLockedValue { Array($0.connections.values) }
                for account in newly {
                    services.logger.notice("token revoked: closing its connections", metadata: ["account": "\(account)"])
                    for connection in connections {
                        connection.pipeline.fireUserInboundEventTriggered(RelayAccountRevokedEvent(account: account))
                    }
                }
            }.recover { error in
                services.logger.warning("relay maintenance failed", metadata: ["error": "\(error)"])
            }
        }
        return (task, loop)
    }

    private func admit(_ channel: any Channel) -> Bool {
        let id = ObjectIdentifier(channel)
        let admitted = self.state.withLockedValue { state -> Bool in
            guard !state.shuttingDown, state.connections.count < self.services.configuration.maxConnections else { return false }
            state.connections[id] = channel
            return true
        }
        if admitted {
            channel.closeFuture.whenComplete { _ in
                let listener = self.state.withLockedValue { state -> (any Channel)? in
                    state.connections.removeValue(forKey: id)
                    return state.shuttingDown && state.connections.isEmpty ? state.channel : nil
                }
                listener?.close(promise: nil)
            }
        }
        return admitted
    }

    /// GOAWAY to every connection; close the listener once every connection has closed.
    ///
    /// Each connection drains on its own event loop and closes itself after ``RelayConfiguration/shutdownGrace`` at the
    /// latest; the last one to close closes the listener, which ends ``run()``. Calling this again does nothing.
    public func shutdown() {
        let snapshot = self.state.withLockedValue { state -> (listener: (any Channel)?, connections: [any Channel])? in
            guard !state.shuttingDown else { return nil }
            state.shuttingDown = true
            return (state.channel, Array(state.connections.values))
        }
        guard let (listener, connections) = snapshot else { return }
        self.services.logger.info("shutting down", metadata: ["connections": "\(connections.count)"])
        for connection in connections {
            connection.pipeline.fireUserInboundEventTriggered(RelayShutdownEvent())
        }
        if connections.isEmpty {
            listener?.close(promise: nil)
        }
    }
}
