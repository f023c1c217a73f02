#if canImport(Glibc)
import Glibc
#endif
import FoundationEssentials
import UploadChecksums
import UploadProtocol

/// The agent's state database, `state.sqlite` under `--state DIR`: the persistent queue, the hash cache and the pause
/// flag. `send`, `watch`, `status`, `pause`, `resume` and `retry` all open it, from separate processes at once (WAL
/// journal, busy timeout); one process at a time uploads each target's items (``RunnerLock``).
public final class AgentStateStore: Sendable {
    /// The directory that holds the database and the runners' locks.
    public let directory: String
    let database: StateDatabase

    /// `$XDG_STATE_HOME/upload-agent`, else `~/.local/state/upload-agent`.
    public static func defaultDirectory(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let state = environment["XDG_STATE_HOME"], state.hasPrefix("/") {
            return state + "/upload-agent"
        }
        let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? getpwuid(getuid()).map { String(cString: $0.pointee.pw_dir) } ?? "/"
        return home + "/.local/state/upload-agent"
    }

    /// Opens (creating and migrating) the database in `directory`, which is created with mode 0700 when missing.
    public init(directory: String) throws {
        self.directory = directory
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw SourceError("cannot create the state directory \(directory): \(error) (choose another with --state DIR)")
        }
        // Processes that open a new database at once (two agents started together) create its tables one at a time:
        // a migrator's check and its work are not atomic across processes.
        let lock = Glibc.open(directory + "/state.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard lock >= 0 else {
            throw SourceError("cannot open \(directory)/state.lock: \(String(cString: strerror(errno))) (choose another directory with --state DIR)")
        }
        defer { Glibc.close(lock) }
        while flock(lock, LOCK_EX) != 0 && errno == EINTR {}
        do {
            self.database = try StateDatabase(path: directory + "/state.sqlite", busyTimeoutMillis: 10_000)
            try self.database.withConnection { db in
                // A small page cache (512 KiB, not SQLite's 2 MiB): the queue is read in windows and written in slices.
                // A lost last write costs a re-check with the relay, never a byte: the relay's durable offset decides.
                try db.script("PRAGMA cache_size = -512; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL")
            }
            try self.database.migrate(Self.migrations)
        } catch let error as SQLiteError {
            throw SourceError("cannot open the agent's state database \(directory)/state.sqlite: \(error.message)")
        }
    }

    /// The schema's versions, applied in order (names as GRDB's migrator recorded them).
    static let migrations: [(name: String, sql: String)] = [
        (
            "v1",
            """
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
        ),
        (
            // Paths were recorded as given, relative to the directory of the process that queued them: another process
            // (a running watch taking a send's files) read them against its own. Those rows cannot be trusted.
            "v2: absolute paths, symbolic links",
            """
            ALTER TABLE item ADD COLUMN follow_symlinks INTEGER NOT NULL DEFAULT 0;
            UPDATE item SET status = 'failed', error = 'queued with a relative path by an older agent: send it again'
            WHERE path NOT LIKE '/%' AND status IN ('queued', 'uploading');
            """
        ),
    ]

    /// What identifies one relay account in the queue: the relay's address and a digest of the token (never the
    /// token itself).
    public static func target(of configuration: AgentConfiguration) -> String {
        let digest = Array(SHA1.hash(Array(configuration.token.utf8)).prefix(8)).hexString
        return "\(configuration.relayHost):\(configuration.relayPort)#\(digest)"
    }

    static func now() -> Double { Date().timeIntervalSince1970 }

    func write<T>(_ body: (StateDatabase.Connection) throws -> T) throws -> T {
        do {
            return try self.database.inTransaction(body)
        } catch let error as SQLiteError {
            throw SourceError("the agent's state database \(self.directory)/state.sqlite: \(error.message)")
        }
    }

    /// One block at a time on the one connection, outside a transaction.
    func read<T>(_ body: (StateDatabase.Connection) throws -> T) throws -> T {
        do {
            return try self.database.withConnection(body)
        } catch let error as SQLiteError {
            throw SourceError("the agent's state database \(self.directory)/state.sqlite: \(error.message)")
        }
    }

    // MARK: Settings

    /// Whether uploads are paused (`upload-agent pause`); survives restarts until `resume`.
    public func isPaused() throws -> Bool {
        try self.read { db in try db.row("SELECT value FROM setting WHERE name = 'paused'")?.string("value") == "1" }
    }

    public func setPaused(_ paused: Bool) throws {
        try self.write { db in
            try db.execute("INSERT OR REPLACE INTO setting (name, value) VALUES ('paused', ?)", [paused ? "1" : "0"])
            try Self.bump(db)
        }
    }

    /// Why the running agent holds uploads now (a pause, a condition), or nil.
    public func holdReason() throws -> String? {
        try self.read { db in try db.row("SELECT value FROM setting WHERE name = 'hold'")?.string("value") }.flatMap { $0.isEmpty ? nil : $0 }
    }

    func setHoldReason(_ reason: String?) throws {
        try self.write { db in
            try db.execute("INSERT OR REPLACE INTO setting (name, value) VALUES ('hold', ?)", [reason ?? ""])
        }
    }

    /// A counter every change made from outside a runner increases: a running agent polls it to see new items,
    /// pause, resume and retry without reading the whole queue.
    public func generation() throws -> Int {
        try self.read { db in
            try db.row("SELECT CAST(value AS INTEGER) AS generation FROM setting WHERE name = 'generation'")?.int64("generation").map(Int.init) ?? 0
        }
    }

    static func bump(_ db: StateDatabase.Connection) throws {
        try db.execute(
            """
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
            try db.row("SELECT sha1 FROM hash_cache WHERE fingerprint = ?", [fingerprint])?.string("sha1")
        }
    }

    public func cacheSHA1(fingerprint: [UInt8], sha1: String) throws {
        guard !fingerprint.isEmpty else { return }
        try self.write { db in
            try db.execute("INSERT OR REPLACE INTO hash_cache (fingerprint, sha1, used_at) VALUES (?, ?, ?)", [fingerprint, sha1, Self.now()])
        }
    }
}
