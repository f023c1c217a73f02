import UploadRelay
import GRDB

// The catalog's queries run for every upload, and compiling one (SQLite's parser and GRDB's authorizer) cost more than
// running it: on 10,000 small uploads a third of the relay's catalog time went to compiling the same dozen statements.
// These run each through the connection's statement cache, compiled once. Same call shape as GRDB's `sql:` methods.

extension SQLiteCatalog {
    /// Runs queries that only read. Not `DatabaseQueue.read`: that turns `PRAGMA query_only` on and off around each
    /// call, and changing a flag pragma expires every prepared statement (SQLite's `OP_Expire`), so the statement
    /// cache never held (perf: `sqlite3Reprepare` under every cached query). The queue runs one block at a time on the
    /// one connection, so a block sees no write of this process between its queries.
    ///
    /// On a thread of the relay's pool (``PoolThread/mayBlock``) the block runs right there, waiting for the connection
    /// if a write has it, as the local store's system calls run there: awaited, each query cost two thread switches
    /// (to GRDB's queue and back), and an OPEN and a commit of a small file make about eight (perf: two thirds of the
    /// relay's switches on 10,000 small uploads). Elsewhere it is awaited: the caller's thread is not held.
    func reading<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        if PoolThread.mayBlock { return try Self.here(self.database, inTransaction: false, body) }
        return try await self.database.writeWithoutTransaction(body)
    }

    /// Runs `body` in one transaction, where ``reading(_:)`` runs its block.
    func writing<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        if PoolThread.mayBlock { return try Self.here(self.database, inTransaction: true, body) }
        return try await self.database.write(body)
    }

    /// GRDB's blocking calls (an async caller would get the awaited ones).
    private static func here<T>(_ database: DatabaseQueue, inTransaction: Bool, _ body: (Database) throws -> T) throws -> T {
        inTransaction ? try database.write(body) : try database.writeWithoutTransaction(body)
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
