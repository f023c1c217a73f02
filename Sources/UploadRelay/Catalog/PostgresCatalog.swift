import Foundation
import Logging
import NIOCore
import PostgresNIO

/// The catalog several relays share (`--catalog postgres://USER:PASSWORD@HOST:PORT/DATABASE`, issue 10): the tables,
/// rules and answers of ``SQLiteCatalog``, in PostgreSQL through postgres-nio.
///
/// - Schema versions are those of the SQLite catalog (`upload_schema` records them); a new relay migrates under an
///   advisory lock, so relays started together migrate once.
/// - Commits serialize per account on its row (`SELECT ... FOR UPDATE`): the quota one relay checks is the quota
///   another one's commit leaves, whatever relay each upload reached.
/// - Every call blocks its caller, as the protocol says (``Blocking``), on the relay's I/O pool.
public final class PostgresCatalog: Catalog, @unchecked Sendable {
    let client: PostgresClient
    let logger: Logger
    /// The longest a call waits for the database (a connection included): past it, a ``CatalogFailure`` says so. The
    /// pool itself would wait for a database that is down for ever.
    let timeout: Duration
    private let running: Task<Void, Never>

    /// The schema version this code writes (the SQLite catalog's migrations, v1 to v5).
    static let schemaVersion = 5

    /// Connects (lazily, from a pool) to `url`, `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=disable|require]`,
    /// and migrates the schema.
    public init(url: String, logger: Logger, timeout: Duration = .seconds(15)) throws {
        let configuration = try Self.configuration(url)
        self.logger = logger
        self.timeout = timeout
        // The pool logs each failed connection attempt at info: only what matters reaches the relay's log.
        var background = logger
        background.logLevel = max(logger.logLevel, .warning)
        let client = PostgresClient(configuration: configuration, backgroundLogger: background)
        self.client = client
        // On the blocking side's executor, as the queries: the cooperative pool may be full of callers waiting for them.
        self.running = Task(executorPreference: Blocking.executor) { await client.run() }
        do {
            try self.migrate()
        } catch {
            self.running.cancel()
            throw error
        }
    }

    deinit {
        self.running.cancel()
    }

    /// Closes the pool's connections.
    public func shutdown() {
        self.running.cancel()
    }

    /// The client configuration of a `postgres://` URL; a URL it cannot use is a ``CatalogFailure`` that says why.
    static func configuration(_ text: String) throws -> PostgresClient.Configuration {
        guard let url = URLComponents(string: text), ["postgres", "postgresql"].contains(url.scheme ?? ""), let host = url.host,
            !host.isEmpty, let user = url.user, !user.isEmpty
        else {
            throw CatalogFailure("\(text.split(separator: "@").last.map(String.init) ?? "") is not postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE")
        }
        let database = url.path.split(separator: "/").first.map(String.init)
        let mode = url.queryItems?.first { $0.name == "sslmode" }?.value ?? "prefer"
        let tls: PostgresClient.Configuration.TLS
        switch mode {
        case "disable": tls = .disable
        case "require", "verify-full": tls = .require(.makeClientConfiguration())
        default: tls = .prefer(.makeClientConfiguration())
        }
        var configuration = PostgresClient.Configuration(
            host: host, port: url.port ?? 5432, username: user, password: url.password, database: database, tls: tls
        )
        configuration.options.maximumConnections = 8
        // The server ends what waits too long, under the call's own deadline: a lock held by a relay cut off mid-
        // transaction cannot hang every other relay's commits (a query cannot be cancelled from here).
        configuration.options.additionalStartupParameters = [
            ("lock_timeout", "10s"), ("statement_timeout", "12s"), ("idle_in_transaction_session_timeout", "60s"),
        ]
        return configuration
    }

    // MARK: Running queries

    /// Runs `body` on a pooled connection and waits for it.
    func run<T: Sendable>(_ body: @escaping @Sendable (PostgresConnection) async throws -> T) throws -> T {
        let client = self.client
        return try self.mapped { try await client.withConnection { connection in try await body(connection) } }
    }

    /// Runs `body` in one transaction (rolled back when it throws) and waits for it: READ COMMITTED whatever the server's
    /// default (the quota rule reads the latest commits after taking its account's row), or with `snapshot` one read-only
    /// view of the data.
    func transaction<T: Sendable>(snapshot: Bool = false, _ body: @escaping @Sendable (PostgresConnection) async throws -> T) throws -> T {
        let (client, logger) = (self.client, self.logger)
        let begin: PostgresQuery = snapshot ? "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" : "BEGIN ISOLATION LEVEL READ COMMITTED"
        return try self.mapped {
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

    /// The database's errors as ``CatalogFailure``, with what PostgreSQL said; the catalog's own pass through.
    func mapped<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
        let timeout = self.timeout
        do {
            return try Blocking.run {
                try await withThrowingTaskGroup(of: T.self) { group in
                    group.addTask { try await body() }
                    group.addTask {
                        try await Task.sleep(for: timeout)
                        throw CatalogFailure("PostgreSQL did not answer within \(timeout): is it running, and is --catalog right?")
                    }
                    defer { group.cancelAll() }
                    guard let first = try await group.next() else { throw CatalogFailure("PostgreSQL call ended without an outcome") }
                    return first
                }
            }
        } catch let error as CatalogError {
            throw error
        } catch let error as PSQLError {
            let said = error.serverInfo?[.message] ?? "\(error.code)"
            throw CatalogFailure("PostgreSQL: \(said)\(error.underlying.map { " (\($0))" } ?? "")")
        }
    }

    static func rows(_ query: PostgresQuery, on connection: PostgresConnection, _ logger: Logger) async throws -> [PostgresRandomAccessRow] {
        try await connection.query(query, logger: logger).collect().map { $0.makeRandomAccess() }
    }

    /// Runs one statement of the caller's, with no parameters (tests and tools: making a database, say).
    public func execute(_ sql: String) throws {
        let logger = self.logger
        try self.run { try await $0.query(PostgresQuery(unsafeSQL: sql), logger: logger) }
    }

    // MARK: Schema

    func migrate() throws {
        let logger = self.logger
        try self.transaction { connection in
            // One relay at a time: the others wait here, then find the schema in place.
            try await connection.query("SELECT pg_advisory_xact_lock(7443001)", logger: logger)
            try await connection.query(
                "CREATE TABLE IF NOT EXISTS upload_schema (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)",
                logger: logger
            )
            let current = try await Self.rows("SELECT COALESCE(MAX(version), 0) AS v FROM upload_schema", on: connection, logger)
                .first?["v"].decode(Int.self) ?? 0
            guard current < Self.schemaVersion else {
                guard current == Self.schemaVersion else {
                    throw CatalogFailure("the catalog's schema is version \(current), newer than this relay's \(Self.schemaVersion): upgrade the relay")
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
    ]

    // MARK: Accounts

    public func addAccount(name: String, tokenHash: [UInt8], quota: Int64?) throws {
        guard Account.isValidName(name) else { throw CatalogError.invalidAccountName(name) }
        let logger = self.logger
        try self.transaction { connection in
            let added = try await Self.rows(
                """
                INSERT INTO account (name, token_hash, quota, created_at) VALUES (\(name), \(Data(tokenHash)), \(quota), \(Date().timeIntervalSince1970))
                ON CONFLICT (name) DO NOTHING RETURNING name
                """,
                on: connection, logger
            )
            guard !added.isEmpty else { throw CatalogError.accountExists(name) }
        }
    }

    static func account(_ row: PostgresRandomAccessRow) throws -> Account {
        Account(
            name: try row["name"].decode(String.self), quota: try row["quota"].decode(Int64?.self),
            usedBytes: try row["used_bytes"].decode(Int64.self), revoked: try row["revoked"].decode(Bool.self),
            createdAt: Date(timeIntervalSince1970: try row["created_at"].decode(Double.self))
        )
    }

    public func account(tokenHash: [UInt8]) throws -> Account? {
        let logger = self.logger
        return try self.run { try await Self.rows("SELECT * FROM account WHERE token_hash = \(Data(tokenHash))", on: $0, logger).first.map(Self.account) }
    }

    public func account(named name: String) throws -> Account? {
        let logger = self.logger
        return try self.run { try await Self.rows("SELECT * FROM account WHERE name = \(name)", on: $0, logger).first.map(Self.account) }
    }

    public func accounts() throws -> [Account] {
        let logger = self.logger
        // Byte order, as SQLite sorts: not the database's collation.
        return try self.run { try await Self.rows("SELECT * FROM account ORDER BY name COLLATE \"C\"", on: $0, logger).map(Self.account) }
    }

    public func revokeAccount(named name: String) throws -> Bool {
        let logger = self.logger
        return try self.run {
            try await !Self.rows("UPDATE account SET revoked = TRUE WHERE name = \(name) RETURNING name", on: $0, logger).isEmpty
        }
    }

    // MARK: Sessions

    static func session(_ row: PostgresRandomAccessRow) throws -> UploadSession {
        UploadSession(
            id: try row["id"].decode(String.self), account: try row["account"].decode(String.self), key: try row["key"].decode(String.self),
            resumeToken: [UInt8](try row["resume_token"].decode(Data.self)), fingerprint: [UInt8](try row["fingerprint"].decode(Data.self)),
            declaredSize: try row["declared_size"].decode(Int64?.self), durableOffset: try row["durable_offset"].decode(Int64.self),
            sha1State: [UInt8](try row["sha1_state"].decode(Data.self)), stagingName: try row["staging_name"].decode(String.self),
            declaredSHA1: try row["declared_sha1"].decode(String?.self), striped: try row["striped"].decode(Bool.self),
            updatedAt: Date(timeIntervalSince1970: try row["updated_at"].decode(Double.self))
        )
    }

    public func session(account: String, key: String) throws -> UploadSession? {
        let logger = self.logger
        return try self.run {
            try await Self.rows("SELECT * FROM session WHERE account = \(account) AND key = \(key)", on: $0, logger).first.map(Self.session)
        }
    }

    public func putSession(_ session: UploadSession) throws {
        try self.putSession(session, parts: [])
    }

    public func putSession(_ s: UploadSession, parts: [StagedPart]) throws {
        let logger = self.logger
        try self.transaction { connection in
            // One recorder of a key at a time (on any relay): under READ COMMITTED, a DELETE does not see a row another
            // transaction inserts meanwhile, and the INSERT would then break UNIQUE (account, key).
            try await connection.query(
                "SELECT pg_advisory_xact_lock(hashtextextended(\(s.account) || '/' || \(s.key), 0))", logger: logger
            )
            try await connection.query("DELETE FROM session WHERE account = \(s.account) AND key = \(s.key)", logger: logger)
            try await connection.query(
                """
                INSERT INTO session (id, account, key, resume_token, fingerprint, declared_size, durable_offset, sha1_state, staging_name,
                    declared_sha1, striped, updated_at)
                VALUES (\(s.id), \(s.account), \(s.key), \(Data(s.resumeToken)), \(Data(s.fingerprint)), \(s.declaredSize), \(s.durableOffset),
                    \(Data(s.sha1State)), \(s.stagingName), \(s.declaredSHA1), \(s.striped), \(s.updatedAt.timeIntervalSince1970))
                """,
                logger: logger
            )
            try await Self.insert(parts, of: s.id, on: connection, logger)
        }
    }

    public func updateDurable(sessionID: String, offset: Int64, sha1State: [UInt8]) throws {
        try self.updateDurable(sessionID: sessionID, offset: offset, sha1State: sha1State, parts: [])
    }

    public func updateDurable(sessionID: String, offset: Int64, sha1State: [UInt8], parts: [StagedPart]) throws {
        let logger = self.logger
        try self.transaction { connection in
            let updated = try await Self.rows(
                """
                UPDATE session SET durable_offset = \(offset), sha1_state = \(Data(sha1State)), updated_at = \(Date().timeIntervalSince1970)
                WHERE id = \(sessionID) RETURNING id
                """,
                on: connection, logger
            )
            // A session that is gone cannot vouch for durable bytes: never acknowledge them.
            guard !updated.isEmpty else { throw CatalogError.unknownSession(sessionID) }
            try await Self.insert(parts, of: sessionID, on: connection, logger)
        }
    }

    static func insert(_ parts: [StagedPart], of sessionID: String, on connection: PostgresConnection, _ logger: Logger) async throws {
        for part in parts {
            try await connection.query(
                """
                INSERT INTO session_part (session_id, number, end_offset, etag, sha1) VALUES (\(sessionID), \(part.number), \(part.end), \(part.etag), \(part.sha1))
                ON CONFLICT (session_id, number) DO UPDATE SET end_offset = EXCLUDED.end_offset, etag = EXCLUDED.etag, sha1 = EXCLUDED.sha1
                """,
                logger: logger
            )
        }
    }

    public func stagedParts(sessionID: String) throws -> [StagedPart] {
        let logger = self.logger
        return try self.run {
            try await Self.rows("SELECT * FROM session_part WHERE session_id = \(sessionID) ORDER BY number", on: $0, logger).map {
                StagedPart(
                    number: try $0["number"].decode(Int.self), end: try $0["end_offset"].decode(Int64.self), etag: try $0["etag"].decode(String.self),
                    sha1: try $0["sha1"].decode(String.self)
                )
            }
        }
    }

    public func completeStripe(sessionID: String, index: Int, bytes: Int64) throws {
        let logger = self.logger
        try self.transaction { connection in
            // Also keeps a striped upload whose main stream waits from expiring while its stripes arrive.
            let updated = try await Self.rows(
                "UPDATE session SET updated_at = \(Date().timeIntervalSince1970) WHERE id = \(sessionID) RETURNING id", on: connection, logger
            )
            guard !updated.isEmpty else { throw CatalogError.unknownSession(sessionID) }
            try await connection.query(
                "INSERT INTO session_stripe (session_id, stripe, bytes) VALUES (\(sessionID), \(index), \(bytes)) ON CONFLICT DO NOTHING",
                logger: logger
            )
        }
    }

    public func completeStripes(sessionID: String) throws -> Set<Int> {
        let logger = self.logger
        return try self.run {
            Set(try await Self.rows("SELECT stripe FROM session_stripe WHERE session_id = \(sessionID)", on: $0, logger).map { try $0["stripe"].decode(Int.self) })
        }
    }

    public func deleteSession(id: String) throws {
        let logger = self.logger
        try self.run { try await $0.query("DELETE FROM session WHERE id = \(id)", logger: logger) }
    }

    public func sessions(updatedBefore date: Date) throws -> [UploadSession] {
        let logger = self.logger
        // distantFuture's seconds are beyond a double's exact integers but not its range: fine for a comparison.
        return try self.run {
            try await Self.rows("SELECT * FROM session WHERE updated_at < \(date.timeIntervalSince1970)", on: $0, logger).map(Self.session)
        }
    }

    // MARK: Objects

    static func object(_ row: PostgresRandomAccessRow) throws -> StoredObject {
        var identity: ObjectIdentity? = nil
        if let device = try row["device"].decode(Int64?.self), let inode = try row["inode"].decode(Int64?.self),
            let modified = try row["modified"].decode(Int64?.self)
        {
            identity = ObjectIdentity(
                device: UInt64(bitPattern: device), inode: UInt64(bitPattern: inode), size: try row["size"].decode(Int64.self), modified: modified
            )
        }
        return StoredObject(
            account: try row["account"].decode(String.self), key: try row["key"].decode(String.self), size: try row["size"].decode(Int64.self),
            sha1: try row["sha1"].decode(String.self), identity: identity,
            committedAt: Date(timeIntervalSince1970: try row["committed_at"].decode(Double.self)), probeSHA1: try row["probe_sha1"].decode(String?.self)
        )
    }

    public func object(account: String, key: String) throws -> StoredObject? {
        let logger = self.logger
        return try self.run {
            try await Self.rows("SELECT * FROM object WHERE account = \(account) AND key = \(key)", on: $0, logger).first.map(Self.object)
        }
    }

    public func object(account: String, size: Int64, sha1: String) throws -> [StoredObject] {
        let logger = self.logger
        return try self.run {
            try await Self.rows("SELECT * FROM object WHERE account = \(account) AND size = \(size) AND sha1 = \(sha1) LIMIT 8", on: $0, logger)
                .map(Self.object)
        }
    }

    public func probeCandidates(account: String, size: Int64, probe: String) throws -> [StoredObject] {
        let logger = self.logger
        return try self.run {
            try await Self.rows(
                "SELECT * FROM object WHERE account = \(account) AND size = \(size) AND (probe_sha1 = \(probe) OR probe_sha1 IS NULL) LIMIT 8",
                on: $0, logger
            ).map(Self.object)
        }
    }

    public func objects() throws -> [StoredObject] {
        let logger = self.logger
        return try self.run { try await Self.rows("SELECT * FROM object", on: $0, logger).map(Self.object) }
    }

    public func deleteObject(account: String, key: String) throws {
        let logger = self.logger
        try self.transaction { connection in
            do {
                try await Self.lockAccount(account, on: connection, logger)
            } catch CatalogError.unknownAccount {
                return  // nothing of it to forget, as in SQLite
            }
            let deleted = try await Self.rows(
                "DELETE FROM object WHERE account = \(account) AND key = \(key) RETURNING size", on: connection, logger
            )
            guard let size = try deleted.first?["size"].decode(Int64.self) else { return }
            try await connection.query("UPDATE account SET used_bytes = used_bytes - \(size) WHERE name = \(account)", logger: logger)
        }
    }

    // MARK: Quota and commits

    /// Takes the account's row for the transaction: commits and quota decisions of one account, on any relay, one at a
    /// time. Throws ``CatalogError/unknownAccount(_:)`` when there is none.
    static func lockAccount(_ account: String, on connection: PostgresConnection, _ logger: Logger) async throws {
        // NO KEY: commits take turns, while sessions and objects that refer to the account go on being recorded.
        guard try await !Self.rows("SELECT name FROM account WHERE name = \(account) FOR NO KEY UPDATE", on: connection, logger).isEmpty else {
            throw CatalogError.unknownAccount(account)
        }
    }

    /// ``SQLiteCatalog``'s quota rule, read in the transaction of `connection`.
    static func quotaUse(
        _ account: String, excludingKey key: String, active: [String: Int64], on connection: PostgresConnection, _ logger: Logger
    ) async throws -> QuotaUse {
        guard let row = try await Self.rows("SELECT * FROM account WHERE name = \(account)", on: connection, logger).first else {
            throw CatalogError.unknownAccount(account)
        }
        let committing =
            try await Self.rows(
                "SELECT COALESCE(SUM(delta), 0)::BIGINT AS total FROM pending_commit WHERE account = \(account) AND key != \(key) AND delta > 0",
                on: connection, logger
            ).first?["total"].decode(Int64.self) ?? 0
        var staged: Int64 = 0
        var unrecorded = active
        unrecorded[key] = nil
        for row in try await Self.rows(
            """
            SELECT s.key, s.declared_size,
                s.durable_offset + (SELECT COALESCE(SUM(bytes), 0) FROM session_stripe WHERE session_id = s.id)::BIGINT AS durable_offset,
                COALESCE(o.size, 0) AS replaced
            FROM session s LEFT JOIN object o ON o.account = s.account AND o.key = s.key
            WHERE s.account = \(account) AND s.key != \(key) AND s.key NOT IN (SELECT key FROM pending_commit WHERE account = \(account))
            """,
            on: connection, logger
        ) {
            let durable = try row["durable_offset"].decode(Int64.self)
            let declared = try row["declared_size"].decode(Int64?.self)
            let replaced = try row["replaced"].decode(Int64.self)
            let sessionKey = try row["key"].decode(String.self)
            let held = max(0, (active[sessionKey] != nil ? max(declared ?? durable, durable) : durable) - replaced)
            staged = staged.addingReportingOverflow(held).overflow ? .max : staged + held
            unrecorded[sessionKey] = nil
        }
        if unrecorded.values.contains(where: { $0 > 0 }) {
            for row in try await Self.rows("SELECT key FROM pending_commit WHERE account = \(account)", on: connection, logger) {
                unrecorded[try row["key"].decode(String.self)] = nil
            }
        }
        for (openKey, announced) in unrecorded where announced > 0 {
            let replaced =
                try await Self.rows("SELECT size FROM object WHERE account = \(account) AND key = \(openKey)", on: connection, logger)
                .first?["size"].decode(Int64.self) ?? 0
            let held = max(0, announced - replaced)
            staged = staged.addingReportingOverflow(held).overflow ? .max : staged + held
        }
        return QuotaUse(
            quota: try row["quota"].decode(Int64?.self), stored: try row["used_bytes"].decode(Int64.self), committing: committing, staged: staged
        )
    }

    public func quotaUse(account: String, excludingKey key: String, active: [String: Int64]) throws -> QuotaUse {
        let logger = self.logger
        // One view of the data: a commit of another relay landing between the statements would undercount.
        return try self.transaction(snapshot: true) { try await Self.quotaUse(account, excludingKey: key, active: active, on: $0, logger) }
    }

    public func beginCommit(_ commit: PendingCommit) throws {
        let logger = self.logger
        try self.transaction { try await Self.beginCommit(commit, on: $0, logger) }
    }

    /// One transaction for the group; each account's row is taken once, in name order (no deadlock between relays).
    public func beginCommits(_ commits: [PendingCommit]) throws -> [CatalogError?] {
        let logger = self.logger
        return try self.transaction { connection in
            for account in Set(commits.map(\.account)).sorted() {
                do {
                    try await Self.lockAccount(account, on: connection, logger)
                } catch CatalogError.unknownAccount {
                    continue  // refused below, commit by commit
                }
            }
            var results: [CatalogError?] = []
            for commit in commits {
                do {
                    try await connection.query("SAVEPOINT one_commit", logger: logger)
                    try await Self.beginCommit(commit, on: connection, logger, locked: true)
                    try await connection.query("RELEASE SAVEPOINT one_commit", logger: logger)
                    results.append(nil)
                } catch let error as CatalogError {
                    try await connection.query("ROLLBACK TO SAVEPOINT one_commit", logger: logger)
                    results.append(error)
                }
            }
            return results
        }
    }

    static func beginCommit(_ commit: PendingCommit, on connection: PostgresConnection, _ logger: Logger, locked: Bool = false) async throws {
        if !locked { try await Self.lockAccount(commit.account, on: connection, logger) }
        let use = try await Self.quotaUse(commit.account, excludingKey: commit.key, active: [:], on: connection, logger)
        let previous =
            try await Self.rows("SELECT size FROM object WHERE account = \(commit.account) AND key = \(commit.key)", on: connection, logger)
            .first?["size"].decode(Int64.self) ?? 0
        let delta = commit.size - previous
        if let quota = use.quota, delta > 0, use.stored + use.committing + delta > quota {
            throw CatalogError.quotaExceeded(account: commit.account, needed: delta, quota: quota, used: use.stored + use.committing)
        }
        try await connection.query(
            """
            INSERT INTO pending_commit (account, key, size, sha1, delta, session_id)
            VALUES (\(commit.account), \(commit.key), \(commit.size), \(commit.sha1), \(delta), \(commit.sessionID))
            ON CONFLICT (account, key) DO UPDATE SET size = EXCLUDED.size, sha1 = EXCLUDED.sha1, delta = EXCLUDED.delta,
                session_id = EXCLUDED.session_id
            """,
            logger: logger
        )
    }

    public func finishCommit(_ commit: PendingCommit, identity: ObjectIdentity) throws {
        try self.finishCommits([(commit, identity)])
    }

    public func finishCommits(_ commits: [(PendingCommit, ObjectIdentity)]) throws {
        let logger = self.logger
        try self.transaction { connection in
            for account in Set(commits.map(\.0.account)).sorted() {
                do {
                    try await Self.lockAccount(account, on: connection, logger)
                } catch CatalogError.unknownAccount {
                    continue
                }
            }
            for (commit, identity) in commits {
                let previous =
                    try await Self.rows("SELECT size FROM object WHERE account = \(commit.account) AND key = \(commit.key)", on: connection, logger)
                    .first?["size"].decode(Int64.self) ?? 0
                try await connection.query(
                    """
                    INSERT INTO object (account, key, size, sha1, committed_at, device, inode, modified, probe_sha1)
                    VALUES (\(commit.account), \(commit.key), \(commit.size), \(commit.sha1), \(Date().timeIntervalSince1970),
                        \(Int64(bitPattern: identity.device)), \(Int64(bitPattern: identity.inode)), \(identity.modified), \(commit.probeSHA1))
                    ON CONFLICT (account, key) DO UPDATE SET size = EXCLUDED.size, sha1 = EXCLUDED.sha1, committed_at = EXCLUDED.committed_at,
                        device = EXCLUDED.device, inode = EXCLUDED.inode, modified = EXCLUDED.modified, probe_sha1 = EXCLUDED.probe_sha1
                    """,
                    logger: logger
                )
                try await connection.query(
                    "UPDATE account SET used_bytes = used_bytes + \(commit.size - previous) WHERE name = \(commit.account)", logger: logger
                )
                try await connection.query(
                    "DELETE FROM pending_commit WHERE account = \(commit.account) AND key = \(commit.key)", logger: logger
                )
                if let sessionID = commit.sessionID {
                    try await connection.query("DELETE FROM session WHERE id = \(sessionID)", logger: logger)
                }
            }
        }
    }

    public func abandonCommit(account: String, key: String) throws {
        let logger = self.logger
        try self.run { try await $0.query("DELETE FROM pending_commit WHERE account = \(account) AND key = \(key)", logger: logger) }
    }

    public func pendingCommits() throws -> [PendingCommit] {
        let logger = self.logger
        return try self.run {
            try await Self.rows("SELECT * FROM pending_commit", on: $0, logger).map {
                PendingCommit(
                    account: try $0["account"].decode(String.self), key: try $0["key"].decode(String.self), size: try $0["size"].decode(Int64.self),
                    sha1: try $0["sha1"].decode(String.self), sessionID: try $0["session_id"].decode(String?.self)
                )
            }
        }
    }
}

/// The catalog could not be reached or used (a database down, a URL it cannot use, a schema too new): the relay's
/// failure, not a refusal of the upload, which keeps its session.
public struct CatalogFailure: Error, CustomStringConvertible, Sendable {
    public var description: String

    public init(_ description: String) {
        self.description = description
    }
}
