import Foundation
import Logging
import NIOPosix

/// Puts a relay together from its configuration: directories, catalog, store, thread pool.
public enum RelayRuntime {
    /// What `--dev` set up, for printing how to connect.
    public struct DevSetup: Sendable {
        public var paths: DevCertificates.Paths
        public var token: String
        public var createdToken: Bool
    }

    /// Opens the catalog and the store under the configuration's directories, creating them.
    public static func openCatalog(dataDirectory: String) throws -> SQLiteCatalog {
        try FileManager.default.createDirectory(atPath: dataDirectory, withIntermediateDirectories: true)
        return try SQLiteCatalog(path: dataDirectory + "/catalog.sqlite")
    }

    /// `--dev`: a CA, a server certificate for localhost, and a token for account "dev" (made once).
    public static func prepareDev(dataDirectory: String, catalog: any Catalog) throws -> DevSetup {
        let paths = DevCertificates.Paths(dataDirectory: dataDirectory)
        try DevCertificates.ensure(paths)
        if let existing = try? String(contentsOfFile: paths.token, encoding: .utf8),
            let token = existing.split(whereSeparator: \.isNewline).first.map(String.init),
            let account = try catalog.account(tokenHash: Tokens.hash(Array(token.utf8))), !account.revoked
        {
            return DevSetup(paths: paths, token: token, createdToken: false)
        }
        let token = Tokens.generate()
        var name = "dev"
        var suffix = 1
        while try catalog.account(named: name) != nil {
            suffix += 1
            name = "dev\(suffix)"
        }
        try catalog.addAccount(name: name, tokenHash: Tokens.hash(Array(token.utf8)), quota: nil)
        try DevCertificates.write(token + "\n", to: paths.token, mode: 0o600)
        return DevSetup(paths: paths, token: token, createdToken: true)
    }

    /// Deletes sessions untouched for longer than the expiry, and staging files no session refers to.
    public static func cleanUp(catalog: any Catalog, store: any BlobStore, expiry: Duration, logger: Logger) throws {
        let cutoff = Date().addingTimeInterval(-Double(expiry.components.seconds))
        for session in try catalog.sessions(updatedBefore: cutoff) {
            try store.removeStaging(session.stagingName)
            try catalog.deleteSession(id: session.id)
            logger.info("expired upload session", metadata: ["upload.key": "\(session.key)", "account": "\(session.account)"])
        }
        let live = Set(try catalog.sessions(updatedBefore: .distantFuture).map(\.stagingName))
        for name in try store.stagingNames() where !live.contains(name) {
            try store.removeStaging(name)
        }
    }

    /// Builds the server's shared services.
    public static func makeServices(
        configuration: RelayConfiguration, catalog: any Catalog, logger: Logger
    ) throws -> RelayServices {
        let store = try LocalDirectoryStore(
            root: configuration.storePath, stagingDirectory: configuration.stagingDirectory, directBuffer: configuration.directIOBuffer
        )
        try Self.cleanUp(catalog: catalog, store: store, expiry: configuration.sessionExpiry, logger: logger)
        let pool = NIOThreadPool(numberOfThreads: configuration.ioThreads)
        pool.start()
        return RelayServices(configuration: configuration, catalog: catalog, store: store, threadPool: pool, logger: logger)
    }
}
