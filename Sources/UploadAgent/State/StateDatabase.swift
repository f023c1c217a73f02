import CUploadSQLite
import NIOConcurrencyHelpers

/// A value bound to a statement or read from a row.
enum SQLValue: Hashable, Sendable {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob([UInt8])
}

/// What a statement's `?` takes.
protocol SQLArgument {
    var sqlValue: SQLValue { get }
}

extension Int64: SQLArgument { var sqlValue: SQLValue { .integer(self) } }
extension Int: SQLArgument { var sqlValue: SQLValue { .integer(Int64(self)) } }
extension Bool: SQLArgument { var sqlValue: SQLValue { .integer(self ? 1 : 0) } }
extension Double: SQLArgument { var sqlValue: SQLValue { .real(self) } }
extension String: SQLArgument { var sqlValue: SQLValue { .text(self) } }
extension Array: SQLArgument where Element == UInt8 { var sqlValue: SQLValue { .blob(self) } }
extension Optional: SQLArgument where Wrapped: SQLArgument { var sqlValue: SQLValue { self?.sqlValue ?? .null } }

/// One row of a result, by column name.
struct SQLRow {
    var columns: [String: SQLValue]

    subscript(_ name: String) -> SQLValue { self.columns[name] ?? .null }

    func int64(_ name: String) -> Int64? {
        switch self[name] {
        case .integer(let value): return value
        case .real(let value): return Int64(exactly: value.rounded(.towardZero))
        case .text(let text): return Int64(text)
        default: return nil
        }
    }

    func double(_ name: String) -> Double? {
        switch self[name] {
        case .integer(let value): return Double(value)
        case .real(let value): return value
        case .text(let text): return Double(text)
        default: return nil
        }
    }

    func string(_ name: String) -> String? {
        switch self[name] {
        case .text(let text): return text
        case .integer(let value): return String(value)
        case .real(let value): return String(value)
        case .blob(let bytes): return String(decoding: bytes, as: UTF8.self)
        case .null: return nil
        }
    }

    func bytes(_ name: String) -> [UInt8]? {
        switch self[name] {
        case .blob(let bytes): return bytes
        case .text(let text): return Array(text.utf8)
        default: return nil
        }
    }

    func bool(_ name: String) -> Bool { (self.int64(name) ?? 0) != 0 }
}

/// What SQLite said when a call failed: its result code and message (`database or disk is full`, ...).
struct SQLiteError: Error, CustomStringConvertible {
    var code: Int32
    var message: String

    var description: String { self.message }
}

/// The agent's small state database on SQLite's C API, with no binding library: the agent links neither GRDB nor the
/// Foundation (and ICU data, 34 MB) it brings, too much for a device's flash. One connection, its calls serialized by a lock; prepared
/// statements cached by their text.
final class StateDatabase: @unchecked Sendable {
    private let lock = NIOLock()
    private let handle: OpaquePointer
    private var statements: [String: OpaquePointer] = [:]

    /// Opens (creating) the database at `path`; a busy database is waited for up to `busyTimeoutMillis`.
    init(path: String, busyTimeoutMillis: Int32) throws {
        var handle: OpaquePointer?
        let code = sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nil)
        guard code == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite3_close(handle)
            throw SQLiteError(code: code, message: message)
        }
        self.handle = handle
        sqlite3_busy_timeout(handle, busyTimeoutMillis)
    }

    deinit {
        for statement in self.statements.values { sqlite3_finalize(statement) }
        sqlite3_close_v2(self.handle)
    }

    /// Runs `body` alone on the connection (no transaction).
    func withConnection<T>(_ body: (Connection) throws -> T) throws -> T {
        try self.lock.withLock { try body(Connection(database: self)) }
    }

    /// Runs `body` in a write transaction (BEGIN IMMEDIATE: it waits for other processes' writers up front, never
    /// fails halfway on a read lock it cannot upgrade); rolled back when it throws.
    func inTransaction<T>(_ body: (Connection) throws -> T) throws -> T {
        try self.lock.withLock {
            let connection = Connection(database: self)
            try connection.script("BEGIN IMMEDIATE")
            do {
                let result = try body(connection)
                try connection.script("COMMIT")
                return result
            } catch {
                sqlite3_exec(self.handle, "ROLLBACK", nil, nil, nil)
                throw error
            }
        }
    }

    /// The connection, handed to a block that holds the lock.
    struct Connection {
        fileprivate let database: StateDatabase

        private var handle: OpaquePointer { self.database.handle }

        private func failure(_ code: Int32) -> SQLiteError {
            SQLiteError(code: code, message: String(cString: sqlite3_errmsg(self.handle)))
        }

        /// Statements separated by `;`, without arguments (schema, pragmas, transactions).
        func script(_ sql: String) throws {
            var message: UnsafeMutablePointer<CChar>?
            let code = sqlite3_exec(self.handle, sql, nil, nil, &message)
            guard code == SQLITE_OK else {
                let text = message.map { String(cString: $0) } ?? String(cString: sqlite3_errmsg(self.handle))
                sqlite3_free(message)
                throw SQLiteError(code: code, message: text)
            }
        }

        /// Runs one statement with `arguments`.
        func execute(_ sql: String, _ arguments: [any SQLArgument] = []) throws {
            _ = try self.run(sql, arguments, collecting: false)
        }

        /// The rows of one statement with `arguments`.
        func rows(_ sql: String, _ arguments: [any SQLArgument] = []) throws -> [SQLRow] {
            try self.run(sql, arguments, collecting: true)
        }

        func row(_ sql: String, _ arguments: [any SQLArgument] = []) throws -> SQLRow? {
            try self.rows(sql, arguments).first
        }

        /// Rows changed by the last INSERT, UPDATE or DELETE.
        var changes: Int { Int(sqlite3_changes(self.handle)) }

        var lastInsertedRowID: Int64 { sqlite3_last_insert_rowid(self.handle) }

        private func prepared(_ sql: String) throws -> OpaquePointer {
            if let statement = self.database.statements[sql] { return statement }
            var statement: OpaquePointer?
            let code = sqlite3_prepare_v3(self.handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
            guard code == SQLITE_OK, let statement else { throw self.failure(code) }
            self.database.statements[sql] = statement
            return statement
        }

        private func run(_ sql: String, _ arguments: [any SQLArgument], collecting: Bool) throws -> [SQLRow] {
            let statement = try self.prepared(sql)
            defer {
                sqlite3_reset(statement)
                sqlite3_clear_bindings(statement)
            }
            for (offset, argument) in arguments.enumerated() {
                let index = Int32(offset + 1)
                let code: Int32
                switch argument.sqlValue {
                case .null: code = sqlite3_bind_null(statement, index)
                case .integer(let value): code = sqlite3_bind_int64(statement, index, value)
                case .real(let value): code = sqlite3_bind_double(statement, index, value)
                case .text(let text): code = upload_sqlite_bind_text(statement, index, text, -1)
                case .blob(let bytes) where bytes.isEmpty:
                    // x'', never NULL.
                    code = sqlite3_bind_zeroblob(statement, index, 0)
                case .blob(let bytes):
                    code = bytes.withUnsafeBytes { upload_sqlite_bind_blob(statement, index, $0.baseAddress, Int32($0.count)) }
                }
                guard code == SQLITE_OK else { throw self.failure(code) }
            }
            var rows: [SQLRow] = []
            while true {
                let code = sqlite3_step(statement)
                if code == SQLITE_DONE { return rows }
                guard code == SQLITE_ROW else { throw self.failure(code) }
                guard collecting else { continue }
                var columns: [String: SQLValue] = [:]
                for column in 0..<sqlite3_column_count(statement) {
                    let name = String(cString: sqlite3_column_name(statement, column))
                    switch sqlite3_column_type(statement, column) {
                    case SQLITE_INTEGER: columns[name] = .integer(sqlite3_column_int64(statement, column))
                    case SQLITE_FLOAT: columns[name] = .real(sqlite3_column_double(statement, column))
                    case SQLITE_TEXT: columns[name] = .text(String(cString: sqlite3_column_text(statement, column)))
                    case SQLITE_BLOB:
                        let count = Int(sqlite3_column_bytes(statement, column))
                        let base = sqlite3_column_blob(statement, column)
                        columns[name] = .blob(base.map { [UInt8](UnsafeRawBufferPointer(start: $0, count: count)) } ?? [])
                    default: columns[name] = .null
                    }
                }
                rows.append(SQLRow(columns: columns))
            }
        }
    }

    /// Applies the migrations not applied yet, in order, each in its transaction. Applied ones are recorded by name in
    /// `grdb_migrations`, the table GRDB's migrator kept when the agent used GRDB: databases it made go on as they are.
    func migrate(_ migrations: [(name: String, sql: String)]) throws {
        try self.withConnection { db in
            try db.script("CREATE TABLE IF NOT EXISTS grdb_migrations (identifier TEXT NOT NULL PRIMARY KEY)")
        }
        let applied = Set(
            try self.withConnection { db in try db.rows("SELECT identifier FROM grdb_migrations").compactMap { $0.string("identifier") } })
        for migration in migrations where !applied.contains(migration.name) {
            try self.inTransaction { db in
                try db.script(migration.sql)
                try db.execute("INSERT INTO grdb_migrations (identifier) VALUES (?)", [migration.name])
            }
        }
    }
}
