import UploadRelay
import Foundation
import GRDB

/// The embedded catalog: one SQLite file, WAL journal, `synchronous=FULL` so that a recorded
/// durable offset survives a crash of the relay or the machine (SPEC §6.1).
public final class SQLiteCatalog: Catalog {
    let database: DatabaseQueue

    /// Opens (creating and migrating) the catalog at `path`.
    public init(path: String) throws {
        var configuration = Configuration()
        configuration.busyMode = .timeout(5)
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = FULL")
        }
        self.database = try DatabaseQueue(path: path, configuration: configuration)
        try self.database.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA journal_mode = WAL")
        }
        try Self.migrator.migrate(self.database)
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(
                sql: """
                    CREATE TABLE account (
                        name TEXT PRIMARY KEY NOT NULL,
                        token_hash BLOB NOT NULL UNIQUE,
                        quota INTEGER,
                        used_bytes INTEGER NOT NULL DEFAULT 0,
                        revoked INTEGER NOT NULL DEFAULT 0,
                        created_at DOUBLE NOT NULL
                    );
                    CREATE TABLE session (
                        id TEXT PRIMARY KEY NOT NULL,
                        account TEXT NOT NULL REFERENCES account(name),
                        key TEXT NOT NULL,
                        resume_token BLOB NOT NULL,
                        fingerprint BLOB NOT NULL,
                        declared_size INTEGER,
                        durable_offset INTEGER NOT NULL,
                        sha1_state BLOB NOT NULL,
                        staging_name TEXT NOT NULL,
                        updated_at DOUBLE NOT NULL,
                        UNIQUE (account, key)
                    );
                    CREATE TABLE object (
                        account TEXT NOT NULL REFERENCES account(name),
                        key TEXT NOT NULL,
                        size INTEGER NOT NULL,
                        sha1 TEXT NOT NULL,
                        committed_at DOUBLE NOT NULL,
                        PRIMARY KEY (account, key)
                    );
                    CREATE INDEX object_by_content ON object (account, size, sha1);
                    """
            )
        }
        migrator.registerMigration("v2: object identity, pending commits, declared SHA-1") { db in
            try db.execute(
                sql: """
                    ALTER TABLE object ADD COLUMN device INTEGER;
                    ALTER TABLE object ADD COLUMN inode INTEGER;
                    ALTER TABLE object ADD COLUMN modified INTEGER;
                    ALTER TABLE session ADD COLUMN declared_sha1 TEXT;
                    CREATE TABLE pending_commit (
                        account TEXT NOT NULL REFERENCES account(name),
                        key TEXT NOT NULL,
                        size INTEGER NOT NULL,
                        sha1 TEXT NOT NULL,
                        delta INTEGER NOT NULL,
                        session_id TEXT,
                        PRIMARY KEY (account, key)
                    );
                    """
            )
        }
        migrator.registerMigration("v3: dedup probe digests") { db in
            // NULL: not known (objects from before, recovered commits, blobs of 256 KiB or less).
            try db.execute(sql: "ALTER TABLE object ADD COLUMN probe_sha1 TEXT")
        }
        migrator.registerMigration("v4: striped sessions") { db in
            try db.execute(
                sql: """
                    ALTER TABLE session ADD COLUMN striped INTEGER NOT NULL DEFAULT 0;
                    CREATE TABLE session_stripe (
                        session_id TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE,
                        stripe INTEGER NOT NULL,
                        bytes INTEGER NOT NULL,
                        PRIMARY KEY (session_id, stripe)
                    );
                    """
            )
        }
        migrator.registerMigration("v5: staged parts") { db in
            try db.execute(
                sql: """
                    CREATE TABLE session_part (
                        session_id TEXT NOT NULL REFERENCES session(id) ON DELETE CASCADE,
                        number INTEGER NOT NULL,
                        end_offset INTEGER NOT NULL,
                        etag TEXT NOT NULL,
                        sha1 TEXT NOT NULL,
                        PRIMARY KEY (session_id, number)
                    );
                    """
            )
        }
        migrator.registerMigration("v6: commit events (the hooks' outbox)") { db in
            try db.execute(
                sql: """
                    ALTER TABLE pending_commit ADD COLUMN event_location TEXT;
                    CREATE TABLE commit_event (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        account TEXT NOT NULL,
                        key TEXT NOT NULL,
                        size INTEGER NOT NULL,
                        sha1 TEXT NOT NULL,
                        location TEXT NOT NULL,
                        committed_at REAL NOT NULL,
                        attempts INTEGER NOT NULL DEFAULT 0,
                        next_attempt_at REAL NOT NULL,
                        last_error TEXT
                    );
                    CREATE INDEX commit_event_due ON commit_event (next_attempt_at);
                    """
            )
        }
        // Versions 7, 8 and 10 are PostgreSQL's alone (key order, reservations and key claims across relays).
        migrator.registerMigration("v9: multipart uploads begun (the S3 store's ledger)") { db in
            try db.execute(
                sql: """
                    CREATE TABLE multipart_intent (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        account TEXT NOT NULL,
                        key TEXT NOT NULL,
                        object_key TEXT NOT NULL,
                        upload_id TEXT,
                        created_at REAL NOT NULL
                    );
                    """
            )
        }
        migrator.registerMigration("v11: the relays' looks at the accounts") { db in
            try db.execute(sql: "CREATE TABLE relay_look (relay TEXT PRIMARY KEY NOT NULL, read_at DOUBLE NOT NULL)")
        }
        return migrator
    }

    /// Whether `error` is SQLite's "database or disk is full": the relay's disk, not the request, is at fault.
    static func isDiskFull(_ error: any Error) -> Bool {
        (error as? DatabaseError)?.resultCode == .SQLITE_FULL
    }

    public func addAccount(name: String, tokenHash: [UInt8], quota: Int64?) async throws {
        guard Account.isValidName(name) else { throw CatalogError.invalidAccountName(name) }
        try await self.writing { db in
            if try Row.fetchOne(db, sql: "SELECT 1 FROM account WHERE name = ?", arguments: [name]) != nil {
                throw CatalogError.accountExists(name)
            }
            try db.execute(
                cached: "INSERT INTO account (name, token_hash, quota, created_at) VALUES (?, ?, ?, ?)",
                arguments: [name, Data(tokenHash), quota, Date().timeIntervalSince1970]
            )
        }
    }

    static func account(_ row: Row) -> Account {
        Account(
            name: row["name"], quota: row["quota"], usedBytes: row["used_bytes"], revoked: row["revoked"],
            createdAt: Date(timeIntervalSince1970: row["created_at"]), tokenHash: [UInt8]((row["token_hash"] as Data?) ?? Data())
        )
    }

    public func account(tokenHash: [UInt8]) async throws -> Account? {
        try await self.reading { db in
            try Row.fetchOne(cached: db, sql: "SELECT * FROM account WHERE token_hash = ?", arguments: [Data(tokenHash)])
                .map(Self.account)
        }
    }

    public func account(named name: String) async throws -> Account? {
        try await self.reading { db in
            try Row.fetchOne(cached: db, sql: "SELECT * FROM account WHERE name = ?", arguments: [name]).map(Self.account)
        }
    }

    public func accounts() async throws -> [Account] {
        try await self.reading { db in
            try Row.fetchAll(cached: db, sql: "SELECT * FROM account ORDER BY name").map(Self.account)
        }
    }

    /// One host: its clock.
    public func clock() async throws -> Date { Date() }

    public func recordLook(relay: String, readAt: Date) async throws {
        try await self.writing { db in
            let at = readAt.timeIntervalSince1970
            try db.execute(
                cached:
                    "INSERT INTO relay_look (relay, read_at) VALUES (?, ?) ON CONFLICT (relay) DO UPDATE SET read_at = max(read_at, excluded.read_at)",
                arguments: [relay, at])
            try db.execute(cached: "DELETE FROM relay_look WHERE read_at < ?", arguments: [at - 86_400])
        }
    }

    public func relayLooks() async throws -> [String: Date] {
        try await self.reading { db in
            var looks: [String: Date] = [:]
            for row in try Row.fetchAll(cached: db, sql: "SELECT relay, read_at FROM relay_look") {
                looks[row["relay"]] = Date(timeIntervalSince1970: row["read_at"])
            }
            return looks
        }
    }

    public func forgetLook(relay: String) async throws {
        try await self.writing { db in try db.execute(cached: "DELETE FROM relay_look WHERE relay = ?", arguments: [relay]) }
    }

    public func revokeAccount(named name: String) async throws -> Bool {
        try await self.writing { db in
            try db.execute(cached: "UPDATE account SET revoked = 1 WHERE name = ?", arguments: [name])
            return db.changesCount > 0
        }
    }

    /// On a connection of its own, whose IMMEDIATE transaction (the write lock, taken before the checks) stays open
    /// while `removingFile` runs: every other writer, a relay's commit of the key included, waits for it, in this
    /// process or another.
    public func removeObject(
        account: String, key: String, removingFile: @escaping @Sendable (StoredObject) async throws -> Void
    ) async throws -> ObjectRemoval {
        var configuration = Configuration()
        configuration.busyMode = .timeout(5)
        configuration.allowsUnsafeTransactions = true
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = FULL")
        }
        let removal = try DatabaseQueue(path: self.database.path, configuration: configuration)
        // `.removed` here: the object, to remove now, the transaction left open.
        let found = try await removal.writeWithoutTransaction { db -> ObjectRemoval in
            try db.beginTransaction(.immediate)
            do {
                let outcome = try Self.removal(db, account: account, key: key)
                if case .removed = outcome { return outcome }
                try db.rollback()
                return outcome
            } catch {
                try? db.rollback()
                throw error
            }
        }
        guard case .removed(let object) = found else { return found }
        do {
            try await removingFile(object)
        } catch {
            try? await removal.writeWithoutTransaction { db in try db.rollback() }
            throw error
        }
        try await removal.writeWithoutTransaction { db in
            do {
                try db.execute(sql: "DELETE FROM object WHERE account = ? AND key = ?", arguments: [account, key])
                try db.execute(sql: "UPDATE account SET used_bytes = used_bytes - ? WHERE name = ?", arguments: [object.size, account])
                try db.commit()
            } catch {
                try? db.rollback()
                throw error
            }
        }
        return .removed(object)
    }

    /// Whether the object may be removed: `.removed` with its row when it may.
    private static func removal(_ db: Database, account: String, key: String) throws -> ObjectRemoval {
        guard
            let object = try Row.fetchOne(db, sql: "SELECT * FROM object WHERE account = ? AND key = ?", arguments: [account, key]).map(Self.object)
        else { return .notStored }
        if try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM session WHERE account = ? AND key = ?", arguments: [account, key]) ?? 0 > 0 {
            return .uploading
        }
        if try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM pending_commit WHERE account = ? AND key = ?", arguments: [account, key]) ?? 0 > 0 {
            return .committing
        }
        return .removed(object)
    }

    public func deleteAccount(named name: String) async throws -> Bool {
        try await self.writing { db in
            guard try Row.fetchOne(db, sql: "SELECT name FROM account WHERE name = ?", arguments: [name]) != nil else { return false }
            for (table, what) in [("object", "objects"), ("session", "uploads under way"), ("pending_commit", "commits being settled")] {
                if try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM \(table) WHERE account = ?", arguments: [name]) ?? 0 > 0 {
                    throw CatalogError.accountInUse(name, holds: what)
                }
            }
            try db.execute(sql: "DELETE FROM account WHERE name = ?", arguments: [name])
            return true
        }
    }

    public func updateAccount(named name: String, quota: Int64??, tokenHash: [UInt8]?, revoked: Bool?) async throws -> Bool {
        try await self.writing { db in
            guard try Row.fetchOne(db, sql: "SELECT name FROM account WHERE name = ?", arguments: [name]) != nil else { return false }
            if let quota { try db.execute(sql: "UPDATE account SET quota = ? WHERE name = ?", arguments: [quota, name]) }
            if let tokenHash { try db.execute(sql: "UPDATE account SET token_hash = ? WHERE name = ?", arguments: [Data(tokenHash), name]) }
            if let revoked { try db.execute(sql: "UPDATE account SET revoked = ? WHERE name = ?", arguments: [revoked, name]) }
            return true
        }
    }

    static func session(_ row: Row) -> UploadSession {
        UploadSession(
            id: row["id"], account: row["account"], key: row["key"],
            resumeToken: [UInt8]((row["resume_token"] as Data?) ?? Data()),
            fingerprint: [UInt8]((row["fingerprint"] as Data?) ?? Data()), declaredSize: row["declared_size"],
            durableOffset: row["durable_offset"], sha1State: [UInt8]((row["sha1_state"] as Data?) ?? Data()),
            stagingName: row["staging_name"], declaredSHA1: row["declared_sha1"], striped: row["striped"],
            updatedAt: Date(timeIntervalSince1970: row["updated_at"])
        )
    }

    public func session(account: String, key: String) async throws -> UploadSession? {
        try await self.reading { db in
            try Row.fetchOne(cached: db, sql: "SELECT * FROM session WHERE account = ? AND key = ?", arguments: [account, key])
                .map(Self.session)
        }
    }

    public func putSession(_ s: UploadSession) async throws {
        try await self.putSession(s, parts: [])
    }

    public func putSession(_ s: UploadSession, parts: [StagedPart]) async throws {
        try await self.writing { db in
            try db.execute(cached: "DELETE FROM session WHERE account = ? AND key = ?", arguments: [s.account, s.key])
            try db.execute(
                cached: """
                    INSERT INTO session (id, account, key, resume_token, fingerprint, declared_size, durable_offset,
                        sha1_state, staging_name, declared_sha1, striped, updated_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """,
                arguments: [
                    s.id, s.account, s.key, Data(s.resumeToken), Data(s.fingerprint), s.declaredSize, s.durableOffset,
                    Data(s.sha1State), s.stagingName, s.declaredSHA1, s.striped, s.updatedAt.timeIntervalSince1970,
                ]
            )
            try Self.insert(parts, of: s.id, db)
        }
    }

    public func updateDurable(sessionID: String, offset: Int64, sha1State: [UInt8]) async throws {
        try await self.updateDurable(sessionID: sessionID, offset: offset, sha1State: sha1State, parts: [])
    }

    public func updateDurable(sessionID: String, offset: Int64, sha1State: [UInt8], parts: [StagedPart]) async throws {
        try await self.writing { db in
            try db.execute(
                cached: "UPDATE session SET durable_offset = ?, sha1_state = ?, updated_at = ? WHERE id = ?",
                arguments: [offset, Data(sha1State), Date().timeIntervalSince1970, sessionID]
            )
            // A session that is gone cannot vouch for durable bytes: never acknowledge them.
            guard db.changesCount > 0 else { throw CatalogError.unknownSession(sessionID) }
            try Self.insert(parts, of: sessionID, db)
        }
    }

    private static func insert(_ parts: [StagedPart], of sessionID: String, _ db: Database) throws {
        for part in parts {
            try db.execute(
                cached: "INSERT OR REPLACE INTO session_part (session_id, number, end_offset, etag, sha1) VALUES (?, ?, ?, ?, ?)",
                arguments: [sessionID, part.number, part.end, part.etag, part.sha1]
            )
        }
    }

    public func stagedParts(sessionID: String) async throws -> [StagedPart] {
        try await self.reading { db in
            try Row.fetchAll(
                cached: db, sql: "SELECT * FROM session_part WHERE session_id = ? ORDER BY number", arguments: [sessionID]
            ).map { StagedPart(number: $0["number"], end: $0["end_offset"], etag: $0["etag"], sha1: $0["sha1"]) }
        }
    }

    public func completeStripe(sessionID: String, index: Int, bytes: Int64) async throws {
        try await self.writing { db in
            // Also keeps a striped upload whose main stream waits from expiring while its stripes arrive.
            try db.execute(cached: "UPDATE session SET updated_at = ? WHERE id = ?", arguments: [Date().timeIntervalSince1970, sessionID])
            guard db.changesCount > 0 else { throw CatalogError.unknownSession(sessionID) }
            try db.execute(
                cached: "INSERT OR IGNORE INTO session_stripe (session_id, stripe, bytes) VALUES (?, ?, ?)", arguments: [sessionID, index, bytes]
            )
        }
    }

    public func completeStripes(sessionID: String) async throws -> Set<Int> {
        try await self.reading { db in
            Set(
                try Row.fetchAll(cached: db, sql: "SELECT stripe FROM session_stripe WHERE session_id = ?", arguments: [sessionID]).map {
                    $0["stripe"] as Int
                })
        }
    }

    public func deleteSession(id: String) async throws {
        try await self.writing { db in
            try db.execute(cached: "DELETE FROM session WHERE id = ?", arguments: [id])
        }
    }

    public func sessions(updatedBefore date: Date) async throws -> [UploadSession] {
        try await self.reading { db in
            try Row.fetchAll(cached: db, sql: "SELECT * FROM session WHERE updated_at < ?", arguments: [date.timeIntervalSince1970])
                .map(Self.session)
        }
    }

    static func object(_ row: Row) -> StoredObject {
        var identity: ObjectIdentity? = nil
        if let device: Int64 = row["device"], let inode: Int64 = row["inode"], let modified: Int64 = row["modified"] {
            identity = ObjectIdentity(
                device: UInt64(bitPattern: device), inode: UInt64(bitPattern: inode), size: row["size"], modified: modified
            )
        }
        return StoredObject(
            account: row["account"], key: row["key"], size: row["size"], sha1: row["sha1"], identity: identity,
            committedAt: Date(timeIntervalSince1970: row["committed_at"]), probeSHA1: row["probe_sha1"]
        )
    }

    public func object(account: String, key: String) async throws -> StoredObject? {
        try await self.reading { db in
            try Row.fetchOne(cached: db, sql: "SELECT * FROM object WHERE account = ? AND key = ?", arguments: [account, key])
                .map(Self.object)
        }
    }

    public func object(account: String, size: Int64, sha1: String) async throws -> [StoredObject] {
        try await self.reading { db in
            try Row.fetchAll(
                cached: db, sql: "SELECT * FROM object WHERE account = ? AND size = ? AND sha1 = ? LIMIT 8",
                arguments: [account, size, sha1]
            ).map(Self.object)
        }
    }

    public func probeCandidates(account: String, size: Int64, probe: String) async throws -> [StoredObject] {
        try await self.reading { db in
            try Row.fetchAll(
                cached: db,
                sql: "SELECT * FROM object WHERE account = ? AND size = ? AND (probe_sha1 = ? OR probe_sha1 IS NULL) LIMIT 8",
                arguments: [account, size, probe]
            ).map(Self.object)
        }
    }

    public func objects() async throws -> [StoredObject] {
        try await self.reading { db in
            try Row.fetchAll(cached: db, sql: "SELECT * FROM object").map(Self.object)
        }
    }

    // SQLite compares text as bytes (BINARY): the UTF-8 order. `substr` and `length` count characters on both sides.
    public func objects(account: String, prefix: String, after: String?, limit: Int) async throws -> [StoredObject] {
        try await self.reading { db in
            try Row.fetchAll(
                cached: db, sql: "SELECT * FROM object WHERE \(Self.keyPage) ORDER BY key LIMIT ?",
                arguments: Self.keyPage(account, prefix, after, limit)
            )
            .map(Self.object)
        }
    }

    public func sessions(account: String, prefix: String, after: String?, limit: Int) async throws -> [UploadSession] {
        try await self.reading { db in
            try Row.fetchAll(
                cached: db, sql: "SELECT * FROM session WHERE \(Self.keyPage) ORDER BY key LIMIT ?",
                arguments: Self.keyPage(account, prefix, after, limit)
            )
            .map(Self.session)
        }
    }

    public func unfinishedUploads(account: String, limit: Int) async throws -> Int {
        try await self.reading { db in
            let count = try Int64.fetchOne(
                cached: db, sql: "SELECT COUNT(*) FROM (SELECT 1 FROM session WHERE account = ? LIMIT ?)",
                arguments: StatementArguments([account, Int64(limit)] as [any DatabaseValueConvertible])
            )
            return Int(count ?? 0)
        }
    }

    public func unfinishedTotals() async throws -> (uploads: Int, bytes: Int64) {
        try await self.reading { db in
            let row = try Row.fetchOne(cached: db, sql: "SELECT COUNT(*) AS uploads, COALESCE(SUM(durable_offset), 0) AS bytes FROM session")
            return (Int(row?["uploads"] as Int64? ?? 0), row?["bytes"] ?? 0)
        }
    }

    private static let keyPage = "account = ? AND key >= ? AND key > ? AND substr(key, 1, length(?)) = ?"

    private static func keyPage(_ account: String, _ prefix: String, _ after: String?, _ limit: Int) -> StatementArguments {
        [account, prefix, after ?? "", prefix, prefix, limit]
    }

}

/// SQLite's SQLITE_FULL: the disk under the catalog is full (retryable, said as the relay's storage being full).
extension DatabaseError: DiskFullReporting {
    public var isDiskFull: Bool { self.resultCode == .SQLITE_FULL }
}
