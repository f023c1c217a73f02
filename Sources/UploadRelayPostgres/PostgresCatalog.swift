import UploadRelay
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOSSL
import PostgresNIO

/// The catalog several relays share (`--catalog postgres://USER:PASSWORD@HOST:PORT/DATABASE`): the tables,
/// rules and answers of ``SQLiteCatalog``, in PostgreSQL through postgres-nio.
///
/// - Schema versions are those of the SQLite catalog (`upload_schema` records them); a new relay migrates under an
///   advisory lock, so relays started together migrate once.
/// - Commits serialize per account on its row (`SELECT ... FOR UPDATE`): the quota one relay checks is the quota
///   another one's commit leaves, whatever relay each upload reached.
/// - Every call is async, as the protocol says: a query waits for the database without holding a thread.
public final class PostgresCatalog: Catalog, Sendable {
    let client: PostgresClient
    let logger: Logger
    /// The longest a call waits for the database (a connection included): past it, a ``CatalogError/unavailable(_:)`` says so. The
    /// pool itself would wait for a database that is down for ever.
    let timeout: Duration
    private let running: Task<Void, Never>
    let locks: PostgresKeyLocks

    /// Advisory locks on one connection of this catalog's own (made at the first lock).
    public var keyLocks: (any KeyLocks)? { self.locks }

    /// The schema version this code writes: the SQLite catalog's migrations, v1 to v6, v7 (indexes in byte order) and
    /// v8 (what the uploads open on each relay announced) and v9 (the multipart uploads begun, ``MultipartLedger``).
    static let schemaVersion = 11

    /// Connects (lazily, from a pool) to `url`, `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=disable|require]`,
    /// and migrates the schema.
    public init(
        url: String, logger: Logger, timeout: Duration = .seconds(15), lockHeartbeat: LockHeartbeat = LockHeartbeat()
    ) async throws {
        let configuration = try Self.configuration(url)
        self.logger = logger
        self.timeout = timeout
        // The pool logs each failed connection attempt at info: only what matters reaches the relay's log.
        var background = logger
        background.logLevel = max(logger.logLevel, .warning)
        let client = PostgresClient(configuration: configuration, backgroundLogger: background)
        self.client = client
        self.locks = try PostgresKeyLocks(url: url, logger: background, timeout: timeout, heartbeat: lockHeartbeat)
        // A wrong password, a server without TLS, a certificate that does not verify: said as such, at once (after the
        // settings are checked, which need no connection).
        try await Self.probe(url, timeout: timeout, logger: logger)
        // On an executor of its own: the pool must go on whatever the process does with the shared cooperative pool.
        self.running = Task(executorPreference: Self.executor) { await client.run() }
        do {
            try await self.migrate()
        } catch {
            self.running.cancel()
            throw error
        }
    }

    deinit {
        self.running.cancel()
    }

    /// Where the catalog's background tasks run (its pool's run loop, the lock connection's heartbeat and unlocks).
    static let executor = RelayExecutor.dedicated()

    /// Closes the pool's connections.
    public func shutdown() {
        self.locks.shutdown()
        self.running.cancel()
    }

    /// What a `postgres://` URL says.
    struct Address {
        var host: String
        var port: Int
        var user: String
        var password: String?
        var database: String?
        /// `sslmode`, as libpq takes it (``TLSMode``); `prefer` when absent.
        var tlsMode: TLSMode
        /// `sslrootcert`: a PEM file of the CA certificates to trust; nil: the system's (`sslrootcert=system`, with
        /// `verify-full` only), or none needed.
        var rootCertificates: String?

        /// libpq's six `sslmode` values (https://www.postgresql.org/docs/current/libpq-ssl.html), and no other.
        enum TLSMode: String, CaseIterable {
            /// Plain text only.
            case disable
            /// libpq tries plain text first; postgres-nio cannot, so TLS is tried first, as with `prefer` (never weaker).
            case allow
            /// TLS when the server offers it, else plain text; the certificate is verified only against `sslrootcert`.
            case prefer
            /// TLS or no connection; the certificate is verified only against `sslrootcert` (then as `verify-ca`).
            case require
            /// TLS, the certificate signed by a trusted CA (`sslrootcert`, else the system's), any host name.
            case verifyCA = "verify-ca"
            /// TLS, the certificate signed by a trusted CA and naming the host.
            case verifyFull = "verify-full"
        }

        /// The URL's parameters the relay reads; any other is refused rather than ignored (a misspelt `sslmode` must not
        /// connect in plain text).
        static let parameters = ["sslmode", "sslrootcert"]

        /// A URL it cannot use is a ``CatalogError/unavailable(_:)`` that says why.
        init(_ text: String) throws {
            guard let url = URLComponents(string: text), ["postgres", "postgresql"].contains(url.scheme ?? ""), let host = url.host,
                !host.isEmpty, let user = url.user, !user.isEmpty
            else {
                throw CatalogError.unavailable("\(Self.redacted(text)) is not postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=MODE]")
            }
            self.host = host
            self.port = url.port ?? 5432
            self.user = user
            self.password = url.password
            self.database = url.path.split(separator: "/").first.map(String.init)
            var seen = Set<String>()
            for item in url.queryItems ?? [] {
                guard Self.parameters.contains(item.name) else {
                    throw CatalogError.unavailable(
                        "the catalog URL's parameter \"\(item.name)\" is not one the relay takes (\(Self.parameters.joined(separator: ", ")))"
                    )
                }
                guard seen.insert(item.name).inserted else { throw CatalogError.unavailable("the catalog URL gives \(item.name) twice") }
            }
            let mode = url.queryItems?.first { $0.name == "sslmode" }?.value ?? "prefer"
            guard let tlsMode = TLSMode(rawValue: mode) else {
                throw CatalogError.unavailable(
                    "sslmode \"\(mode)\" is not one of \(TLSMode.allCases.map(\.rawValue).joined(separator: ", ")) (libpq's values)"
                )
            }
            self.tlsMode = tlsMode
            let roots = url.queryItems?.first(where: { $0.name == "sslrootcert" })?.value
            switch (tlsMode, roots) {
            case (.verifyCA, nil), (.verifyFull, nil):
                // As libpq, which then reads ~/.postgresql/root.crt and fails without it: the CA is named, never assumed.
                throw CatalogError.unavailable(
                    "sslmode=\(tlsMode.rawValue) needs sslrootcert: the CA's PEM file to verify the server by (or sslrootcert=system with verify-full)"
                )
            case (_, "system") where tlsMode != .verifyFull:
                // As libpq: the system's CAs vouch for any name, so only with the name checked too.
                throw CatalogError.unavailable("sslrootcert=system goes with sslmode=verify-full only (the system's CAs vouch for any host name)")
            case (_, "system"), (_, nil):
                break
            case (_, let roots?):
                guard FileManager.default.isReadableFile(atPath: roots) else {
                    throw CatalogError.unavailable("sslrootcert \(roots): no readable file there (a PEM file of CA certificates, or system)")
                }
                self.rootCertificates = roots
            }
        }

        /// The URL as messages show it: without its password.
        static func redacted(_ text: String) -> String {
            guard var url = URLComponents(string: text) else { return "the catalog URL" }
            if url.password != nil { url.password = "***" }
            return url.string ?? "the catalog URL"
        }

        /// The TLS client configuration of the mode, or nil for none.
        func tlsConfiguration() throws -> TLSConfiguration? {
            var tls = TLSConfiguration.makeClientConfiguration()
            if let roots = self.rootCertificates {
                do {
                    tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(roots))
                } catch {
                    throw CatalogError.unavailable("sslrootcert \(roots) holds no PEM certificate: \(error)")
                }
            }
            switch self.tlsMode {
            case .disable:
                return nil
            case .allow, .prefer, .require:
                // As libpq: encrypted, and verified only when the operator named the CA.
                tls.certificateVerification = self.rootCertificates == nil ? .none : .noHostnameVerification
            case .verifyCA:
                tls.certificateVerification = .noHostnameVerification
            case .verifyFull:
                tls.certificateVerification = .fullVerification
            }
            return tls
        }

        /// Whether TLS is required (else only tried).
        var requiresTLS: Bool { [.require, .verifyCA, .verifyFull].contains(self.tlsMode) }

        /// The server ends what waits too long, under the call's own deadline: a lock held by a relay cut off mid-
        /// transaction cannot hang every other relay's commits (a query cannot be cancelled from here).
        static let startupParameters = [("lock_timeout", "10s"), ("statement_timeout", "12s"), ("idle_in_transaction_session_timeout", "60s")]
    }

    /// The pool's configuration of a `postgres://` URL.
    static func configuration(_ text: String) throws -> PostgresClient.Configuration {
        let address = try Address(text)
        let tls: PostgresClient.Configuration.TLS
        switch try address.tlsConfiguration() {
        case nil: tls = .disable
        case let configuration? where address.requiresTLS: tls = .require(configuration)
        case let configuration?: tls = .prefer(configuration)
        }
        var configuration = PostgresClient.Configuration(
            host: address.host, port: address.port, username: address.user, password: address.password, database: address.database, tls: tls
        )
        configuration.options.maximumConnections = 8
        configuration.options.additionalStartupParameters = Address.startupParameters
        return configuration
    }

    /// The configuration of one connection of its own to a `postgres://` URL (the relay's key locks).
    static func connectionConfiguration(_ text: String) throws -> PostgresConnection.Configuration {
        let address = try Address(text)
        let tls: PostgresConnection.Configuration.TLS
        switch try address.tlsConfiguration() {
        case nil: tls = .disable
        case let configuration? where address.requiresTLS: tls = .require(try NIOSSLContext(configuration: configuration))
        case let configuration?: tls = .prefer(try NIOSSLContext(configuration: configuration))
        }
        var configuration = PostgresConnection.Configuration(
            host: address.host, port: address.port, username: address.user, password: address.password, database: address.database, tls: tls
        )
        configuration.options.additionalStartupParameters = Address.startupParameters
        return configuration
    }

    /// Connects once, on a connection of its own, and says what went wrong the way it went wrong: the pool retries a
    /// refused login or a failed TLS handshake in silence until the call's deadline, which said only "did not answer".
    static func probe(_ url: String, timeout: Duration, logger: Logger) async throws {
        let address = try Address(url)
        let configuration = try Self.connectionConfiguration(url)
        let place = "PostgreSQL at \(address.host):\(address.port)"
        do {
            try await withTaskExecutorPreference(Self.executor) {
                try await Self.connectOnce(configuration, timeout: timeout, place: place, logger: logger)
            }
        } catch let error as CatalogError {
            throw error
        } catch let error as PSQLError {
            throw CatalogError.unavailable(Self.describe(error, place: place, address: address))
        } catch {
            throw CatalogError.unavailable("cannot connect to \(place): \(error)")
        }
    }

    /// Connects and closes, within `timeout`.
    private static func connectOnce(
        _ configuration: PostgresConnection.Configuration, timeout: Duration, place: String, logger: Logger
    ) async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                let connection = try await PostgresConnection.connect(
                    on: MultiThreadedEventLoopGroup.singleton.next(), configuration: configuration, id: 0, logger: logger
                )
                try? await connection.close()
            }
            group.addTask {
                try await Task.sleep(for: timeout)
                throw CatalogError.unavailable("\(place) did not answer within \(timeout): is it running there, and is --catalog right?")
            }
            defer { group.cancelAll() }
            try await group.next()
        }
    }

    /// A failed connection, as the operator can act on it.
    static func describe(_ error: PSQLError, place: String, address: Address) -> String {
        if let message = error.serverInfo?[.message] {
            let code = error.serverInfo?[.sqlState] ?? ""
            // 28P01: invalid password; 28000: invalid authorization (pg_hba.conf refused the user or the host).
            if code == "28P01" || code == "28000" {
                return
                    "\(place) refused the login of user \"\(address.user)\": \(message) (check the user and password in --catalog, and pg_hba.conf)"
            }
            return "\(place) refused the connection: \(message)"
        }
        switch error.code {
        case .sslUnsupported:
            return
                "\(place) does not offer TLS, which sslmode=\(address.tlsMode.rawValue) requires (enable ssl on the server, or choose another sslmode)"
        case .failedToAddSSLHandler:
            return "TLS with \(place) could not start: \(error.underlying.map { "\($0)" } ?? "\(error)")"
        default:
            if let underlying = error.underlying {
                let text = "\(underlying)"
                if underlying is NIOSSLError || text.contains("SSL") || text.contains("certificate") {
                    return
                        "TLS with \(place) failed: \(text) (sslmode=\(address.tlsMode.rawValue): check sslrootcert, and that the certificate names \(address.host))"
                }
                return "cannot connect to \(place): \(text)"
            }
            return "cannot connect to \(place): \(error.code)"
        }
    }

    // MARK: Running queries

    /// Runs `body` on a pooled connection and waits for it.
    func run<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        let client = self.client
        return try await self.mapped { try await client.withConnection { connection in try await body(connection) } }
    }

    /// Runs `body` in one transaction (rolled back when it throws) and waits for it: READ COMMITTED whatever the server's
    /// default (the quota rule reads the latest commits after taking its account's row), or with `snapshot` one read-only
    /// view of the data.
    func transaction<T: Sendable>(
        snapshot: Bool = false, _ body: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws -> T {
        let (client, logger) = (self.client, self.logger)
        let begin: PostgresQuery = snapshot ? "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" : "BEGIN ISOLATION LEVEL READ COMMITTED"
        return try await self.mapped {
            try await client.withConnection { connection in
                try await connection.query(begin, logger: logger)
                do {
                    let value = try await body(connection)
                    try await connection.query("COMMIT", logger: logger)
                    return value
                } catch {
                    _ = try? await connection.query("ROLLBACK", logger: logger)
                    throw error
                }
            }
        }
    }

    /// The database's errors as ``CatalogError/unavailable(_:)``, with what PostgreSQL said; the catalog's own pass through.
    func mapped<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        try await Self.mapped(timeout: self.timeout, body)
    }

    /// On the catalog's own executor (``executor``), whatever the caller's: a query must go on, its transaction never
    /// left idle, while the process's shared cooperative pool is busy.
    static func mapped<T: Sendable>(timeout: Duration, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
        try await Self.mappingErrors {
            try await withTaskExecutorPreference(Self.executor) {
                try await Self.timed(timeout, body)
            }
        }
    }

    /// `body`, its PostgreSQL errors as ``CatalogError/unavailable(_:)`` with what the server said; the catalog's own pass through.
    static func mappingErrors<T>(_ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let error as CatalogError {
            throw error
        } catch let error as PSQLError {
            let said = error.serverInfo?[.message] ?? "\(error.code)"
            throw CatalogError.unavailable("PostgreSQL: \(said)\(error.underlying.map { " (\($0))" } ?? "")")
        }
    }

    /// What a call that had no answer within `timeout` throws.
    private static func unanswered(after timeout: Duration) -> CatalogError {
        CatalogError.unavailable("PostgreSQL did not answer within \(timeout): is it running, and is --catalog right?")
    }

    /// The outcome of `task`, or a ``CatalogError/unavailable(_:)`` after `timeout`, without waiting for `task` to end (a query that
    /// does not heed cancellation, blocked on a row lock, say, goes on after its caller gave up: its owner settles what it
    /// did, from `task`'s result).
    static func outcome<T: Sendable>(of task: Task<T, any Error>, within timeout: Duration) async throws -> T {
        let waiter = NIOLockedValueBox<CheckedContinuation<T, any Error>?>(nil)
        let resume: @Sendable (Result<T, any Error>) -> Void = { result in
            waiter.withLockedValue { waiter in
                waiter?.resume(with: result)
                waiter = nil
            }
        }
        let timer = NIOLockedValueBox<Task<Void, Never>?>(nil)
        return try await withCheckedThrowingContinuation { continuation in
            waiter.withLockedValue { $0 = continuation }
            timer.withLockedValue {
                $0 = Task(executorPreference: Self.executor) {
                    guard (try? await Task.sleep(for: timeout)) != nil else { return }
                    resume(.failure(Self.unanswered(after: timeout)))
                }
            }
            Task(executorPreference: Self.executor) {
                let result = await task.result
                timer.withLockedValue { $0?.cancel() }
                resume(result)
            }
        }
    }

    /// `body`, or a ``CatalogError/unavailable(_:)`` after `timeout`.
    private static func timed<T: Sendable>(_ timeout: Duration, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
        try await withThrowingTaskGroup(of: T.self) { group in
            group.addTask { try await body() }
            group.addTask {
                try await Task.sleep(for: timeout)
                throw Self.unanswered(after: timeout)
            }
            defer { group.cancelAll() }
            guard let first = try await group.next() else { throw CatalogError.unavailable("PostgreSQL call ended without an outcome") }
            return first
        }
    }

    static func rows(_ query: PostgresQuery, on connection: PostgresConnection, _ logger: Logger) async throws -> [PostgresRandomAccessRow] {
        try await connection.query(query, logger: logger).collect().map { $0.makeRandomAccess() }
    }

    /// Runs one statement of the caller's, with no parameters (tests and tools: making a database, say).
    public func execute(_ sql: String) async throws {
        let logger = self.logger
        try await self.run { _ = try await $0.query(PostgresQuery(unsafeSQL: sql), logger: logger).collect() }
    }

    // MARK: Schema

    func migrate() async throws {
        let logger = self.logger
        try await self.transaction { connection in
            // One relay at a time: the others wait here, then find the schema in place.
            // Collected: a SELECT's error (a lock timeout) comes with its rows, and would be lost otherwise.
            _ = try await connection.query("SELECT pg_advisory_xact_lock(7443001)", logger: logger).collect()
            try await connection.query(
                "CREATE TABLE IF NOT EXISTS upload_schema (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)",
                logger: logger
            )
            let current =
                try await Self.rows("SELECT COALESCE(MAX(version), 0) AS v FROM upload_schema", on: connection, logger)
                .first?["v"].decode(Int.self) ?? 0
            guard current < Self.schemaVersion else {
                guard current == Self.schemaVersion else {
                    throw CatalogError.unavailable(
                        "the catalog's schema is version \(current), newer than this relay's \(Self.schemaVersion): upgrade the relay")
                }
                return
            }
            for (version, statements) in Self.migrations where version > current {
                for statement in statements {
                    try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
                try await connection.query(
                    "INSERT INTO upload_schema (version, applied_at) VALUES (\(version), \(Date().timeIntervalSince1970))", logger: logger
                )
            }
        }
    }

    /// The SQLite catalog's migrations, in PostgreSQL's types, by version.
    static let migrations: [(Int, [String])] = [
        (
            1,
            [
                """
                CREATE TABLE account (
                    name TEXT PRIMARY KEY NOT NULL, token_hash BYTEA NOT NULL UNIQUE, quota BIGINT,
                    used_bytes BIGINT NOT NULL DEFAULT 0, revoked BOOLEAN NOT NULL DEFAULT FALSE, created_at DOUBLE PRECISION NOT NULL
                )
                """,
                """
                CREATE TABLE session (
                    id TEXT PRIMARY KEY NOT NULL, account TEXT NOT NULL REFERENCES account(name), key TEXT NOT NULL,
                    resume_token BYTEA NOT NULL, fingerprint BYTEA NOT NULL, declared_size BIGINT, durable_offset BIGINT NOT NULL,
                    sha1_state BYTEA NOT NULL, staging_name TEXT NOT NULL, updated_at DOUBLE PRECISION NOT NULL, UNIQUE (account, key)
                )
                """,
                """
                CREATE TABLE object (
                    account TEXT NOT NULL REFERENCES account(name), key TEXT NOT NULL, size BIGINT NOT NULL, sha1 TEXT NOT NULL,
                    committed_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (account, key)
                )
                """,
                "CREATE INDEX object_by_content ON object (account, size, sha1)",
            ]
        ),
        (
            2,
            [
                "ALTER TABLE object ADD COLUMN device BIGINT, ADD COLUMN inode BIGINT, ADD COLUMN modified BIGINT",
                "ALTER TABLE session ADD COLUMN declared_sha1 TEXT",
                """
                CREATE TABLE pending_commit (
                    account TEXT NOT NULL REFERENCES account(name), key TEXT NOT NULL, size BIGINT NOT NULL, sha1 TEXT NOT NULL,
                    delta BIGINT NOT NULL, session_id TEXT, PRIMARY KEY (account, key)
                )
                """,
            ]
        ),
        (3, ["ALTER TABLE object ADD COLUMN probe_sha1 TEXT"]),
        (
            4,
            [
                "ALTER TABLE session ADD COLUMN striped BOOLEAN NOT NULL DEFAULT FALSE",
                """
                CREATE TABLE session_stripe (
                    session_id TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE, stripe INTEGER NOT NULL,
                    bytes BIGINT NOT NULL, PRIMARY KEY (session_id, stripe)
                )
                """,
            ]
        ),
        (
            5,
            [
                """
                CREATE TABLE session_part (
                    session_id TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE, number INTEGER NOT NULL,
                    end_offset BIGINT NOT NULL, etag TEXT NOT NULL, sha1 TEXT NOT NULL, PRIMARY KEY (session_id, number)
                )
                """
            ]
        ),
        (
            6,
            [
                "ALTER TABLE pending_commit ADD COLUMN event_location TEXT",
                """
                CREATE TABLE commit_event (
                    id BIGSERIAL PRIMARY KEY, account TEXT NOT NULL, key TEXT NOT NULL, size BIGINT NOT NULL, sha1 TEXT NOT NULL,
                    location TEXT NOT NULL, committed_at DOUBLE PRECISION NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
                    next_attempt_at DOUBLE PRECISION NOT NULL, last_error TEXT
                )
                """,
                "CREATE INDEX commit_event_due ON commit_event (next_attempt_at)",
            ]
        ),
        (
            // The status endpoint lists keys in byte order (COLLATE "C"), which the primary keys' collation may not be.
            // SQLite's primary keys are in byte order already: it has no version 7.
            7,
            [
                "CREATE INDEX object_by_key_bytes ON object (account, key COLLATE \"C\")",
                "CREATE INDEX session_by_key_bytes ON session (account, key COLLATE \"C\")",
            ]
        ),
        (
            // The size each upload open on a relay announced, which the other relays count against its account's quota
            // while the relay's lock connection (server process `holder_pid`) holds the key's advisory lock `lock_id`
            // (``PostgresKeyLocks``). A catalog of one relay keeps that in the relay's memory: SQLite has no
            // version 8.
            8,
            [
                """
                CREATE TABLE open_reservation (
                    account TEXT NOT NULL REFERENCES account(name), key TEXT NOT NULL, bytes BIGINT NOT NULL,
                    holder_pid INTEGER NOT NULL, lock_id BIGINT NOT NULL, PRIMARY KEY (account, key)
                )
                """
            ]
        ),
        (
            9,
            [
                """
                CREATE TABLE multipart_intent (
                    id BIGSERIAL PRIMARY KEY, account TEXT NOT NULL, key TEXT NOT NULL, object_key TEXT NOT NULL,
                    upload_id TEXT, created_at DOUBLE PRECISION NOT NULL
                )
                """
            ]
        ),
        (
            // Key locks as rows (``PostgresKeyLocks``), one per key uploaded, held by the relay connection whose
            // liveness lock is `holder_token`: no longer one session advisory lock per open upload, which fill
            // PostgreSQL's lock table at a fleet's scale. Unlogged: a claim means nothing after a crash of the server.
            // Relays of a version before this one take advisory locks instead: stop them all before starting this one.
            10,
            [
                """
                CREATE UNLOGGED TABLE key_claim (
                    lock_id BIGINT PRIMARY KEY, holder_pid INTEGER NOT NULL, holder_token BIGINT NOT NULL, holds INTEGER NOT NULL
                )
                """
            ]
        ),
        (
            // Each relay's last look at the accounts (``RelayAdmin/waitForLooks(catalog:after:timeout:)``): a token
            // delete or revocation returns once every running relay has told its connections.
            11,
            ["CREATE TABLE relay_look (relay TEXT PRIMARY KEY, read_at DOUBLE PRECISION NOT NULL)"]
        ),
    ]
}
