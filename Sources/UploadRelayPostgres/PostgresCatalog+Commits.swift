import UploadRelay
import Foundation
import Logging
import PostgresNIO
import UploadProtocol

/// Quota use and the commit protocol (SPEC §7, §8.3), as ``SQLiteCatalog+Commits`` runs them, each account's decisions
/// taken one at a time on its row.
extension PostgresCatalog {
    public func deleteObject(account: String, key: String) async throws {
        let logger = self.logger
        try await self.transaction { connection in
            do {
                try await Self.lockAccount(account, on: connection, logger)
            } catch CatalogError.unknownAccount {
                return  // nothing of it to forget, as in SQLite
            }
            let deleted = try await Self.rows(
                "DELETE FROM object WHERE account = \(account) AND key = \(key) RETURNING size", on: connection, logger
            )
            guard let size = try deleted.first?["size"].decode(Int64.self) else { return }
            try await connection.query("UPDATE account SET used_bytes = used_bytes - \(size) WHERE name = \(account)", logger: logger)
        }
    }

    // MARK: Quota and commits

    /// Takes the account's row for the transaction: commits and quota decisions of one account, on any relay, one at a
    /// time. Throws ``CatalogError/unknownAccount(_:)`` when there is none.
    static func lockAccount(_ account: String, on connection: PostgresConnection, _ logger: Logger) async throws {
        // NO KEY: commits take turns, while sessions and objects that refer to the account go on being recorded.
        guard try await !Self.rows("SELECT name FROM account WHERE name = \(account) FOR NO KEY UPDATE", on: connection, logger).isEmpty else {
            throw CatalogError.unknownAccount(account)
        }
    }

    /// Whether the reservation `r` is held: the lock connection that made it still holds the key's claim
    /// (``PostgresKeyLocks``). A relay that died, or let the key go, holds nothing; nor does a relay that took the key
    /// after it, until its own admission.
    static let reservationHeld = """
        EXISTS (SELECT 1 FROM key_claim c WHERE c.lock_id = r.lock_id AND c.holder_pid = r.holder_pid
            AND \(PostgresKeyLocks.holderLive("c")))
        """

    /// ``SQLiteCatalog``'s quota rule, read in the transaction of `connection`. With `relayPID` (the server process of
    /// the asking relay's lock connection, ``PostgresKeyLocks/backendPID``, 0 when it has none), the uploads open on the
    /// other relays count as this relay's own open uploads in `active` do: by what they announced (commits, which count
    /// durable bytes only, pass none).
    static func quotaUse(
        _ account: String, excludingKey key: String, active: [String: Int64], relayPID: Int32?, on connection: PostgresConnection,
        _ logger: Logger
    ) async throws -> QuotaUse {
        guard let row = try await Self.rows("SELECT * FROM account WHERE name = \(account)", on: connection, logger).first else {
            throw CatalogError.unknownAccount(account)
        }
        var active = active
        if let relayPID {
            for reservation in try await Self.rows(
                "SELECT r.key, r.bytes FROM open_reservation r WHERE r.account = \(account) AND r.holder_pid <> \(relayPID) AND \(unescaped: Self.reservationHeld)",
                on: connection, logger
            ) {
                let openKey = try reservation["key"].decode(String.self)
                if active[openKey] == nil { active[openKey] = try reservation["bytes"].decode(Int64.self) }
            }
        }
        let committing =
            try await Self.rows(
                "SELECT COALESCE(SUM(delta), 0)::BIGINT AS total FROM pending_commit WHERE account = \(account) AND key != \(key) AND delta > 0",
                on: connection, logger
            ).first?["total"].decode(Int64.self) ?? 0
        var staged = StagedBytes(active: active, excluding: key)
        for row in try await Self.rows(
            """
            SELECT s.key, s.declared_size,
                s.durable_offset + (SELECT COALESCE(SUM(bytes), 0) FROM session_stripe WHERE session_id = s.id)::BIGINT AS durable_offset,
                COALESCE(o.size, 0) AS replaced
            FROM session s LEFT JOIN object o ON o.account = s.account AND o.key = s.key
            WHERE s.account = \(account) AND s.key != \(key) AND s.key NOT IN (SELECT key FROM pending_commit WHERE account = \(account))
            """,
            on: connection, logger
        ) {
            staged.addSession(
                key: try row["key"].decode(String.self), declared: try row["declared_size"].decode(Int64?.self),
                durable: try row["durable_offset"].decode(Int64.self), replaced: try row["replaced"].decode(Int64.self)
            )
        }
        if staged.hasUnrecorded {
            for row in try await Self.rows("SELECT key FROM pending_commit WHERE account = \(account)", on: connection, logger) {
                staged.dropCommitting(try row["key"].decode(String.self))
            }
        }
        for (openKey, announced) in staged.announced {
            let replaced =
                try await Self.rows("SELECT size FROM object WHERE account = \(account) AND key = \(openKey)", on: connection, logger)
                .first?["size"].decode(Int64.self) ?? 0
            staged.addAnnounced(announced, replacing: replaced)
        }
        return QuotaUse(
            quota: try row["quota"].decode(Int64?.self), stored: try row["used_bytes"].decode(Int64.self), committing: committing,
            staged: staged.total
        )
    }

    public func quotaUse(account: String, excludingKey key: String, active: [String: Int64]) async throws -> QuotaUse {
        let (logger, relayPID) = (self.logger, self.locks.backendPID ?? 0)
        // One view of the data: a commit of another relay landing between the statements would undercount.
        return try await self.transaction(snapshot: true) {
            try await Self.quotaUse(account, excludingKey: key, active: active, relayPID: relayPID, on: $0, logger)
        }
    }

    public func admit(account: String, key: String, announced: Int64, growth: Int64, active: [String: Int64]) async throws -> QuotaUse {
        let (logger, pid) = (self.logger, self.locks.backendPID)
        let lockID = PostgresKeyLocks.lockID(account: account, key: key)
        return try await self.transaction { connection in
            // An account without a quota holds nothing back: its row is all (a quota set later counts from the next OPEN on).
            guard let row = try await Self.rows("SELECT quota, used_bytes FROM account WHERE name = \(account)", on: connection, logger).first
            else {
                throw CatalogError.unknownAccount(account)
            }
            if try row["quota"].decode(Int64?.self) == nil {
                return QuotaUse(quota: nil, stored: try row["used_bytes"].decode(Int64.self), committing: 0, staged: 0)
            }
            // Admissions and commits of the account take turns on its row, on every relay: each reads what the one
            // before it reserved.
            try await Self.lockAccount(account, on: connection, logger)
            // Reservations whose holder let go of the key, or died, hold nothing: gone.
            try await connection.query(
                "DELETE FROM open_reservation r WHERE r.account = \(account) AND NOT \(unescaped: Self.reservationHeld)", logger: logger
            )
            let use = try await Self.quotaUse(account, excludingKey: key, active: active, relayPID: pid ?? 0, on: connection, logger)
            // An account without a quota has nothing to hold (one set later counts from the next admission); without a lock
            // connection (it dropped since the key was locked: the upload is stopping) nothing is held either.
            if use.quota != nil, let pid, growth <= use.left {
                try await connection.query(
                    """
                    INSERT INTO open_reservation (account, key, bytes, holder_pid, lock_id)
                    VALUES (\(account), \(key), \(announced), \(pid), \(lockID))
                    ON CONFLICT (account, key) DO UPDATE SET bytes = EXCLUDED.bytes, holder_pid = EXCLUDED.holder_pid, lock_id = EXCLUDED.lock_id
                    """,
                    logger: logger
                )
            }
            return use
        }
    }

    public func beginCommit(_ commit: PendingCommit) async throws {
        let logger = self.logger
        try await self.transaction { try await Self.beginCommit(commit, on: $0, logger) }
    }

    /// One transaction for the group; each account's row is taken once, in name order (no deadlock between relays).
    public func beginCommits(_ commits: [PendingCommit]) async throws -> [CatalogError?] {
        let logger = self.logger
        return try await self.transaction { connection in
            for account in Set(commits.map(\.account)).sorted() {
                do {
                    try await Self.lockAccount(account, on: connection, logger)
                } catch CatalogError.unknownAccount {
                    continue  // refused below, commit by commit
                }
            }
            var results: [CatalogError?] = []
            for commit in commits {
                do {
                    try await connection.query("SAVEPOINT one_commit", logger: logger)
                    try await Self.beginCommit(commit, on: connection, logger, locked: true)
                    try await connection.query("RELEASE SAVEPOINT one_commit", logger: logger)
                    results.append(nil)
                } catch let error as CatalogError where !error.isUnavailable {
                    try await connection.query("ROLLBACK TO SAVEPOINT one_commit", logger: logger)
                    results.append(error)
                }
            }
            return results
        }
    }

    static func beginCommit(_ commit: PendingCommit, on connection: PostgresConnection, _ logger: Logger, locked: Bool = false) async throws {
        if !locked { try await Self.lockAccount(commit.account, on: connection, logger) }
        let use = try await Self.quotaUse(commit.account, excludingKey: commit.key, active: [:], relayPID: nil, on: connection, logger)
        let previous =
            try await Self.rows("SELECT size FROM object WHERE account = \(commit.account) AND key = \(commit.key)", on: connection, logger)
            .first?["size"].decode(Int64.self) ?? 0
        let delta = commit.size - previous
        if let quota = use.quota, delta > 0, use.stored + use.committing + delta > quota {
            throw CatalogError.quotaExceeded(account: commit.account, needed: delta, quota: quota, used: use.stored + use.committing)
        }
        try await connection.query(
            """
            INSERT INTO pending_commit (account, key, size, sha1, delta, session_id, event_location)
            VALUES (\(commit.account), \(commit.key), \(commit.size), \(commit.sha1), \(delta), \(commit.sessionID), \(commit.location))
            ON CONFLICT (account, key) DO UPDATE SET size = EXCLUDED.size, sha1 = EXCLUDED.sha1, delta = EXCLUDED.delta,
                session_id = EXCLUDED.session_id, event_location = EXCLUDED.event_location
            """,
            logger: logger
        )
    }

    public func finishCommit(_ commit: PendingCommit, identity: ObjectIdentity) async throws {
        try await self.finishCommits([(commit, identity)])
    }

    public func finishCommits(_ commits: [(PendingCommit, ObjectIdentity)]) async throws {
        let logger = self.logger
        try await self.transaction { connection in
            for account in Set(commits.map(\.0.account)).sorted() {
                do {
                    try await Self.lockAccount(account, on: connection, logger)
                } catch CatalogError.unknownAccount {
                    continue
                }
            }
            for (commit, identity) in commits {
                let previous =
                    try await Self.rows("SELECT size FROM object WHERE account = \(commit.account) AND key = \(commit.key)", on: connection, logger)
                    .first?["size"].decode(Int64.self) ?? 0
                try await connection.query(
                    """
                    INSERT INTO object (account, key, size, sha1, committed_at, device, inode, modified, probe_sha1)
                    VALUES (\(commit.account), \(commit.key), \(commit.size), \(commit.sha1), \(Date().timeIntervalSince1970),
                        \(Int64(bitPattern: identity.device)), \(Int64(bitPattern: identity.inode)), \(identity.modified), \(commit.probeSHA1))
                    ON CONFLICT (account, key) DO UPDATE SET size = EXCLUDED.size, sha1 = EXCLUDED.sha1, committed_at = EXCLUDED.committed_at,
                        device = EXCLUDED.device, inode = EXCLUDED.inode, modified = EXCLUDED.modified, probe_sha1 = EXCLUDED.probe_sha1
                    """,
                    logger: logger
                )
                try await connection.query(
                    "UPDATE account SET used_bytes = used_bytes + \(commit.size - previous) WHERE name = \(commit.account)", logger: logger
                )
                try await connection.query(
                    "DELETE FROM pending_commit WHERE account = \(commit.account) AND key = \(commit.key)", logger: logger
                )
                // Stored now: other relays count the object, not also what its upload announced.
                try await connection.query(
                    "DELETE FROM open_reservation WHERE account = \(commit.account) AND key = \(commit.key)", logger: logger
                )
                if let sessionID = commit.sessionID {
                    try await connection.query("DELETE FROM session WHERE id = \(sessionID)", logger: logger)
                }
                if let location = commit.location {
                    let now = Date().timeIntervalSince1970
                    try await connection.query(
                        """
                        INSERT INTO commit_event (account, key, size, sha1, location, committed_at, next_attempt_at)
                        VALUES (\(commit.account), \(commit.key), \(commit.size), \(commit.sha1), \(location), \(now), \(now))
                        """,
                        logger: logger
                    )
                }
            }
        }
    }

    public func abandonCommit(account: String, key: String) async throws {
        let logger = self.logger
        try await self.run {
            _ = try await $0.query("DELETE FROM pending_commit WHERE account = \(account) AND key = \(key)", logger: logger).collect()
        }
    }

    public func pendingCommits() async throws -> [PendingCommit] {
        let logger = self.logger
        return try await self.run {
            try await Self.rows("SELECT * FROM pending_commit", on: $0, logger).map(Self.pendingCommit)
        }
    }

    public func pendingCommit(account: String, key: String) async throws -> PendingCommit? {
        let logger = self.logger
        return try await self.run {
            try await Self.rows("SELECT * FROM pending_commit WHERE account = \(account) AND key = \(key)", on: $0, logger)
                .first.map(Self.pendingCommit)
        }
    }

    private static func pendingCommit(_ row: PostgresRandomAccessRow) throws -> PendingCommit {
        PendingCommit(
            account: try row["account"].decode(String.self), key: try row["key"].decode(String.self), size: try row["size"].decode(Int64.self),
            sha1: try row["sha1"].decode(String.self), sessionID: try row["session_id"].decode(String?.self),
            location: try row["event_location"].decode(String?.self)
        )
    }

    // MARK: Commit events (the hooks' outbox)

    public func claimCommitEvents(limit: Int, lease: Duration) async throws -> [CommitEvent] {
        let logger = self.logger
        let now = Date().timeIntervalSince1970
        let until = now + lease.inSeconds
        return try await self.transaction { connection in
            // SKIP LOCKED: relays looking at once take different events.
            try await Self.rows(
                """
                UPDATE commit_event SET next_attempt_at = \(until), attempts = attempts + 1
                WHERE id IN (
                    SELECT id FROM commit_event WHERE next_attempt_at <= \(now) ORDER BY id LIMIT \(limit) FOR UPDATE SKIP LOCKED
                )
                RETURNING *
                """,
                on: connection, logger
            ).map {
                CommitEvent(
                    id: try $0["id"].decode(Int64.self), account: try $0["account"].decode(String.self), key: try $0["key"].decode(String.self),
                    size: try $0["size"].decode(Int64.self), sha1: try $0["sha1"].decode(String.self),
                    location: try $0["location"].decode(String.self),
                    committedAt: Date(timeIntervalSince1970: try $0["committed_at"].decode(Double.self)),
                    attempts: try $0["attempts"].decode(Int.self)
                )
            }.sorted { $0.id < $1.id }
        }
    }

    public func finishCommitEvent(id: Int64) async throws {
        let logger = self.logger
        try await self.run { _ = try await $0.query("DELETE FROM commit_event WHERE id = \(id)", logger: logger).collect() }
    }

    public func retryCommitEvent(id: Int64, at retryAt: Date, error: String) async throws {
        let logger = self.logger
        let at = retryAt.timeIntervalSince1970
        try await self.run {
            _ = try await $0.query(
                "UPDATE commit_event SET next_attempt_at = \(at), last_error = \(error) WHERE id = \(id)", logger: logger
            ).collect()
        }
    }

    public func commitEventBacklog() async throws -> CommitEventBacklog {
        let logger = self.logger
        return try await self.run { connection in
            let row = try await Self.rows(
                "SELECT COUNT(*)::BIGINT AS n, MIN(committed_at) AS oldest FROM commit_event", on: connection, logger
            ).first
            let count = try row?["n"].decode(Int64.self) ?? 0
            let oldest = try row?["oldest"].decode(Double?.self) ?? nil
            let error =
                try await Self.rows(
                    "SELECT last_error FROM commit_event WHERE last_error IS NOT NULL ORDER BY id LIMIT 1", on: connection, logger
                ).first?["last_error"].decode(String?.self) ?? nil
            return CommitEventBacklog(count: Int(count), lastError: error, oldest: oldest.map(Date.init(timeIntervalSince1970:)))
        }
    }

    public func ping() async throws {
        let logger = self.logger
        try await self.run { connection in
            _ = try await Self.rows("SELECT 1 AS one", on: connection, logger)
        }
    }
}
