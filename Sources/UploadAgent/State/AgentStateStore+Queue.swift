/// One item of the persistent queue, as `upload-agent status` shows it.
public struct QueuedItem: Hashable, Sendable {
    public enum Status: String, Hashable, Sendable, CaseIterable {
        /// Waiting for its turn (or for the relay, or for a pause to end).
        case queued
        /// On a connection now (or when the agent that ran it was killed: the next run resumes it).
        case uploading
        /// Stored on the relay, or found there already.
        case done
        /// Given up; `upload-agent retry` queues it again.
        case failed
        /// Its file was deleted before the upload finished: never uploaded, nothing deleted on the relay.
        case dropped
    }

    public var id: Int64
    public var target: String
    public var key: String
    public var path: String
    public var status: Status
    public var size: UInt64?
    public var fingerprint: [UInt8]
    public var sha1: String?
    /// The relay's durable offset, as last heard.
    public var acked: UInt64
    /// The agent's SHA-1 state at `acked` (when it hashes while sending), so a restart resumes without re-reading.
    public var sha1State: [UInt8]?
    public var sentBytes: UInt64
    /// Bytes read only to hash them (dedup before OPEN, or a prefix on resume): 0 when the hash cache knew the file.
    public var hashedBytes: UInt64
    /// `stored` or `deduplicated` once done.
    public var outcome: String?
    public var error: String?
    public var overwrite: Bool
    /// Whether the file is hashed before OPEN (the settings of the command that queued it, whoever uploads it).
    public var dedup: Bool
    /// Whether a symbolic link at `path` is followed (`--follow-symlinks` of the command that queued it).
    public var followSymlinks: Bool
    /// Bytes per second acknowledged lately, while uploading.
    public var rate: Double
    public var addedAt: Double
    public var updatedAt: Double

    init(row: SQLRow) {
        func count(_ column: String) -> UInt64 { UInt64(max(0, row.int64(column) ?? 0)) }
        self.id = row.int64("id") ?? 0
        self.target = row.string("target") ?? ""
        self.key = row.string("key") ?? ""
        self.path = row.string("path") ?? ""
        self.status = row.string("status").flatMap(Status.init(rawValue:)) ?? .queued
        self.size = row.int64("size").map { UInt64(max(0, $0)) }
        self.fingerprint = row.bytes("fingerprint") ?? []
        self.sha1 = row.string("sha1")
        self.acked = count("acked")
        self.sha1State = row.bytes("sha1_state")
        self.sentBytes = count("sent_bytes")
        self.hashedBytes = count("hashed_bytes")
        self.outcome = row.string("outcome")
        self.error = row.string("error")
        self.overwrite = row.bool("overwrite")
        self.dedup = row.bool("dedup")
        self.followSymlinks = row.bool("follow_symlinks")
        self.rate = row.double("rate") ?? 0
        self.addedAt = row.double("added_at") ?? 0
        self.updatedAt = row.double("updated_at") ?? 0
    }
}

/// What adding an item to the queue did.
public enum EnqueueOutcome: Hashable, Sendable {
    /// Queued now (new, changed, or failed before); a runner will upload it.
    case queued(Int64)
    /// Already queued or uploading: the same work is not done twice.
    case alreadyQueued(Int64)
    /// Done before with the same fingerprint: nothing to do.
    case unchanged(Int64)
}

/// What one item to add says about itself.
public struct QueueEntry: Hashable, Sendable {
    public var key: String
    /// Absolute: whichever process uploads it, from whatever directory, opens this file.
    public var path: String
    public var size: UInt64?
    /// The file's fingerprint when it was queued: the uploader opens the path and refuses a file with another one.
    public var fingerprint: [UInt8]
    public var overwrite: Bool
    public var dedup: Bool
    /// Whether a symbolic link at `path` is followed (else the uploader refuses one there).
    public var followSymlinks: Bool

    /// `path` relative to the working directory is made absolute.
    public init(
        key: String, path: String, size: UInt64?, fingerprint: [UInt8], overwrite: Bool, dedup: Bool = true, followSymlinks: Bool = false
    ) {
        self.key = key
        self.path = ItemPlanner.absolute(path)
        self.size = size
        self.fingerprint = fingerprint
        self.overwrite = overwrite
        self.dedup = dedup
        self.followSymlinks = followSymlinks
    }
}

extension QueueEntry {
    /// The entry of a file item, its settings defaulting to `configuration`'s; nil for any other source (a stream
    /// cannot be found again after a restart, and the queue keeps a whole file's path, not a start offset). Its
    /// fingerprint is the one the item was planned with, else the file's now.
    init?(item: UploadItem, configuration: AgentConfiguration) {
        guard let file = item.source as? FileSource, file.startOffset == 0 else { return nil }
        let info = FileSource.currentInfo(path: file.path, followSymlinks: file.followSymlinks)
        let fingerprint = item.checkedFingerprint ?? info?.fingerprint ?? []
        self.init(
            key: item.key, path: file.path, size: fingerprint == info?.fingerprint ? info?.size : nil, fingerprint: fingerprint,
            overwrite: item.overwrite ?? configuration.overwrite, dedup: item.dedup ?? configuration.dedup, followSymlinks: file.followSymlinks
        )
    }
}

extension AgentStateStore {
    /// Adds items for `target`. An item done before with the same fingerprint is `unchanged` when `skipUnchanged`
    /// (watch's rescans), queued again otherwise (send asks the relay, which answers from its dedup without a byte).
    /// `external` marks a change a running agent of another process must notice.
    /// `skipChanged` leaves them alone even when the file changed since (`watch --on-change skip`: the first wins).
    public func enqueue(
        _ entries: [QueueEntry], target: String, skipUnchanged: Bool, skipChanged: Bool = false, external: Bool
    ) throws -> [EnqueueOutcome] {
        try self.write { db in
            let now = Self.now()
            var outcomes: [EnqueueOutcome] = []
            for entry in entries {
                let existing = try db.row("SELECT id, status, fingerprint FROM item WHERE target = ? AND key = ?", [target, entry.key])
                guard let existing else {
                    try db.execute(
                        """
                        INSERT INTO item (target, key, path, status, size, fingerprint, overwrite, dedup, follow_symlinks, added_at, updated_at)
                        VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?)
                        """,
                        [
                            target, entry.key, entry.path, entry.size.map { Int64($0) }, entry.fingerprint, entry.overwrite, entry.dedup,
                            entry.followSymlinks, now, now,
                        ]
                    )
                    outcomes.append(.queued(db.lastInsertedRowID))
                    continue
                }
                let id = existing.int64("id") ?? 0
                let status = existing.string("status").flatMap(QueuedItem.Status.init(rawValue:)) ?? .queued
                let sameContent = (existing.bytes("fingerprint") ?? []) == entry.fingerprint && !entry.fingerprint.isEmpty
                switch status {
                case .queued, .uploading:
                    if !sameContent {
                        // A newer version of a file still waiting: its progress belonged to the old one.
                        try db.execute(
                            """
                            UPDATE item SET path = ?, size = ?, fingerprint = ?, sha1 = NULL, acked = 0, sha1_state = NULL,
                            overwrite = ?, dedup = ?, follow_symlinks = ?, updated_at = ? WHERE id = ?
                            """,
                            [
                                entry.path, entry.size.map { Int64($0) }, entry.fingerprint, entry.overwrite, entry.dedup, entry.followSymlinks,
                                now, id,
                            ]
                        )
                    }
                    outcomes.append(.alreadyQueued(id))
                    continue
                case .done where (sameContent && skipUnchanged) || skipChanged:
                    outcomes.append(.unchanged(id))
                    continue
                case .done, .failed, .dropped:
                    try db.execute(
                        """
                        UPDATE item SET path = ?, status = 'queued', size = ?, fingerprint = ?, sha1 = NULL, acked = 0,
                        sha1_state = NULL, sent_bytes = 0, hashed_bytes = 0, outcome = NULL, error = NULL, overwrite = ?,
                        dedup = ?, follow_symlinks = ?, rate = 0, added_at = ?, updated_at = ? WHERE id = ?
                        """,
                        [
                            entry.path, entry.size.map { Int64($0) }, entry.fingerprint, entry.overwrite, entry.dedup, entry.followSymlinks,
                            now, now, id,
                        ]
                    )
                    outcomes.append(.queued(id))
                }
            }
            if external { try Self.bump(db) }
            return outcomes
        }
    }

    /// Items of `target` waiting or left uploading by an agent that stopped, oldest first.
    public func pending(target: String, limit: Int? = nil) throws -> [QueuedItem] {
        try self.read { db in
            try db.rows("SELECT * FROM item WHERE target = ? AND status IN ('queued', 'uploading') ORDER BY id LIMIT ?", [target, limit ?? -1])
                .map(QueuedItem.init(row:))
        }
    }

    /// Every item (of one target, or all), oldest first.
    public func items(target: String? = nil) throws -> [QueuedItem] {
        try self.read { db in
            if let target {
                return try db.rows("SELECT * FROM item WHERE target = ? ORDER BY id", [target]).map(QueuedItem.init(row:))
            }
            return try db.rows("SELECT * FROM item ORDER BY id").map(QueuedItem.init(row:))
        }
    }

    public func items(ids: [Int64]) throws -> [QueuedItem] {
        try self.read { db in
            try db.rows("SELECT * FROM item WHERE id IN (SELECT value FROM json_each(?))", [Self.jsonArray(ids)]).map(QueuedItem.init(row:))
        }
    }

    private static func jsonArray(_ ids: [Int64]) -> String {
        "[" + ids.map(String.init).joined(separator: ",") + "]"
    }

    /// Items whose file was deleted before they were uploaded: they leave the queue (nothing on the relay is touched).
    public func drop(target: String, key: String, reason: String) throws -> Int64? {
        try self.write { db in
            guard
                let id = try db.row(
                    "SELECT id FROM item WHERE target = ? AND key = ? AND status IN ('queued', 'uploading', 'failed')", [target, key])?
                    .int64("id")
            else { return nil }
            try db.execute("UPDATE item SET status = 'dropped', error = ?, rate = 0, updated_at = ? WHERE id = ?", [reason, Self.now(), id])
            return id
        }
    }

    /// Queues failed items again (`upload-agent retry`); returns how many.
    public func retryFailed(target: String? = nil) throws -> Int {
        try self.write { db in
            try db.execute(
                "UPDATE item SET status = 'queued', error = NULL, updated_at = ? WHERE status = 'failed' AND (? IS NULL OR target = ?)",
                [Self.now(), target, target]
            )
            let count = db.changes
            try Self.bump(db)
            return count
        }
    }

    // MARK: A runner's records

    /// Progress of one item, written by the agent that uploads it.
    struct Progress: Sendable {
        var status: QueuedItem.Status
        var size: UInt64?
        var fingerprint: [UInt8]?
        var sha1: String?
        var acked: UInt64
        var sha1State: [UInt8]?
        var sentBytes: UInt64
        var hashedBytes: UInt64
        var outcome: String?
        var error: String?
        var rate: Double
    }

    /// Records `updates`, and `hashes` (fingerprint, SHA-1) in the hash cache, in one transaction.
    func record(_ updates: [(Int64, Progress)], hashes: [([UInt8], String)] = []) throws {
        guard !updates.isEmpty || !hashes.isEmpty else { return }
        try self.write { db in
            let now = Self.now()
            for (fingerprint, sha1) in hashes {
                try db.execute("INSERT OR REPLACE INTO hash_cache (fingerprint, sha1, used_at) VALUES (?, ?, ?)", [fingerprint, sha1, now])
            }
            for (id, progress) in updates {
                // An item dropped (file deleted) meanwhile stays dropped; one whose file changed meanwhile (a new
                // fingerprint queued by a rescan) is not marked with the old version's progress.
                let fingerprint = progress.fingerprint
                // Prepared once (every statement is): this runs for every item, and compiling it cost more than running it.
                try db.execute(
                    """
                    UPDATE item SET status = ?, size = COALESCE(?, size), sha1 = COALESCE(?, sha1), acked = ?, sha1_state = ?,
                    sent_bytes = ?, hashed_bytes = ?, outcome = ?, error = ?, rate = ?, updated_at = ?
                    WHERE id = ? AND status IN ('queued', 'uploading') AND (? IS NULL OR fingerprint = ? OR fingerprint = x'')
                    """,
                    [
                        progress.status.rawValue, progress.size.map { Int64($0) }, progress.sha1, Int64(progress.acked),
                        progress.sha1State, Int64(progress.sentBytes), Int64(progress.hashedBytes), progress.outcome,
                        progress.error, progress.rate, now, id, fingerprint, fingerprint,
                    ]
                )
                // A finished upload's SHA-1 is the relay's, of the bytes read while the fingerprint held: the hash cache
                // learns it, so the next run's dedup needs no read (a probed or --no-dedup upload hashed it only while
                // sending).
                if progress.status == .done, progress.outcome != nil, let sha1 = progress.sha1, let fingerprint, !fingerprint.isEmpty {
                    try db.execute("INSERT OR REPLACE INTO hash_cache (fingerprint, sha1, used_at) VALUES (?, ?, ?)", [fingerprint, sha1, now])
                }
            }
        }
    }

    /// Marks every item of `target` still waiting as failed for `reason` (a `send` that gave up: a refused token), and
    /// returns them: each gets its result.
    func failPending(target: String, reason: String) throws -> [QueuedItem] {
        try self.write { db in
            let rows = try db.rows("SELECT * FROM item WHERE target = ? AND status IN ('queued', 'uploading') ORDER BY id", [target])
                .map(QueuedItem.init(row:))
            try db.execute(
                "UPDATE item SET status = 'failed', error = ?, rate = 0, updated_at = ? WHERE target = ? AND status IN ('queued', 'uploading')",
                [reason, Self.now(), target]
            )
            try Self.bump(db)
            return rows.map { row in
                var row = row
                row.status = .failed
                row.error = reason
                return row
            }
        }
    }

    /// At a runner's start: items left `uploading` by an agent that stopped go back to `queued`.
    func resetUploading(target: String) throws {
        try self.write { db in
            try db.execute("UPDATE item SET status = 'queued', rate = 0 WHERE target = ? AND status = 'uploading'", [target])
        }
    }
}
