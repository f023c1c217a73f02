import Foundation
import GRDB

/// The embedded catalog: one SQLite file, WAL journal, `synchronous=FULL` so that a recorded
/// durable offset survives a crash of the relay or the machine (SPEC §6.1).
public final class SQLiteCatalog: Catalog {
    private let database: DatabaseQueue

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

    private static var migrator: DatabaseMigrator {
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
        return migrator
    }

    public func addAccount(name: String, tokenHash: [UInt8], quota: Int64?) throws {
        try self.database.write { db in
            if try Row.fetchOne(db, sql: "SELECT 1 FROM account WHERE name = ?", arguments: [name]) != nil {
                throw CatalogError.accountExists(name)
            }
            try db.execute(
                sql: "INSERT INTO account (name, token_hash, quota, created_at) VALUES (?, ?, ?, ?)",
                arguments: [name, Data(tokenHash), quota, Date().timeIntervalSince1970]
            )
        }
    }

    private static func account(_ row: Row) -> Account {
        Account(
            name: row["name"], quota: row["quota"], usedBytes: row["used_bytes"], revoked: row["revoked"],
            createdAt: Date(timeIntervalSince1970: row["created_at"])
        )
    }

    public func account(tokenHash: [UInt8]) throws -> Account? {
        try self.database.read { db in
            try Row.fetchOne(db, sql: "SELECT * FROM account WHERE token_hash = ?", arguments: [Data(tokenHash)])
                .map(Self.account)
        }
    }

    public func account(named name: String) throws -> Account? {
        try self.database.read { db in
            try Row.fetchOne(db, sql: "SELECT * FROM account WHERE name = ?", arguments: [name]).map(Self.account)
        }
    }

    public func accounts() throws -> [Account] {
        try self.database.read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM account ORDER BY name").map(Self.account)
        }
    }

    public func revokeAccount(named name: String) throws -> Bool {
        try self.database.write { db in
            try db.execute(sql: "UPDATE account SET revoked = 1 WHERE name = ?", arguments: [name])
            return db.changesCount > 0
        }
    }

    private static func session(_ row: Row) -> UploadSession {
        UploadSession(
            id: row["id"], account: row["account"], key: row["key"],
            resumeToken: [UInt8]((row["resume_token"] as Data?) ?? Data()),
            fingerprint: [UInt8]((row["fingerprint"] as Data?) ?? Data()), declaredSize: row["declared_size"],
            durableOffset: row["durable_offset"], sha1State: [UInt8]((row["sha1_state"] as Data?) ?? Data()),
            stagingName: row["staging_name"], updatedAt: Date(timeIntervalSince1970: row["updated_at"])
        )
    }

    public func session(account: String, key: String) throws -> UploadSession? {
        try self.database.read { db in
            try Row.fetchOne(db, sql: "SELECT * FROM session WHERE account = ? AND key = ?", arguments: [account, key])
                .map(Self.session)
        }
    }

    public func putSession(_ s: UploadSession) throws {
        try self.database.write { db in
            try db.execute(sql: "DELETE FROM session WHERE account = ? AND key = ?", arguments: [s.account, s.key])
            try db.execute(
                sql: """
                    INSERT INTO session (id, account, key, resume_token, fingerprint, declared_size, durable_offset,
                        sha1_state, staging_name, updated_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """,
                arguments: [
                    s.id, s.account, s.key, Data(s.resumeToken), Data(s.fingerprint), s.declaredSize, s.durableOffset,
                    Data(s.sha1State), s.stagingName, s.updatedAt.timeIntervalSince1970,
                ]
            )
        }
    }

    public func updateDurable(sessionID: String, offset: Int64, sha1State: [UInt8]) throws {
        try self.database.write { db in
            try db.execute(
                sql: "UPDATE session SET durable_offset = ?, sha1_state = ?, updated_at = ? WHERE id = ?",
                arguments: [offset, Data(sha1State), Date().timeIntervalSince1970, sessionID]
            )
        }
    }

    public func deleteSession(id: String) throws {
        try self.database.write { db in
            try db.execute(sql: "DELETE FROM session WHERE id = ?", arguments: [id])
        }
    }

    public func sessions(updatedBefore date: Date) throws -> [UploadSession] {
        try self.database.read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM session WHERE updated_at < ?", arguments: [date.timeIntervalSince1970])
                .map(Self.session)
        }
    }

    private static func object(_ row: Row) -> StoredObject {
        StoredObject(
            account: row["account"], key: row["key"], size: row["size"], sha1: row["sha1"],
            committedAt: Date(timeIntervalSince1970: row["committed_at"])
        )
    }

    public func object(account: String, key: String) throws -> StoredObject? {
        try self.database.read { db in
            try Row.fetchOne(db, sql: "SELECT * FROM object WHERE account = ? AND key = ?", arguments: [account, key])
                .map(Self.object)
        }
    }

    public func object(account: String, size: Int64, sha1: String) throws -> StoredObject? {
        try self.database.read { db in
            try Row.fetchOne(
                db, sql: "SELECT * FROM object WHERE account = ? AND size = ? AND sha1 = ? LIMIT 1",
                arguments: [account, size, sha1]
            ).map(Self.object)
        }
    }

    public func commitObject(_ object: StoredObject, sessionID: String?) throws {
        try self.database.write { db in
            guard let row = try Row.fetchOne(db, sql: "SELECT * FROM account WHERE name = ?", arguments: [object.account]) else {
                throw CatalogError.unknownAccount(object.account)
            }
            let account = Self.account(row)
            let previous: Int64 =
                try Int64.fetchOne(
                    db, sql: "SELECT size FROM object WHERE account = ? AND key = ?", arguments: [object.account, object.key]
                ) ?? 0
            let delta = object.size - previous
            if let quota = account.quota, delta > 0, account.usedBytes + delta > quota {
                throw CatalogError.quotaExceeded(account: account.name, needed: delta, quota: quota, used: account.usedBytes)
            }
            try db.execute(
                sql: """
                    INSERT OR REPLACE INTO object (account, key, size, sha1, committed_at) VALUES (?, ?, ?, ?, ?)
                    """,
                arguments: [object.account, object.key, object.size, object.sha1, object.committedAt.timeIntervalSince1970]
            )
            try db.execute(
                sql: "UPDATE account SET used_bytes = used_bytes + ? WHERE name = ?", arguments: [delta, object.account]
            )
            if let sessionID {
                try db.execute(sql: "DELETE FROM session WHERE id = ?", arguments: [sessionID])
            }
        }
    }
}
