import Foundation
import Logging
import NIOPosix
import UploadProtocol

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

    /// `--dev`: a CA, a server certificate for localhost and `names`, and a token for account "dev" (made once).
    public static func prepareDev(dataDirectory: String, catalog: any Catalog, names: [String] = []) throws -> DevSetup {
        let paths = DevCertificates.Paths(dataDirectory: dataDirectory)
        try DevCertificates.ensure(paths, names: names)
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

    /// Deletes sessions untouched for longer than the expiry, and staging files no session refers to. Keys in
    /// `busy` have an upload open right now: their sessions are live whatever their age.
    public static func cleanUp(
        catalog: any Catalog, store: any BlobStore, expiry: Duration, logger: Logger, busy: (UploadSession) -> Bool = { _ in false }
    ) throws {
        let cutoff = Date().addingTimeInterval(-Double(expiry.components.seconds))
        let pending = Set(try catalog.pendingCommits().compactMap(\.sessionID))
        for session in try catalog.sessions(updatedBefore: cutoff) where !busy(session) && !pending.contains(session.id) {
            try store.removeStaging(session.stagingName)
            try catalog.deleteSession(id: session.id)
            logger.info("expired upload session", metadata: ["upload.key": "\(session.key)", "account": "\(session.account)"])
        }
        let live = Set(try catalog.sessions(updatedBefore: .distantFuture).map(\.stagingName))
        for name in try store.stagingNames() where !live.contains(name) && !name.hasPrefix("dup-") {
            try store.removeStaging(name)
        }
    }

    /// Settles what a crash interrupted (issue 6 finding 12): a commit between its quota reservation and its record is
    /// recorded when the store holds its verified bytes, and given up otherwise; a recorded object whose file is gone is
    /// forgotten, and its bytes given back to the quota.
    public static func recover(catalog: any Catalog, store: any BlobStore, logger: Logger) throws {
        for commit in try catalog.pendingCommits() {
            guard let key = try? ObjectKey(validating: commit.key) else {
                try catalog.abandonCommit(account: commit.account, key: commit.key)
                continue
            }
            if let identity = try store.identity(of: key, account: commit.account), identity.size == commit.size,
                try store.contentSHA1(of: key, account: commit.account)?.hex == commit.sha1
            {
                try catalog.finishCommit(commit, identity: identity)
                logger.notice("recovered a commit the relay had not recorded", metadata: ["upload.key": "\(commit.key)", "account": "\(commit.account)"])
            } else {
                try catalog.abandonCommit(account: commit.account, key: commit.key)
            }
        }
        for object in try catalog.objects() {
            guard let key = try? ObjectKey(validating: object.key) else { continue }
            if try store.identity(of: key, account: object.account) == nil {
                try catalog.deleteObject(account: object.account, key: object.key)
                logger.warning("forgot an object whose file is gone", metadata: ["upload.key": "\(object.key)", "account": "\(object.account)"])
            }
        }
    }

    /// Builds the server's shared services.
    public static func makeServices(
        configuration: RelayConfiguration, catalog: any Catalog, logger: Logger
    ) throws -> RelayServices {
        let store = try LocalDirectoryStore(
            root: configuration.storePath, stagingDirectory: configuration.stagingDirectory, directBuffer: configuration.directIOBuffer
        )
        try Self.recover(catalog: catalog, store: store, logger: logger)
        try Self.cleanUp(catalog: catalog, store: store, expiry: configuration.sessionExpiry, logger: logger)
        let pool = NIOThreadPool(numberOfThreads: configuration.ioThreads)
        pool.start()
        return RelayServices(configuration: configuration, catalog: catalog, store: store, threadPool: pool, logger: logger)
    }
}
