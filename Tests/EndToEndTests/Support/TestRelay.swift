import Foundation
import Logging
import NIOCore
import NIOPosix
import UploadAgent
import UploadRelay
import UploadRelayBackends
import UploadRelayPostgres
import UploadRelayS3Store
import UploadTestSupport

/// A real relay in this process, on 127.0.0.1 with a fresh data directory, dev certificates and a token.
final class TestRelay: @unchecked Sendable {
    let directory: String
    /// The relay's parts, as `serve` wires them.
    let parts: Relay
    let server: RelayServer
    /// The status endpoint, when the configuration has one (``statusPort`` once started).
    let statusServer: RelayStatusServer?
    /// The operations endpoint (`/metrics`, `/healthz`, `/readyz`), when the configuration has one.
    let operationsServer: RelayStatusServer?
    let group: MultiThreadedEventLoopGroup
    let token: String
    let caPath: String
    private var runTask: Task<Void, any Error>? = nil
    private var statusTask: Task<Void, any Error>? = nil
    private var operationsTask: Task<Void, any Error>? = nil
    private(set) var port: Int = 0
    private(set) var statusPort: Int = 0
    private(set) var operationsPort: Int = 0

    static func makeDirectory() -> String {
        TemporaryDirectories.make(prefix: "upload-e2e-")
    }

    /// `catalogURL`: a shared PostgreSQL catalog instead of SQLite in the directory; `s3`: a bucket instead of the local store.
    init(
        directory: String? = nil, devNames: [String] = [], catalogURL: String? = nil, s3: S3StoreConfiguration? = nil,
        configure: (inout RelayConfiguration) -> Void = { _ in }
    ) async throws {
        self.directory = directory ?? Self.makeDirectory()
        var quiet = Logger(label: "test-catalog")
        quiet.logLevel = .critical
        let catalog = try await RelayRuntime.openCatalog(dataDirectory: self.directory, url: catalogURL, logger: quiet)
        let dev = try await RelayRuntime.prepareDev(dataDirectory: self.directory, catalog: catalog, names: devNames)
        self.token = dev.token
        self.caPath = dev.paths.caCertificate
        var configuration = RelayConfiguration(
            certificatePath: dev.paths.serverCertificate, privateKeyPath: dev.paths.serverKey, dataDirectory: self.directory
        )
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configure(&configuration)
        var logger = Logger(label: "test-relay")
        logger.logLevel = .warning
        let relay = try await RelayRuntime.makeRelay(configuration: configuration, s3: s3, catalog: catalog, logger: logger)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        self.parts = relay
        self.group = group
        self.server = try RelayServer(relay: relay, group: group)
        self.statusServer = try configuration.status.map { try RelayStatusServer(relay: relay, endpoint: $0, group: group) }
        self.operationsServer = try configuration.operations.map { try RelayStatusServer(relay: relay, endpoint: $0, group: group) }
    }

    func start() async throws -> TestRelay {
        let server = self.server
        self.runTask = Task { try await server.run() }
        let address = try await server.waitUntilListening()
        self.port = address.port!
        if let statusServer = self.statusServer {
            self.statusTask = Task { try await statusServer.run() }
            self.statusPort = try await statusServer.waitUntilListening().port!
        }
        if let operationsServer = self.operationsServer {
            self.operationsTask = Task { try await operationsServer.run() }
            self.operationsPort = try await operationsServer.waitUntilListening().port!
        }
        return self
    }

    func stop() async {
        self.statusServer?.shutdown()
        _ = try? await self.statusTask?.value
        self.operationsServer?.shutdown()
        _ = try? await self.operationsTask?.value
        self.server.shutdown()
        _ = try? await self.runTask?.value
        (self.parts.catalog as? PostgresCatalog)?.shutdown()
        try? await self.parts.threadPool.shutdownGracefully()
        try? await self.group.shutdownGracefully()
    }

    var storePath: String { self.parts.configuration.storePath }

    /// The object `key` of `account` (the dev account by default), as the store holds it: `<store>/ACCOUNT/KEY`.
    func stored(_ key: String, account: String = "dev") -> Data? {
        FileManager.default.contents(atPath: self.storePath + "/" + account + "/" + key)
    }

    func addAccount(_ name: String, quota: Int64? = nil) async throws -> String {
        let token = Tokens.generate()
        try await self.parts.catalog.addAccount(name: name, tokenHash: Tokens.hash(Array(token.utf8)), quota: quota)
        return token
    }
}

/// Runs an agent upload in this process against `port`.
func upload(
    _ items: [UploadItem], host: String = "127.0.0.1", port: Int, token: String, ca: String?,
    configure: (inout AgentConfiguration) -> Void = { _ in }, onEvent: @escaping @Sendable (UploadEvent) -> Void = { _ in }
) async throws -> [UploadResult] {
    var configuration = AgentConfiguration(relayHost: host, relayPort: port, token: token, caPath: ca)
    configuration.retryFor = .seconds(20)
    configure(&configuration)
    let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    var logger = Logger(label: "test-agent")
    logger.logLevel = .warning
    let uploader = Uploader(configuration: configuration, group: group, logger: logger)
    do {
        let results = try await uploader.upload(items, onEvent: onEvent)
        try? await group.shutdownGracefully()
        return results
    } catch {
        try? await group.shutdownGracefully()
        throw error
    }
}

/// Counts payload bytes the agent reported sent, to act "midway" on an event rather than a timer.
final class SentCounter: @unchecked Sendable {
    private let lock = NSLock()
    private var total = 0
    private var waiters: [(Int, CheckedContinuation<Void, Never>)] = []

    func add(_ bytes: Int) {
        self.lock.lock()
        self.total += bytes
        let ready = self.waiters.filter { $0.0 <= self.total }
        self.waiters.removeAll { $0.0 <= self.total }
        self.lock.unlock()
        for (_, continuation) in ready { continuation.resume() }
    }

    /// Returns once at least `bytes` were sent.
    func wait(for bytes: Int) async {
        await withCheckedContinuation { continuation in
            self.lock.lock()
            if self.total >= bytes {
                self.lock.unlock()
                continuation.resume()
            } else {
                self.waiters.append((bytes, continuation))
                self.lock.unlock()
            }
        }
    }
}
