import UploadRelay
import Foundation
import Logging
import PostgresNIO

/// Accounts, sessions and objects: reads and plain writes, as ``SQLiteCatalog`` answers them.
extension PostgresCatalog {
    // MARK: Accounts

    public func addAccount(name: String, tokenHash: [UInt8], quota: Int64?) async throws {
        guard Account.isValidName(name) else { throw CatalogError.invalidAccountName(name) }
        let logger = self.logger
        try await self.transaction { connection in
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
            createdAt: Date(timeIntervalSince1970: try row["created_at"].decode(Double.self)),
            tokenHash: [UInt8](try row["token_hash"].decode(Data.self))
        )
    }

    public func account(tokenHash: [UInt8]) async throws -> Account? {
        let logger = self.logger
        return try await self.run {
            try await Self.rows("SELECT * FROM account WHERE token_hash = \(Data(tokenHash))", on: $0, logger).first.map(Self.account)
        }
    }

    public func account(named name: String) async throws -> Account? {
        let logger = self.logger
        return try await self.run { try await Self.rows("SELECT * FROM account WHERE name = \(name)", on: $0, logger).first.map(Self.account) }
    }

    public func accounts() async throws -> [Account] {
        let logger = self.logger
        // Byte order, as SQLite sorts: not the database's collation.
        return try await self.run { try await Self.rows("SELECT * FROM account ORDER BY name COLLATE \"C\"", on: $0, logger).map(Self.account) }
    }

    public func clock() async throws -> Date {
        let logger = self.logger
        return try await self.run { connection in
            let row = try await Self.rows("SELECT extract(epoch FROM clock_timestamp())::DOUBLE PRECISION AS now", on: connection, logger).first
            return Date(timeIntervalSince1970: try row?["now"].decode(Double.self) ?? Date().timeIntervalSince1970)
        }
    }

    public func recordLook(relay: String, readAt: Date) async throws {
        let (logger, at) = (self.logger, readAt.timeIntervalSince1970)
        _ = try await self.run { connection in
            try await connection.query(
                """
                INSERT INTO relay_look (relay, read_at) VALUES (\(relay), \(at))
                ON CONFLICT (relay) DO UPDATE SET read_at = GREATEST(relay_look.read_at, excluded.read_at)
                """, logger: logger)
            try await connection.query("DELETE FROM relay_look WHERE read_at < \(at - 86_400)", logger: logger)
            return true
        }
    }

    public func relayLooks() async throws -> [String: Date] {
        let logger = self.logger
        return try await self.run { connection in
            var looks: [String: Date] = [:]
            for row in try await Self.rows("SELECT relay, read_at FROM relay_look", on: connection, logger) {
                looks[try row["relay"].decode(String.self)] = Date(timeIntervalSince1970: try row["read_at"].decode(Double.self))
            }
            return looks
        }
    }

    public func forgetLook(relay: String) async throws {
        let logger = self.logger
        _ = try await self.run { connection in
            try await connection.query("DELETE FROM relay_look WHERE relay = \(relay)", logger: logger)
            return true
        }
    }

    public func revokeAccount(named name: String) async throws -> Bool {
        let logger = self.logger
        return try await self.run {
            try await !Self.rows("UPDATE account SET revoked = TRUE WHERE name = \(name) RETURNING name", on: $0, logger).isEmpty
        }
    }

    public func removeObject(
        account: String, key: String, removingFile: @escaping @Sendable (StoredObject) async throws -> Void
    ) async throws -> ObjectRemoval {
        let logger = self.logger
        return try await self.transaction { connection in
            // The account's row, as commits take it: no commit of the account lands until this ends.
            do {
                try await Self.lockAccount(account, on: connection, logger)
            } catch CatalogError.unknownAccount {
                return .notStored
            }
            guard
                let object = try await Self.rows(
                    "SELECT * FROM object WHERE account = \(account) AND key = \(key) FOR UPDATE", on: connection, logger
                ).first.map(Self.object)
            else { return .notStored }
            if try await !Self.rows("SELECT 1 AS one FROM session WHERE account = \(account) AND key = \(key)", on: connection, logger).isEmpty {
                return .uploading
            }
            if try await !Self.rows("SELECT 1 AS one FROM pending_commit WHERE account = \(account) AND key = \(key)", on: connection, logger).isEmpty
            {
                return .committing
            }
            try await removingFile(object)
            try await connection.query("DELETE FROM object WHERE account = \(account) AND key = \(key)", logger: logger)
            try await connection.query("UPDATE account SET used_bytes = used_bytes - \(object.size) WHERE name = \(account)", logger: logger)
            return .removed(object)
        }
    }

    public func deleteAccount(named name: String) async throws -> Bool {
        let logger = self.logger
        return try await self.transaction { connection in
            // The account's row held: no commit or admission of it runs meanwhile.
            guard try await !Self.rows("SELECT name FROM account WHERE name = \(name) FOR UPDATE", on: connection, logger).isEmpty else {
                return false
            }
            // Reservations whose holder let go of the key, or died, hold nothing (an upload admitted, then dropped).
            try await connection.query(
                "DELETE FROM open_reservation r WHERE r.account = \(name) AND NOT \(unescaped: Self.reservationHeld)", logger: logger
            )
            let counts = try await Self.rows(
                """
                SELECT (SELECT COUNT(*) FROM object WHERE account = \(name))::BIGINT AS objects,
                    (SELECT COUNT(*) FROM session WHERE account = \(name))::BIGINT AS sessions,
                    (SELECT COUNT(*) FROM pending_commit WHERE account = \(name))::BIGINT AS commits,
                    (SELECT COUNT(*) FROM open_reservation WHERE account = \(name))::BIGINT AS opening
                """, on: connection, logger
            ).first
            for (column, what) in [
                ("objects", "objects"), ("sessions", "uploads under way"), ("commits", "commits being settled"), ("opening", "uploads opening"),
            ] {
                if try counts?[column].decode(Int64.self) ?? 0 > 0 { throw CatalogError.accountInUse(name, holds: what) }
            }
            _ = try await Self.rows("DELETE FROM account WHERE name = \(name) RETURNING name", on: connection, logger)
            return true
        }
    }

    public func updateAccount(named name: String, quota: Int64??, tokenHash: [UInt8]?, revoked: Bool?) async throws -> Bool {
        let logger = self.logger
        return try await self.run { connection in
            guard try await !Self.rows("SELECT name FROM account WHERE name = \(name)", on: connection, logger).isEmpty else { return false }
            if let quota {
                _ = try await Self.rows("UPDATE account SET quota = \(quota) WHERE name = \(name) RETURNING name", on: connection, logger)
            }
            if let tokenHash {
                _ = try await Self.rows(
                    "UPDATE account SET token_hash = \(Data(tokenHash)) WHERE name = \(name) RETURNING name", on: connection, logger)
            }
            if let revoked {
                _ = try await Self.rows("UPDATE account SET revoked = \(revoked) WHERE name = \(name) RETURNING name", on: connection, logger)
            }
            return true
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

    public func session(account: String, key: String) async throws -> UploadSession? {
        let logger = self.logger
        return try await self.run {
            try await Self.rows("SELECT * FROM session WHERE account = \(account) AND key = \(key)", on: $0, logger).first.map(Self.session)
        }
    }

    public func sessions(account: String, keys: [String]) async throws -> [String: UploadSession] {
        guard !keys.isEmpty else { return [:] }
        let logger = self.logger
        return try await self.run {
            let rows = try await Self.rows("SELECT * FROM session WHERE account = \(account) AND key = ANY(\(keys))", on: $0, logger)
            return Dictionary(
                try rows.map { row in
                    let session = try Self.session(row); return (session.key, session)
                }, uniquingKeysWith: { first, _ in first })
        }
    }

    public func putSession(_ session: UploadSession) async throws {
        try await self.putSession(session, parts: [])
    }

    public func putSession(_ s: UploadSession, parts: [StagedPart]) async throws {
        let logger = self.logger
        try await self.transaction { connection in
            // One recorder of a key at a time (on any relay): under READ COMMITTED, a DELETE does not see a row another
            // transaction inserts meanwhile, and the INSERT would then break UNIQUE (account, key).
            _ = try await connection.query(
                "SELECT pg_advisory_xact_lock(hashtextextended(\(s.account) || '/' || \(s.key), 0))", logger: logger
            ).collect()
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

    public func updateDurable(sessionID: String, offset: Int64, sha1State: [UInt8]) async throws {
        try await self.updateDurable(sessionID: sessionID, offset: offset, sha1State: sha1State, parts: [])
    }

    public func updateDurable(sessionID: String, offset: Int64, sha1State: [UInt8], parts: [StagedPart]) async throws {
        let logger = self.logger
        try await self.transaction { connection in
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

    public func stagedParts(sessionID: String) async throws -> [StagedPart] {
        let logger = self.logger
        return try await self.run {
            try await Self.rows("SELECT * FROM session_part WHERE session_id = \(sessionID) ORDER BY number", on: $0, logger).map {
                StagedPart(
                    number: try $0["number"].decode(Int.self), end: try $0["end_offset"].decode(Int64.self), etag: try $0["etag"].decode(String.self),
                    sha1: try $0["sha1"].decode(String.self)
                )
            }
        }
    }

    public func completeStripe(sessionID: String, index: Int, bytes: Int64) async throws {
        let logger = self.logger
        try await self.transaction { connection in
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

    public func completeStripes(sessionID: String) async throws -> Set<Int> {
        let logger = self.logger
        return try await self.run {
            Set(
                try await Self.rows("SELECT stripe FROM session_stripe WHERE session_id = \(sessionID)", on: $0, logger).map {
                    try $0["stripe"].decode(Int.self)
                })
        }
    }

    public func deleteSession(id: String) async throws {
        let logger = self.logger
        try await self.run { _ = try await $0.query("DELETE FROM session WHERE id = \(id)", logger: logger).collect() }
    }

    public func sessions(updatedBefore date: Date) async throws -> [UploadSession] {
        let logger = self.logger
        // distantFuture's seconds are beyond a double's exact integers but not its range: fine for a comparison.
        return try await self.run {
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
            committedAt: Date(timeIntervalSince1970: try row["committed_at"].decode(Double.self)),
            probeSHA1: try row["probe_sha1"].decode(String?.self)
        )
    }

    public func object(account: String, key: String) async throws -> StoredObject? {
        let logger = self.logger
        return try await self.run {
            try await Self.rows("SELECT * FROM object WHERE account = \(account) AND key = \(key)", on: $0, logger).first.map(Self.object)
        }
    }

    public func objects(account: String, keys: [String]) async throws -> [String: StoredObject] {
        guard !keys.isEmpty else { return [:] }
        let logger = self.logger
        return try await self.run {
            let rows = try await Self.rows("SELECT * FROM object WHERE account = \(account) AND key = ANY(\(keys))", on: $0, logger)
            return Dictionary(
                try rows.map { row in
                    let object = try Self.object(row); return (object.key, object)
                }, uniquingKeysWith: { first, _ in first })
        }
    }

    public func object(account: String, size: Int64, sha1: String) async throws -> [StoredObject] {
        let logger = self.logger
        return try await self.run {
            try await Self.rows("SELECT * FROM object WHERE account = \(account) AND size = \(size) AND sha1 = \(sha1) LIMIT 8", on: $0, logger)
                .map(Self.object)
        }
    }

    public func probeCandidates(account: String, size: Int64, probe: String) async throws -> [StoredObject] {
        let logger = self.logger
        return try await self.run {
            try await Self.rows(
                "SELECT * FROM object WHERE account = \(account) AND size = \(size) AND (probe_sha1 = \(probe) OR probe_sha1 IS NULL) LIMIT 8",
                on: $0, logger
            ).map(Self.object)
        }
    }

    public func objects() async throws -> [StoredObject] {
        let logger = self.logger
        return try await self.run { try await Self.rows("SELECT * FROM object", on: $0, logger).map(Self.object) }
    }

    public func objects(account: String, prefix: String, after: String?, limit: Int) async throws -> [StoredObject] {
        try await self.keyPage("object", account, prefix, after, limit).map(Self.object)
    }

    public func sessions(account: String, prefix: String, after: String?, limit: Int) async throws -> [UploadSession] {
        try await self.keyPage("session", account, prefix, after, limit).map(Self.session)
    }

    public func unfinishedUploads(account: String, limit: Int) async throws -> Int {
        let logger = self.logger
        return try await self.run {
            try await Self.rows(
                "SELECT COUNT(*)::BIGINT AS count FROM (SELECT 1 FROM session WHERE account = \(account) LIMIT \(limit)) AS s", on: $0, logger
            ).first.map { Int(try $0["count"].decode(Int64.self)) } ?? 0
        }
    }

    public func unfinishedTotals() async throws -> (uploads: Int, bytes: Int64) {
        let logger = self.logger
        return try await self.run {
            let row = try await Self.rows(
                "SELECT COUNT(*)::BIGINT AS uploads, COALESCE(SUM(durable_offset), 0)::BIGINT AS bytes FROM session", on: $0, logger
            ).first
            return (Int(try row?["uploads"].decode(Int64.self) ?? 0), try row?["bytes"].decode(Int64.self) ?? 0)
        }
    }

    /// Rows of `table` for a page of keys. COLLATE "C": the UTF-8 byte order, as SQLite's, whatever the database's
    /// collation (the indexes of schema v7 serve it).
    private func keyPage(
        _ table: String, _ account: String, _ prefix: String, _ after: String?, _ limit: Int
    ) async throws -> [PostgresRandomAccessRow] {
        let logger = self.logger
        let after = after ?? ""
        return try await self.run {
            try await Self.rows(
                """
                SELECT * FROM \(unescaped: table) WHERE account = \(account) AND key COLLATE "C" >= \(prefix) AND key COLLATE "C" > \(after)
                AND starts_with(key, \(prefix)) ORDER BY key COLLATE "C" LIMIT \(limit)
                """, on: $0, logger
            )
        }
    }
}
