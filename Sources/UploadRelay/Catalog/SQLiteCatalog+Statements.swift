import GRDB

// The catalog's queries run for every upload, and compiling one (SQLite's parser and GRDB's authorizer) cost more than
// running it: on 10,000 small uploads a third of the relay's catalog time went to compiling the same dozen statements.
// These run each through the connection's statement cache, compiled once. Same call shape as GRDB's `sql:` methods.

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
