import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import NIOSSL
import ServiceLifecycle
import UploadProtocol
import CoreMetrics

/// `upload-relay serve`: accepts agents over TLS and runs each connection's ``RelayConnectionHandler``.
///
/// A `Service`: run it in a `ServiceGroup`; on graceful shutdown (SIGTERM) every connection gets
/// GOAWAY, in-flight uploads reach a durable point and are acknowledged, then the relay exits.
public final class RelayServer: Service, Sendable {
    public let relay: Relay
    private let group: any EventLoopGroup
    /// The TLS context new connections get; ``reloadCertificate()`` replaces it (connections keep theirs).
    private let tls: NIOLockedValueBox<NIOSSLContext>
    private let lifecycle: ListenerLifecycle

    /// Connections admitted since the server started (refused ones not counted).
    public var connectionsAdmitted: Int { self.lifecycle.connectionsAdmitted }

    /// The ALPN protocol name (SPEC §2.1).
    public static let alpn = ProtocolLimits.alpn

    public init(relay: Relay, group: any EventLoopGroup) throws {
        self.relay = relay
        self.group = group
        self.tls = NIOLockedValueBox(try Self.makeTLSContext(relay.configuration))
        self.lifecycle = ListenerLifecycle(maxConnections: relay.configuration.maxConnections, strangers: relay.configuration.strangers)
    }

    private static func makeTLSContext(_ configuration: RelayConfiguration) throws -> NIOSSLContext {
        var tls = try Self.tlsConfiguration(configuration)
        tls.applicationProtocols = [Self.alpn]
        return try NIOSSLContext(configuration: tls)
    }

    /// Reads the certificate chain and key again from their files (a renewal): connections accepted from now on
    /// present the new certificate, those open keep theirs and go on. When the files cannot be read or do not match,
    /// the error is thrown and the old certificate stays.
    public func reloadCertificate() throws {
        let context = try Self.makeTLSContext(self.relay.configuration)
        self.tls.withLockedValue { $0 = context }
    }

    /// TLS 1.3 with the relay's certificate chain and key: the agents' listener and the status endpoint's.
    /// Loads the certificate and key as the relay will: a ``CertificateFile/Failure`` names the file and what is wrong.
    public static func checkCertificate(_ configuration: RelayConfiguration) throws {
        _ = try Self.tlsConfiguration(configuration)
    }

    static func tlsConfiguration(_ configuration: RelayConfiguration) throws -> TLSConfiguration {
        let (certificate, keyPath) = (configuration.certificatePath, configuration.privateKeyPath)
        try CertificateFile.checkReadable(certificate, what: "certificate", option: "--cert")
        try CertificateFile.checkReadable(keyPath, what: "private key", option: "--key")
        let chain: [NIOSSLCertificateSource]
        do {
            chain = try NIOSSLCertificate.fromPEMFile(certificate).map { NIOSSLCertificateSource.certificate($0) }
        } catch {
            throw CertificateFile.Failure("the certificate \(certificate) (--cert) is not a PEM certificate chain (-----BEGIN CERTIFICATE-----)")
        }
        guard !chain.isEmpty else {
            throw CertificateFile.Failure("the certificate \(certificate) (--cert) holds no certificate")
        }
        let key: NIOSSLPrivateKey
        do {
            key = try NIOSSLPrivateKey(file: keyPath, format: .pem)
        } catch {
            throw CertificateFile.Failure(
                "the private key \(keyPath) (--key) is not a PEM private key (-----BEGIN PRIVATE KEY-----), or it is encrypted")
        }
        var tls = TLSConfiguration.makeServerConfiguration(certificateChain: chain, privateKey: .privateKey(key))
        tls.minimumTLSVersion = .tlsv13
        do {
            _ = try NIOSSLContext(configuration: tls)
        } catch {
            throw CertificateFile.Failure("the private key \(keyPath) (--key) does not match the certificate \(certificate) (--cert)")
        }
        return tls
    }

    /// The address the relay listens on, once bound (useful with port 0).
    public var localAddress: SocketAddress? { self.lifecycle.localAddress }

    /// Waits until the relay listens, and returns where.
    public func waitUntilListening() async throws -> SocketAddress {
        try await self.lifecycle.waitUntilListening()
    }

    /// Binds the listener (once; later calls return where it listens): what fails here, an address in use say, fails
    /// before the relay says it is ready. ``run()`` binds it when this was not called.
    @discardableResult
    public func bind() async throws -> SocketAddress {
        try await self.listen().address
    }

    /// The listener, bound now unless it was already.
    private func listen() async throws -> (listener: any Channel, address: SocketAddress) {
        let configuration = self.relay.configuration
        let tls = self.tls
        let relay = self.relay
        let logger = self.relay.logger
        let lifecycle = self.lifecycle
        let refusals = BoundedLog(logger: logger)
        let dependencies = relay.connectionDependencies
        @Sendable func refused(_ refusal: ListenerLifecycle.Refusal) {
            relay.metrics.refused(refusal, listener: "upload")
            refusals.warning(refusal.description, metadata: ["listener": "upload"])
        }
        return try await lifecycle.listen {
            let listener = try await ServerBootstrap(group: self.group)
                .serverChannelOption(.backlog, value: 256)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
                .childChannelOption(.maxMessagesPerRead, value: UInt(max(1, configuration.readsPerWakeup)))
                .childChannelInitializer { channel in
                    if let refusal = lifecycle.admit(channel) {
                        refused(refusal)
                        return channel.close()
                    }
                    relay.metrics.connectionsAccepted.increment()
                    return channel.eventLoop.makeCompletedFuture {
                        let sync = channel.pipeline.syncOperations
                        try sync.addHandler(ReadCycleSplitter())
                        try sync.addHandler(NIOSSLServerHandler(context: tls.withLockedValue { $0 }))
                        try sync.addHandler(
                            RelayConnectionHandler(dependencies: dependencies, logger: logger, eventLoop: channel.eventLoop) { channel in
                                guard lifecycle.authenticated(channel) else {
                                    refused(.placesFull)
                                    return false
                                }
                                return true
                            }
                        )
                    }
                }
                .bind(host: configuration.host, port: configuration.port)
                .get()
            logger.info("upload-relay listening", metadata: ["address": "\(listener.localAddress.map { "\($0)" } ?? "?")"])
            return listener
        }
    }

    public func run() async throws {
        let relay = self.relay
        let logger = self.relay.logger
        let channel = try await self.listen().listener
        relay.claims.whenLocksLost { [weak self] in
            for connection in self?.connections ?? [] {
                connection.pipeline.fireUserInboundEventTriggered(RelayKeyLocksLostEvent())
            }
        }
        let hooks = relay.configuration.hooks.map {
            CommitHookRunner(catalog: relay.catalog, metrics: relay.metrics, logger: relay.logger, hooks: $0)
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            if let hooks {
                relay.commitEvents.listen { hooks.nudge() }
                group.addTask(executorPreference: relay.executor) { await hooks.run() }
            }
            let lifecycle = self.lifecycle
            let maintenance = RelayMaintenance(relay: relay, connections: { lifecycle.connections }, eventLoop: self.group.next())
            let failure: (any Error)? = await withTaskGroup(of: Void.self) { looks in
                looks.addTask(executorPreference: relay.executor) { await maintenance.run() }
                defer { looks.cancelAll() }
                do {
                    // A cancelled group (another service failed) stops the relay as SIGTERM does.
                    try await withTaskCancellationOrGracefulShutdownHandler {
                        try await channel.closeFuture.get()
                    } onCancelOrGracefulShutdown: {
                        self.shutdown()
                    }
                    return nil
                } catch {
                    return error
                }
            }
            // Every connection is closed: an admin's wait need not count this relay any more.
            try? await relay.catalog.forgetLook(relay: maintenance.relayID)
            if let hooks {
                relay.commitEvents.listen(nil)
                // The deliveries under way end within the hook timeout.
                hooks.stop()
            }
            try await group.waitForAll()
            if let failure { throw failure }
        }
        self.lifecycle.finish()
        logger.info("upload-relay stopped")
    }

    /// The connections open now.
    private var connections: [any Channel] { self.lifecycle.connections }

    /// GOAWAY to every connection; close the listener once every connection has closed.
    ///
    /// Each connection drains on its own event loop and closes itself after ``RelayConfiguration/shutdownGrace`` at the
    /// latest; the last one to close closes the listener, which ends ``run()``. Calling this again does nothing.
    public func shutdown() {
        self.relay.health.draining.withLockedValue { $0 = true }
        guard let connections = self.lifecycle.drain() else { return }
        self.relay.logger.info("shutting down", metadata: ["connections": "\(connections.count)"])
        for connection in connections {
            connection.pipeline.fireUserInboundEventTriggered(RelayShutdownEvent())
        }
    }
}

/// Why the relay could not say where it listens.
public enum RelayServerError: Error, Hashable, Sendable {
    /// The listener has no local address (it failed to bind, or closed at once).
    case noAddress
}

/// Asks a connection to shut down gracefully: GOAWAY, let uploads reach a durable point, close.
public struct RelayShutdownEvent: Sendable {
    public init() {}
}

/// The relay's key locks across relays were lost: connections with uploads close.
struct RelayKeyLocksLostEvent: Sendable {}

/// The accounts as the relay's last look at the catalog found them: a connection whose principal is not among them as
/// it authenticated (deleted, disabled, another token) closes.
struct RelayAccountsEvent: Sendable {
    var accounts: [String: Account]
}

/// The relay's certificate and key files, checked so that a failure names the file and what is wrong with it (never
/// NIOSSL's bare `failedToLoadCertificate`).
public enum CertificateFile {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
        init(_ description: String) { self.description = description }
    }

    /// Throws when `path` cannot be read, saying why (missing, not allowed, a directory).
    static func checkReadable(_ path: String, what: String, option: String) throws {
        var info = stat()
        guard stat(path, &info) == 0 else {
            throw Failure("the \(what) \(path) (\(option)) cannot be read: \(String(cString: strerror(errno)))")
        }
        guard info.st_mode & S_IFMT != S_IFDIR else { throw Failure("the \(what) \(path) (\(option)) is a directory, not a PEM file") }
        guard access(path, R_OK) == 0 else {
            throw Failure("the \(what) \(path) (\(option)) cannot be read by this user: \(String(cString: strerror(errno)))")
        }
    }
}
