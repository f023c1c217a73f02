import UploadRelay
import Foundation
import GRDB
import UploadProtocol

/// Quota use and the commit protocol: reserve (pending_commit), finish, abandon, recover (SPEC §7, §8.3).
extension SQLiteCatalog {
    static func quotaUse(_ db: Database, account: String, excludingKey key: String, active: [String: Int64] = [:]) throws -> QuotaUse {
        guard let row = try Row.fetchOne(cached: db, sql: "SELECT * FROM account WHERE name = ?", arguments: [account]) else {
            throw CatalogError.unknownAccount(account)
        }
        let committing =
            try Int64.fetchOne(
                cached: db, sql: "SELECT COALESCE(SUM(delta), 0) FROM pending_commit WHERE account = ? AND key != ? AND delta > 0",
                arguments: [account, key]
            ) ?? 0
        var staged = StagedBytes(active: active, excluding: key)
        for row in try Row.fetchAll(
            cached: db,
            sql: """
                SELECT s.key, s.declared_size,
                    s.durable_offset + (SELECT COALESCE(SUM(bytes), 0) FROM session_stripe WHERE session_id = s.id) AS durable_offset,
                    COALESCE(o.size, 0) AS replaced
                FROM session s LEFT JOIN object o ON o.account = s.account AND o.key = s.key
                WHERE s.account = ? AND s.key != ? AND s.key NOT IN (SELECT key FROM pending_commit WHERE account = ?)
                """,
            arguments: [account, key, account]
        ) {
            staged.addSession(key: row["key"], declared: row["declared_size"], durable: row["durable_offset"], replaced: row["replaced"])
        }
        if staged.hasUnrecorded {
            for row in try Row.fetchAll(cached: db, sql: "SELECT key FROM pending_commit WHERE account = ?", arguments: [account]) {
                staged.dropCommitting(row["key"])
            }
        }
        for (openKey, announced) in staged.announced {
            let replaced =
                try Int64.fetchOne(cached: db, sql: "SELECT size FROM object WHERE account = ? AND key = ?", arguments: [account, openKey]) ?? 0
            staged.addAnnounced(announced, replacing: replaced)
        }
        return QuotaUse(quota: row["quota"], stored: row["used_bytes"], committing: committing, staged: staged.total)
    }

    public func quotaUse(account: String, excludingKey key: String, active: [String: Int64]) async throws -> QuotaUse {
        try await self.reading { db in try Self.quotaUse(db, account: account, excludingKey: key, active: active) }
    }

    /// An account without a quota is answered from its row alone: the sums over its sessions and commits, 8 % of the
    /// relay's CPU per small file, would change nothing.
    public func admit(account: String, key: String, announced: Int64, growth: Int64, active: [String: Int64]) async throws -> QuotaUse {
        try await self.reading { db in
            guard let row = try Row.fetchOne(cached: db, sql: "SELECT quota, used_bytes FROM account WHERE name = ?", arguments: [account]) else {
                throw CatalogError.unknownAccount(account)
            }
            guard (row["quota"] as Int64?) != nil else {
                return QuotaUse(quota: nil, stored: row["used_bytes"], committing: 0, staged: 0)
            }
            return try Self.quotaUse(db, account: account, excludingKey: key, active: active)
        }
    }

    public func beginCommit(_ commit: PendingCommit) async throws {
        try await self.writing { db in try Self.beginCommit(db, commit) }
    }

    public func beginCommits(_ commits: [PendingCommit]) async throws -> [CatalogError?] {
        try await self.writing { db in
            try Self.reserving(commits) { try Self.beginCommit(db, $0) }
        }
    }

    public func finishCommit(_ commit: PendingCommit, identity: ObjectIdentity) async throws {
        try await self.writing { db in try Self.finishCommit(db, commit, identity: identity) }
    }

    public func finishCommits(_ commits: [(PendingCommit, ObjectIdentity)]) async throws {
        try await self.writing { db in
            for (commit, identity) in commits { try Self.finishCommit(db, commit, identity: identity) }
        }
    }

    static func beginCommit(_ db: Database, _ commit: PendingCommit) throws {
        let use = try Self.quotaUse(db, account: commit.account, excludingKey: commit.key)
        let previous =
            try Int64.fetchOne(
                cached: db, sql: "SELECT size FROM object WHERE account = ? AND key = ?", arguments: [commit.account, commit.key]
            ) ?? 0
        let delta = commit.size - previous
        if let quota = use.quota, delta > 0, use.stored + use.committing + delta > quota {
            throw CatalogError.quotaExceeded(account: commit.account, needed: delta, quota: quota, used: use.stored + use.committing)
        }
        try db.execute(
            cached: """
                INSERT OR REPLACE INTO pending_commit (account, key, size, sha1, delta, session_id, event_location)
                VALUES (?, ?, ?, ?, ?, ?, ?)
                """,
            arguments: [commit.account, commit.key, commit.size, commit.sha1, delta, commit.sessionID, commit.location]
        )
    }

    static func finishCommit(_ db: Database, _ commit: PendingCommit, identity: ObjectIdentity) throws {
        let previous =
            try Int64.fetchOne(
                cached: db, sql: "SELECT size FROM object WHERE account = ? AND key = ?", arguments: [commit.account, commit.key]
            ) ?? 0
        try db.execute(
            cached: """
                INSERT OR REPLACE INTO object (account, key, size, sha1, committed_at, device, inode, modified, probe_sha1)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                """,
            arguments: [
                commit.account, commit.key, commit.size, commit.sha1, Date().timeIntervalSince1970,
                Int64(bitPattern: identity.device), Int64(bitPattern: identity.inode), identity.modified, commit.probeSHA1,
            ]
        )
        try db.execute(
            cached: "UPDATE account SET used_bytes = used_bytes + ? WHERE name = ?", arguments: [commit.size - previous, commit.account]
        )
        try db.execute(cached: "DELETE FROM pending_commit WHERE account = ? AND key = ?", arguments: [commit.account, commit.key])
        if let sessionID = commit.sessionID {
            try db.execute(cached: "DELETE FROM session WHERE id = ?", arguments: [sessionID])
        }
        if let location = commit.location {
            let now = Date().timeIntervalSince1970
            try db.execute(
                cached: """
                    INSERT INTO commit_event (account, key, size, sha1, location, committed_at, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, ?)
                    """,
                arguments: [commit.account, commit.key, commit.size, commit.sha1, location, now, now]
            )
        }
    }

    public func abandonCommit(account: String, key: String) async throws {
        try await self.writing { db in
            try db.execute(cached: "DELETE FROM pending_commit WHERE account = ? AND key = ?", arguments: [account, key])
        }
    }

    public func pendingCommits() async throws -> [PendingCommit] {
        try await self.reading { db in
            try Row.fetchAll(cached: db, sql: "SELECT * FROM pending_commit").map(Self.pendingCommit)
        }
    }

    public func pendingCommit(account: String, key: String) async throws -> PendingCommit? {
        try await self.reading { db in
            try Row.fetchOne(cached: db, sql: "SELECT * FROM pending_commit WHERE account = ? AND key = ?", arguments: [account, key])
                .map(Self.pendingCommit)
        }
    }

    private static func pendingCommit(_ row: Row) -> PendingCommit {
        PendingCommit(
            account: row["account"], key: row["key"], size: row["size"], sha1: row["sha1"], sessionID: row["session_id"],
            location: row["event_location"]
        )
    }

    public func deleteObject(account: String, key: String) async throws {
        try await self.writing { db in
            guard let size = try Int64.fetchOne(cached: db, sql: "SELECT size FROM object WHERE account = ? AND key = ?", arguments: [account, key])
            else { return }
            try db.execute(cached: "DELETE FROM object WHERE account = ? AND key = ?", arguments: [account, key])
            try db.execute(cached: "UPDATE account SET used_bytes = used_bytes - ? WHERE name = ?", arguments: [size, account])
        }
    }

    // MARK: Commit events (the hooks' outbox)

    public func claimCommitEvents(limit: Int, lease: Duration) async throws -> [CommitEvent] {
        try await self.writing { db in
            let now = Date().timeIntervalSince1970
            let rows = try Row.fetchAll(
                cached: db, sql: "SELECT * FROM commit_event WHERE next_attempt_at <= ? ORDER BY id LIMIT ?", arguments: [now, limit]
            )
            let until = now + lease.inSeconds
            return try rows.map { row in
                let id: Int64 = row["id"]
                let attempts: Int = row["attempts"]
                try db.execute(
                    cached: "UPDATE commit_event SET next_attempt_at = ?, attempts = ? WHERE id = ?", arguments: [until, attempts + 1, id]
                )
                return CommitEvent(
                    id: id, account: row["account"], key: row["key"], size: row["size"], sha1: row["sha1"], location: row["location"],
                    committedAt: Date(timeIntervalSince1970: row["committed_at"]), attempts: attempts + 1
                )
            }
        }
    }

    public func finishCommitEvent(id: Int64) async throws {
        try await self.writing { db in try db.execute(cached: "DELETE FROM commit_event WHERE id = ?", arguments: [id]) }
    }

    public func retryCommitEvent(id: Int64, at retryAt: Date, error: String) async throws {
        try await self.writing { db in
            try db.execute(
                cached: "UPDATE commit_event SET next_attempt_at = ?, last_error = ? WHERE id = ?",
                arguments: [retryAt.timeIntervalSince1970, error, id]
            )
        }
    }

    public func commitEventBacklog() async throws -> CommitEventBacklog {
        try await self.reading { db in
            let count = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM commit_event") ?? 0
            let error = try String.fetchOne(db, sql: "SELECT last_error FROM commit_event WHERE last_error IS NOT NULL ORDER BY id LIMIT 1")
            let oldest = try Double.fetchOne(db, sql: "SELECT MIN(committed_at) FROM commit_event")
            return CommitEventBacklog(count: count, lastError: error, oldest: oldest.map(Date.init(timeIntervalSince1970:)))
        }
    }

    public func ping() async throws {
        try await self.reading { db in _ = try Int.fetchOne(db, sql: "SELECT 1") }
    }
}
