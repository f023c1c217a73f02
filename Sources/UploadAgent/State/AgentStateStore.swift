#if canImport(Glibc)
import Glibc
#endif
import Foundation
import GRDB
import UploadChecksums
import UploadProtocol

/// The agent's state database, `state.sqlite` under `--state DIR`: the persistent queue, the hash cache and the pause
/// flag. `send`, `watch`, `status`, `pause`, `resume` and `retry` all open it, from separate processes at once (WAL
/// journal, busy timeout); one process at a time uploads each target's items (``RunnerLock``).
public final class AgentStateStore: Sendable {
    /// The directory that holds the database and the runners' locks.
    public let directory: String
    let database: DatabaseQueue

    /// `$XDG_STATE_HOME/upload-agent`, else `~/.local/state/upload-agent`.
    public static func defaultDirectory(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let state = environment["XDG_STATE_HOME"], state.hasPrefix("/") {
            return state + "/upload-agent"
        }
        let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()
        return home + "/.local/state/upload-agent"
    }

    /// Opens (creating and migrating) the database in `directory`, which is created with mode 0700 when missing.
    public init(directory: String) throws {
        self.directory = directory
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw SourceError("cannot create the state directory \(directory): \(error.localizedDescription) (choose another with --state DIR)")
        }
        var configuration = Configuration()
        configuration.busyMode = .timeout(10)
        // A small page cache (512 KiB, not SQLite's 2 MiB): the queue is read in windows and written in slices.
        configuration.prepareDatabase { db in try db.execute(sql: "PRAGMA cache_size = -512") }
        // Processes that open a new database at once (two agents started together) create its tables one at a time:
        // a migrator's check and its work are not atomic across processes.
        let lock = Glibc.open(directory + "/state.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard lock >= 0 else {
            throw SourceError("cannot open \(directory)/state.lock: \(String(cString: strerror(errno))) (choose another directory with --state DIR)")
        }
        defer { Glibc.close(lock) }
        while flock(lock, LOCK_EX) != 0 && errno == EINTR {}
        do {
            self.database = try DatabaseQueue(path: directory + "/state.sqlite", configuration: configuration)
            try self.database.writeWithoutTransaction { db in
                try db.execute(sql: "PRAGMA journal_mode = WAL")
                // A lost last write costs a re-check with the relay, never a byte: the relay's durable offset decides.
                try db.execute(sql: "PRAGMA synchronous = NORMAL")
            }
            try Self.migrator.migrate(self.database)
        } catch let error as DatabaseError {
            throw SourceError("cannot open the agent's state database \(directory)/state.sqlite: \(error.message ?? "\(error)")")
        }
    }

    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(
                sql: """
                    CREATE TABLE item (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        target TEXT NOT NULL,
                        key TEXT NOT NULL,
                        path TEXT NOT NULL,
                        status TEXT NOT NULL,
                        size INTEGER,
                        fingerprint BLOB NOT NULL DEFAULT x'',
                        sha1 TEXT,
                        acked INTEGER NOT NULL DEFAULT 0,
                        sha1_state BLOB,
                        sent_bytes INTEGER NOT NULL DEFAULT 0,
                        hashed_bytes INTEGER NOT NULL DEFAULT 0,
                        outcome TEXT,
                        error TEXT,
                        overwrite INTEGER NOT NULL DEFAULT 0,
                        dedup INTEGER NOT NULL DEFAULT 1,
                        rate DOUBLE NOT NULL DEFAULT 0,
                        added_at DOUBLE NOT NULL,
                        updated_at DOUBLE NOT NULL,
                        UNIQUE (target, key)
                    );
                    CREATE INDEX item_by_status ON item (target, status, id);
                    CREATE TABLE hash_cache (
                        fingerprint BLOB PRIMARY KEY NOT NULL,
                        sha1 TEXT NOT NULL,
                        used_at DOUBLE NOT NULL
                    );
                    CREATE TABLE setting (
                        name TEXT PRIMARY KEY NOT NULL,
                        value TEXT NOT NULL
                    );
                    """
            )
        }
        migrator.registerMigration("v2: absolute paths, symbolic links") { db in
            // Paths were recorded as given, relative to the directory of the process that queued them: another process
            // (a running watch taking a send's files) read them against its own. Those rows cannot be trusted.
            try db.execute(
                sql: """
                    ALTER TABLE item ADD COLUMN follow_symlinks INTEGER NOT NULL DEFAULT 0;
                    UPDATE item SET status = 'failed', error = 'queued with a relative path by an older agent: send it again'
                    WHERE path NOT LIKE '/%' AND status IN ('queued', 'uploading');
                    """
            )
        }
        return migrator
    }

    /// What identifies one relay account in the queue: the relay's address and a digest of the token (never the
    /// token itself).
    public static func target(of configuration: AgentConfiguration) -> String {
        let digest = Array(SHA1.hash(Array(configuration.token.utf8)).prefix(8)).hexString
        return "\(configuration.relayHost):\(configuration.relayPort)#\(digest)"
    }

    static func now() -> Double { Date().timeIntervalSince1970 }

    func write<T>(_ body: (Database) throws -> T) throws -> T {
        do {
            return try self.database.write(body)
        } catch let error as DatabaseError {
            throw SourceError("the agent's state database \(self.directory)/state.sqlite: \(error.message ?? "\(error)")")
        }
    }

    /// Not `DatabaseQueue.read`: its `PRAGMA query_only` toggle expires every prepared statement (see the relay's
    /// `SQLiteCatalog.reading`). The queue runs one block at a time on the one connection.
    func read<T>(_ body: (Database) throws -> T) throws -> T {
        do {
            return try self.database.inDatabase(body)
        } catch let error as DatabaseError {
            throw SourceError("the agent's state database \(self.directory)/state.sqlite: \(error.message ?? "\(error)")")
        }
    }

    // MARK: Settings

    /// Whether uploads are paused (`upload-agent pause`); survives restarts until `resume`.
    public func isPaused() throws -> Bool {
        try self.read { db in try String.fetchOne(db, sql: "SELECT value FROM setting WHERE name = 'paused'") == "1" }
    }

    public func setPaused(_ paused: Bool) throws {
        try self.write { db in
            try db.execute(sql: "INSERT OR REPLACE INTO setting (name, value) VALUES ('paused', ?)", arguments: [paused ? "1" : "0"])
            try Self.bump(db)
        }
    }

    /// Why the running agent holds uploads now (a pause, a condition), or nil.
    public func holdReason() throws -> String? {
        try self.read { db in try String.fetchOne(db, sql: "SELECT value FROM setting WHERE name = 'hold'") }.flatMap { $0.isEmpty ? nil : $0 }
    }

    func setHoldReason(_ reason: String?) throws {
        try self.write { db in
            try db.execute(sql: "INSERT OR REPLACE INTO setting (name, value) VALUES ('hold', ?)", arguments: [reason ?? ""])
        }
    }

    /// A counter every change made from outside a runner increases: a running agent polls it to see new items,
    /// pause, resume and retry without reading the whole queue.
    public func generation() throws -> Int {
        try self.read { db in try Int.fetchOne(db, sql: "SELECT CAST(value AS INTEGER) FROM setting WHERE name = 'generation'") ?? 0 }
    }

    static func bump(_ db: Database) throws {
        try db.execute(
            sql: """
                INSERT INTO setting (name, value) VALUES ('generation', '1')
                ON CONFLICT (name) DO UPDATE SET value = CAST(CAST(value AS INTEGER) + 1 AS TEXT)
                """
        )
    }

    // MARK: Hash cache

    /// The SHA-1 of a source whose fingerprint (device, inode, size, modification time for a file) was hashed before.
    public func cachedSHA1(fingerprint: [UInt8]) throws -> String? {
        guard !fingerprint.isEmpty else { return nil }
        return try self.read { db in
            // Cached: asked once per file before OPEN.
            try String.fetchOne(db.cachedStatement(sql: "SELECT sha1 FROM hash_cache WHERE fingerprint = ?"), arguments: [Data(fingerprint)])
        }
    }

    public func cacheSHA1(fingerprint: [UInt8], sha1: String) throws {
        guard !fingerprint.isEmpty else { return }
        try self.write { db in
            try db.execute(
                sql: "INSERT OR REPLACE INTO hash_cache (fingerprint, sha1, used_at) VALUES (?, ?, ?)",
                arguments: [Data(fingerprint), sha1, Self.now()]
            )
        }
    }
}
