import UploadRelay
import GRDB

// The catalog's queries run for every upload, and compiling one (SQLite's parser and GRDB's authorizer) cost more than
// running it: on 10,000 small uploads a third of the relay's catalog time went to compiling the same dozen statements.
// These run each through the connection's statement cache, compiled once. Same call shape as GRDB's `sql:` methods.

extension SQLiteCatalog {
    /// Runs queries that only read. Not `DatabaseQueue.read`: that turns `PRAGMA query_only` on and off around each
    /// call, and changing a flag pragma expires every prepared statement (SQLite's `OP_Expire`), so the statement
    /// cache never held (perf: `sqlite3Reprepare` under every cached query). The queue runs one block at a time on the
    /// one connection, so a block sees no write of this process between its queries. Awaited: the caller's thread is
    /// not held while a write (its fsync) has the connection.
    func reading<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await self.database.writeWithoutTransaction(body)
    }
}

extension Database {
    /// Runs one cached statement.
    func execute(cached sql: String, arguments: StatementArguments = []) throws {
        try self.cachedStatement(sql: sql).execute(arguments: arguments)
    }
}

extension Row {
    static func fetchOne(cached db: Database, sql: String, arguments: StatementArguments = []) throws -> Row? {
        try Row.fetchOne(db.cachedStatement(sql: sql), arguments: arguments)
    }

    static func fetchAll(cached db: Database, sql: String, arguments: StatementArguments = []) throws -> [Row] {
        try Row.fetchAll(db.cachedStatement(sql: sql), arguments: arguments)
    }
}

extension Int64 {
    static func fetchOne(cached db: Database, sql: String, arguments: StatementArguments = []) throws -> Int64? {
        try Int64.fetchOne(db.cachedStatement(sql: sql), arguments: arguments)
    }
}
