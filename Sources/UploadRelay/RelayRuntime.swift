#if canImport(Glibc)
import Glibc
#endif
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

    /// `--dev`: a CA, a server certificate for localhost and `names`, and a token for account "dev" (made once).
    public static func prepareDev(dataDirectory: String, catalog: any Catalog, names: [String] = []) async throws -> DevSetup {
        let paths = DevCertificates.Paths(dataDirectory: dataDirectory)
        try DevCertificates.ensure(paths, names: names)
        if let existing = try? String(contentsOfFile: paths.token, encoding: .utf8),
            let token = existing.split(whereSeparator: \.isNewline).first.map(String.init),
            let account = try await catalog.account(tokenHash: Tokens.hash(Array(token.utf8))), !account.revoked
        {
            return DevSetup(paths: paths, token: token, createdToken: false)
        }
        let token = Tokens.generate()
        var name = "dev"
        var suffix = 1
        while try await catalog.account(named: name) != nil {
            suffix += 1
            name = "dev\(suffix)"
        }
        try await catalog.addAccount(name: name, tokenHash: Tokens.hash(Array(token.utf8)), quota: nil)
        try DevCertificates.write(token + "\n", to: paths.token, mode: 0o600)
        return DevSetup(paths: paths, token: token, createdToken: true)
    }

    /// How housekeeping keeps off live uploads: it may touch a key's session or pending commit only while it holds the
    /// key (``take`` true), and gives it back after. At startup nothing runs, so every key may be taken.
    public struct KeyGuard: Sendable {
        public var take: @Sendable (_ account: String, _ key: String) async -> Bool
        public var give: @Sendable (_ account: String, _ key: String) -> Void

        public init(take: @escaping @Sendable (String, String) async -> Bool, give: @escaping @Sendable (String, String) -> Void) {
            self.take = take
            self.give = give
        }

        /// At startup: no upload runs.
        public static let idle = KeyGuard(take: { _, _ in true }, give: { _, _ in })

        /// A key is taken only when no upload holds it, nor any stream one of its stripes (a striped upload's main
        /// stream may be away while its stripes arrive, SPEC §6.7), nor, with a shared catalog, another relay.
        static func claiming(_ claims: KeyClaims) -> KeyGuard {
            KeyGuard(
                take: { account, key in
                    let name = KeyClaims.name(account: account, key: key)
                    guard !claims.hasStripes(account: account, key: key), claims.tryClaim(name) else { return false }
                    guard (try? await claims.lockAcrossRelays(account: account, key: key)) == true else {
                        claims.release(name)
                        return false
                    }
                    return true
                },
                give: { claims.release(KeyClaims.name(account: $0, key: $1)) }
            )
        }

        func holding<T>(_ account: String, _ key: String, _ body: () async throws -> T) async rethrows -> T? {
            guard await self.take(account, key) else { return nil }
            defer { self.give(account, key) }
            return try await body()
        }
    }

    /// Deletes sessions untouched for longer than the expiry, and staging files no session refers to that are older than
    /// `orphansBefore` (every one at startup). Sessions of keys that an upload holds are live whatever their age.
    public static func cleanUp(
        catalog: any Catalog, store: any BlobStore, expiry: Duration, logger: Logger, keys: KeyGuard = .idle, orphansBefore: Date? = nil
    ) async throws {
        let cutoff = Date().addingTimeInterval(-Double(expiry.components.seconds))
        let pending = Set(try await catalog.pendingCommits().compactMap(\.sessionID))
        for session in try await catalog.sessions(updatedBefore: cutoff) where !pending.contains(session.id) {
            try await keys.holding(session.account, session.key) {
                // Looked at again under the key: an upload may have resumed it since the list was read.
                guard let current = try await catalog.session(account: session.account, key: session.key), current.id == session.id,
                    current.updatedAt < cutoff
                else { return }
                do {
                    try await store.removeStaging(session.stagingName)
                } catch let error as StoreError where error.outcomeUnknown {
                    // The store did not answer (S3 away): the session stays, to expire at the next pass.
                    logger.warning("could not remove an expired upload's staging", metadata: ["upload.key": "\(session.key)", "error": "\(error)"])
                    return
                }
                try await catalog.deleteSession(id: session.id)
                logger.info("expired upload session", metadata: ["upload.key": "\(session.key)", "account": "\(session.account)"])
            }
        }
        // A staging file is made before its session is recorded: only files older than that window are orphans.
        let live = Set(try await catalog.sessions(updatedBefore: .distantFuture).map(\.stagingName))
        for (name, modified) in try await store.stagingFiles() where !live.contains(name) {
            if let owner = store.stagingOwner(name) {
                // Made under its key by an upload that ended without recording it (a relay killed between the two):
                // an orphan once no upload holds the key and no session names it, whatever its age.
                try await keys.holding(owner.account, owner.key) {
                    guard try await catalog.session(account: owner.account, key: owner.key)?.stagingName != name else { return }
                    do {
                        try await store.removeStaging(name)
                        logger.info("removed an upload's orphaned staging", metadata: ["upload.key": "\(owner.key)", "account": "\(owner.account)"])
                    } catch {
                        logger.warning("could not remove an orphaned staging", metadata: ["staging": "\(name)", "error": "\(error)"])
                    }
                }
                continue
            }
            if let orphansBefore, modified >= orphansBefore { continue }
            do {
                try await store.removeStaging(name)
            } catch {
                logger.warning("could not remove an orphaned staging", metadata: ["staging": "\(name)", "error": "\(error)"])
            }
        }
    }

    /// Settles what a crash interrupted: a commit between its quota reservation and its record is
    /// recorded when the store holds its verified bytes, and given up otherwise. At startup (`objects`), a recorded
    /// object whose file is gone is also forgotten, and its bytes given back to the quota. While the relay runs it
    /// settles commits left pending by a failure, under their key.
    public static func recover(
        catalog: any Catalog, store: any BlobStore, logger: Logger, keys: KeyGuard = .idle, objects: Bool = true
    ) async throws {
        for commit in try await catalog.pendingCommits() {
            _ = try await keys.holding(commit.account, commit.key) {
                try await Self.settle(commit, catalog: catalog, store: store, logger: logger)
            }
        }
        guard objects else { return }
        for object in try await catalog.objects() {
            guard let key = try? ObjectKey(validating: object.key) else { continue }
            let identity: ObjectIdentity?
            do {
                identity = try await store.identity(of: key, account: object.account)
            } catch let error as StoreError where error.outcomeUnknown {
                // Not known to be gone (S3 did not answer): kept, looked at again at the next start.
                logger.warning("could not look at a stored object", metadata: ["upload.key": "\(object.key)", "error": "\(error)"])
                continue
            }
            if identity == nil {
                try await catalog.deleteObject(account: object.account, key: object.key)
                logger.warning("forgot an object whose file is gone", metadata: ["upload.key": "\(object.key)", "account": "\(object.account)"])
            }
        }
    }

    /// Records `commit` when the store holds its verified bytes (true), gives it up otherwise. The caller holds its key.
    @discardableResult
    static func settle(_ commit: PendingCommit, catalog: any Catalog, store: any BlobStore, logger: Logger) async throws -> Bool {
        guard let key = try? ObjectKey(validating: commit.key) else {
            try await catalog.abandonCommit(account: commit.account, key: commit.key)
            return false
        }
        if let identity = try await store.identity(of: key, account: commit.account), identity.size == commit.size,
            try await store.contentSHA1(of: key, account: commit.account)?.hex == commit.sha1
        {
            try await catalog.finishCommit(commit, identity: identity)
            logger.notice("recovered a commit the relay had not recorded", metadata: ["upload.key": "\(commit.key)", "account": "\(commit.account)"])
            return true
        }
        try await catalog.abandonCommit(account: commit.account, key: commit.key)
        return false
    }

    /// Wires the relay's parts (``Relay``), on `threadPool` (started) or a new pool of ``RelayConfiguration/ioThreads``.
    public static func makeRelay(
        configuration: RelayConfiguration, catalog: any Catalog, store: any BlobStore, logger: Logger, threadPool: NIOThreadPool? = nil
    ) async throws -> Relay {
        var configuration = configuration
        // Under each key's lock across relays when the catalog is shared: other relays' uploads and commits run on.
        let startup = KeyGuard.claiming(KeyClaims(locks: catalog.keyLocks))
        do {
            try await Self.recover(catalog: catalog, store: store, logger: logger, keys: startup)
            try await Self.cleanUp(catalog: catalog, store: store, expiry: configuration.sessionExpiry, logger: logger, keys: startup)
        } catch  where StorageSpace.isDiskFull(error) {
            // A relay killed on a full disk still starts: what the crash left is settled by its looks once there is room
            // (uploads are refused meanwhile, STORAGE_ERROR, as the disk is full).
            logger.warning("the disk is full: what the last run left is settled once there is room", metadata: ["error": "\(error)"])
        }
        let pool = threadPool ?? NIOThreadPool(numberOfThreads: configuration.ioThreads)
        if threadPool == nil { pool.start() }
        if configuration.maxOpenUploads == nil {
            let descriptors = Self.raiseDescriptorLimit()
            // One descriptor per connection, a reserve for the catalog, the listener and the libraries, the rest for uploads.
            let slots = max(16, descriptors - configuration.maxConnections - 128)
            configuration.maxOpenUploads = slots
            logger.info("descriptor budget", metadata: ["descriptors": "\(descriptors)", "uploads.max": "\(slots)"])
            if descriptors < configuration.maxConnections + 128 + 16 {
                logger.warning(
                    "the descriptor limit is low for --max-connections: raise it (ulimit -n) or lower --max-connections",
                    metadata: ["descriptors": "\(descriptors)", "connections.max": "\(configuration.maxConnections)"]
                )
            }
        }
        return Relay(
            configuration: configuration, catalog: catalog, store: store, threadPool: pool, logger: logger,
            metrics: RelayMetrics(perAccount: configuration.metricsPerAccount)
        )
    }

    /// Raises the soft limit of open descriptors to the hard limit; returns the limit in force.
    static func raiseDescriptorLimit() -> Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1024 }
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
        }
        return Int(clamping: limit.rlim_cur)
    }
}
