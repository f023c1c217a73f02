import UploadRelay
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import PostgresNIO
import UploadChecksums

/// How a relay finds out that its lock connection is gone when no reset says so (a network cut, a database host
/// that froze): it asks the connection every `interval` and closes it when no answer came within `timeout`, which
/// stops the uploads whose keys it held (``KeyLocks/whenLost(_:)``). PostgreSQL probes its side of the connection with TCP
/// keepalives (``serverKeepalive``) and lets the locks go only once those went unanswered, later than that: the
/// relay cut off has stopped its uploads before another relay can take their keys.
public struct LockHeartbeat: Sendable {
    public var interval: Duration
    public var timeout: Duration
    /// PostgreSQL's `tcp_keepalives_idle`, `tcp_keepalives_interval` and `tcp_keepalives_count` on the lock
    /// connection, in seconds: its locks go at most about idle + interval x count after the relay went silent.
    public var serverKeepalive: (idle: Int, interval: Int, count: Int)

    public init(
        interval: Duration = .seconds(5), timeout: Duration = .seconds(10), serverKeepalive: (idle: Int, interval: Int, count: Int) = (30, 5, 5)
    ) {
        self.interval = interval
        self.timeout = timeout
        self.serverKeepalive = serverKeepalive
    }

    /// The longest a relay cut off goes on believing it holds its locks.
    var relayNotices: Duration { self.interval + self.timeout }

    /// The least time PostgreSQL takes to let a silent relay's locks go.
    var serverReleases: Duration { .seconds(self.serverKeepalive.idle + self.serverKeepalive.interval * self.serverKeepalive.count) }
}

/// Key locks across the relays sharing one PostgreSQL catalog: a row per locked key in `key_claim` (an unlogged table),
/// naming the connection of the relay's own that holds it. That connection holds one session-level advisory lock, its
/// *liveness lock* (a random number, ``holderLive(_:)``): a claim whose holder's liveness lock is gone (the relay died,
/// its connection dropped) is free, and the next relay takes it over. So the locks go when the relay dies and never by a
/// timeout, as session locks would, while PostgreSQL's lock table holds one entry per relay, not one per open upload
/// (that table holds about `max_locks_per_transaction` x `max_connections` entries, 6,400 by default: a fleet's
/// thumbnails in flight would fill it, and every lock after that fail with "out of shared memory").
///
/// Per upload, the catalog's cost is one row in `key_claim` (unlogged: no WAL, emptied if PostgreSQL crashes, when
/// every holder is gone anyway) and two statements on the lock connection, one to claim and one to let go; no lock.
///
/// Claims are reentrant within their connection (`holds` counts them): this relay's own claims (``KeyClaims``) keep a
/// key to one of its uploads at a time, and each claim taken is let go exactly once, whatever order the two reach the
/// server in.
///
/// The size an admitted upload announced is recorded under its key's claim (`open_reservation`, with ``backendPID``):
/// other relays count it against the account's quota while this connection holds the key's claim, and no longer once
/// it is let go or the connection drops (``PostgresCatalog/admit(account:key:announced:growth:active:)``).
final class PostgresKeyLocks: KeyLocks, Sendable {
    private struct State {
        var connection: PostgresConnection?
        /// The server process of `connection`: the one that holds its liveness lock in `pg_locks`.
        var pid: Int32?
        /// The liveness lock of `connection`: the `holder_token` of its claims.
        var token: Int64 = 0
        /// Counts connections: a lock belongs to the one that took it.
        var generation = 0
        var lost: (@Sendable (Int) -> Void)?
        var shutDown = false
        /// When `connection` last answered a query, any query: what the heartbeat asks about.
        var lastAnswer = ContinuousClock.now
    }

    private let configuration: PostgresConnection.Configuration
    private let logger: Logger
    private let timeout: Duration
    private let heartbeat: LockHeartbeat
    private let state = NIOLockedValueBox(State())
    /// One connect at a time.
    private let connecting = AsyncLock()

    deinit {
        self.shutdown()
    }

    init(url: String, logger: Logger, timeout: Duration, heartbeat: LockHeartbeat = LockHeartbeat()) throws {
        guard heartbeat.interval > .zero, heartbeat.timeout > .zero, heartbeat.serverReleases > heartbeat.relayNotices else {
            throw CatalogError.unavailable(
                "the lock connection's heartbeat (\(heartbeat.interval) + \(heartbeat.timeout)) must notice a silent database before PostgreSQL's keepalives let the locks go (\(heartbeat.serverReleases))"
            )
        }
        var configuration = try PostgresCatalog.connectionConfiguration(url)
        let keepalive = heartbeat.serverKeepalive
        configuration.options.additionalStartupParameters += [
            ("tcp_keepalives_idle", "\(keepalive.idle)"), ("tcp_keepalives_interval", "\(keepalive.interval)"),
            ("tcp_keepalives_count", "\(keepalive.count)"),
        ]
        self.configuration = configuration
        self.logger = logger
        self.timeout = timeout
        self.heartbeat = heartbeat
    }

    /// The lock number of a key (its claim's `lock_id`): the first 8 bytes of the SHA-1 of account, NUL, key. Two keys
    /// that share one only wait for each other.
    static func lockID(account: String, key: String) -> Int64 {
        var sha1 = SHA1()
        sha1.update(Array(account.utf8) + [0] + Array(key.utf8))
        return sha1.finalize().prefix(8).reduce(Int64(0)) { ($0 << 8) | Int64($1) }
    }

    /// The server process of the connection that holds this relay's locks now; nil when there is none. A reservation
    /// made under it is this relay's (its own claims count it); one held by another process is another relay's.
    var backendPID: Int32? {
        self.state.withLockedValue { $0.connection?.isClosed == false ? $0.pid : nil }
    }

    /// Whether the connection that holds claim `alias` (a `key_claim` row) is alive: it holds its liveness lock
    /// (PostgreSQL shows a bigint lock's high half as `classid`, its low half as `objid`).
    static func holderLive(_ alias: String) -> String {
        """
        EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.pid = \(alias).holder_pid
            AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
            AND l.classid::BIGINT = ((\(alias).holder_token >> 32) & 4294967295) AND l.objid::BIGINT = (\(alias).holder_token & 4294967295))
        """
    }

    func tryLock(account: String, key: String) async throws -> KeyLock? {
        let id = Self.lockID(account: account, key: key)
        let (connection, generation, pid, token) = try await self.connection()
        let (logger, state) = (self.logger, self.state)
        // A claim is free when nobody holds it, or its holder died; this connection's own is taken once more. The
        // query runs on as a task of its own: given up on after the timeout, it may still take the claim, which is then
        // given back (the caller holds no lock to let go, and a claim counted once too often would keep the key from
        // every other relay until this connection dropped).
        let claim = Task(executorPreference: PostgresCatalog.executor) {
            let rows = try await connection.query(
                """
                INSERT INTO key_claim AS c (lock_id, holder_pid, holder_token, holds) VALUES (\(id), \(pid), \(token), 1)
                ON CONFLICT (lock_id) DO UPDATE SET holds = CASE WHEN c.holder_token = EXCLUDED.holder_token THEN c.holds + 1 ELSE 1 END,
                    holder_pid = EXCLUDED.holder_pid, holder_token = EXCLUDED.holder_token
                WHERE c.holder_token = EXCLUDED.holder_token OR NOT \(unescaped: Self.holderLive("c"))
                RETURNING holds
                """,
                logger: logger
            ).collect()
            Self.answered(state, generation)
            return !rows.isEmpty
        }
        let lock = KeyLock(id: id, generation: generation)
        do {
            let taken = try await PostgresCatalog.mappingErrors { try await PostgresCatalog.outcome(of: claim, within: self.timeout) }
            return taken ? lock : nil
        } catch {
            Task(executorPreference: PostgresCatalog.executor) {
                if case .success(true) = await claim.result { self.unlock(lock) }
            }
            throw error
        }
    }

    private static func answered(_ state: NIOLockedValueBox<State>, _ generation: Int) {
        state.withLockedValue { state in
            if state.generation == generation { state.lastAnswer = .now }
        }
    }

    func unlock(_ lock: KeyLock) {
        let current = self.state.withLockedValue { state -> (PostgresConnection, Int64)? in
            guard state.generation == lock.generation, let connection = state.connection else { return nil }
            return (connection, state.token)
        }
        guard let (connection, token) = current else { return }
        let (logger, state) = (self.logger, self.state)
        // The key's reservation, if any, stays: held by no lock, it counts for nothing, and the account's next
        // admission drops it (a DELETE here could take a newer upload's reservation of the key, made under the same
        // lock taken again).
        Task(executorPreference: PostgresCatalog.executor) {
            do {
                _ = try await connection.query(
                    """
                    WITH gone AS (DELETE FROM key_claim WHERE lock_id = \(lock.id) AND holder_token = \(token) AND holds = 1 RETURNING 1)
                    UPDATE key_claim SET holds = holds - 1 WHERE lock_id = \(lock.id) AND holder_token = \(token) AND holds > 1
                    """,
                    logger: logger
                ).collect()
                Self.answered(state, lock.generation)
            } catch {
                // The connection is going: the lock goes with it.
                logger.debug("could not release a key lock", metadata: ["error": "\(error)"])
            }
        }
    }

    /// The advisory locks held in this database, by any connection (tests: one per relay connection, whatever it
    /// claims).
    func advisoryLocksInDatabase() async throws -> Int {
        try await self.count(
            """
            SELECT COUNT(*)::BIGINT AS n FROM pg_locks WHERE locktype = 'advisory'
                AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
            """
        )
    }

    /// How many times the key's claim is taken, by whichever connection holds it (tests).
    func holds(account: String, key: String) async throws -> Int {
        try await self.count("SELECT COALESCE(SUM(holds), 0)::BIGINT AS n FROM key_claim WHERE lock_id = \(Self.lockID(account: account, key: key))")
    }

    private func count(_ query: PostgresQuery) async throws -> Int {
        let (connection, _, _, _) = try await self.connection()
        let logger = self.logger
        return try await PostgresCatalog.mapped(timeout: self.timeout) {
            let rows = try await connection.query(query, logger: logger).collect()
            return Int(try rows.first?.makeRandomAccess()["n"].decode(Int64.self) ?? 0)
        }
    }

    func whenLost(_ handler: @escaping @Sendable (Int) -> Void) {
        self.state.withLockedValue { $0.lost = handler }
    }

    /// Closes the connection, and with it every lock.
    func shutdown() {
        let connection = self.state.withLockedValue { state -> PostgresConnection? in
            state.shutDown = true
            defer { state.connection = nil }
            return state.connection
        }
        guard let connection else { return }
        // Held until closed: a connection must not go unclosed.
        let closing: EventLoopFuture<Void> = connection.close()
        closing.whenComplete { _ in _ = connection }
    }

    /// The connection claims are taken on, with its generation, server process and liveness lock; made when there is
    /// none.
    private func connection() async throws -> (PostgresConnection, generation: Int, pid: Int32, token: Int64) {
        try await self.connecting.withLock {
            let current = self.state.withLockedValue { state -> (PostgresConnection, Int, Int32, Int64)? in
                guard let connection = state.connection, !connection.isClosed, let pid = state.pid else { return nil }
                return (connection, state.generation, pid, state.token)
            }
            if let current { return current }
            if self.state.withLockedValue({ $0.shutDown }) { throw CatalogError.unavailable("the relay is stopping") }
            let (configuration, logger) = (self.configuration, self.logger)
            // Random, so that no other relay's connection, nor a later one of this relay, ever holds the same.
            let token = Int64.random(in: Int64.min...Int64.max)
            let (connection, pid) = try await PostgresCatalog.mapped(timeout: self.timeout) {
                let connection = try await PostgresConnection.connect(
                    on: MultiThreadedEventLoopGroup.singleton.next(), configuration: configuration, id: 1, logger: logger
                )
                do {
                    let rows = try await connection.query(
                        "SELECT pg_backend_pid() AS pid, pg_try_advisory_lock(\(token)) AS live", logger: logger
                    ).collect()
                    guard let row = rows.first?.makeRandomAccess(), try row["live"].decode(Bool.self) else {
                        throw CatalogError.unavailable("the lock connection could not take its liveness lock")
                    }
                    let pid = try row["pid"].decode(Int32.self)
                    // Claims whose holders died hold nothing: gone, so the table holds only what is held (a claim
                    // wanted again is taken over without this).
                    // Only the very version found dead: a claim another relay takes over meanwhile (its holder live)
                    // fails the token's match when the DELETE re-reads it (an anti-join alone would not look again).
                    try await connection.query(
                        """
                        WITH dead AS (SELECT lock_id, holder_token FROM key_claim c WHERE NOT \(unescaped: Self.holderLive("c")))
                        DELETE FROM key_claim k USING dead WHERE k.lock_id = dead.lock_id AND k.holder_token = dead.holder_token
                        """,
                        logger: logger
                    )
                    return (connection, pid)
                } catch {
                    try? await connection.close()
                    throw error
                }
            }
            let generation = self.state.withLockedValue { state -> Int in
                state.generation += 1
                state.connection = connection
                state.pid = pid
                state.token = token
                state.lastAnswer = .now
                return state.generation
            }
            connection.closeFuture.whenComplete { _ in
                let lost = self.state.withLockedValue { state -> (@Sendable (Int) -> Void)? in
                    guard state.generation == generation, !state.shutDown else { return nil }
                    state.connection = nil
                    return state.lost
                }
                guard let lost else { return }
                logger.error("the connection holding this relay's key locks dropped: its uploads stop, to go on from their durable bytes")
                lost(generation)
            }
            self.watch(connection, generation: generation)
            return (connection, generation, pid, token)
        }
    }

    /// Asks `connection` every ``LockHeartbeat/interval`` while it is this relay's lock connection, and closes it once
    /// it answered nothing, neither the heartbeat nor any other query, for ``LockHeartbeat/timeout`` (its close tells
    /// ``whenLost(_:)``). Queries queued behind others are slow, not gone: any answer counts.
    private func watch(_ connection: PostgresConnection, generation: Int) {
        let (heartbeat, logger, state) = (self.heartbeat, self.logger, self.state)
        Task(executorPreference: PostgresCatalog.executor) {
            while true {
                try? await Task.sleep(for: heartbeat.interval)
                guard !connection.isClosed, state.withLockedValue({ $0.generation == generation && !$0.shutDown }) else { return }
                let silent = await withTaskGroup(of: Bool?.self) { group in
                    // true: answered; false: failed (the connection closed); nil: a deadline passed.
                    group.addTask { (try? await connection.query("SELECT 1", logger: logger).collect()) != nil }
                    var deadline = ContinuousClock.now + heartbeat.timeout
                    while true {
                        group.addTask { [deadline] in
                            try? await Task.sleep(until: deadline)
                            return nil
                        }
                        guard let next = await group.next() else { return false }
                        if next != nil {
                            group.cancelAll()
                            return false
                        }
                        let last = state.withLockedValue { $0.lastAnswer }
                        if last + heartbeat.timeout > .now {
                            deadline = last + heartbeat.timeout  // another query answered meanwhile: slow, not gone
                            continue
                        }
                        // A query on a connection that went silent ends only with the connection: closed first.
                        _ = connection.close() as EventLoopFuture<Void>
                        group.cancelAll()
                        return true
                    }
                }
                if silent {
                    logger.error("the connection holding this relay's key locks answered nothing for \(heartbeat.timeout): closed")
                    return
                }
                guard !connection.isClosed else { return }  // its close told the claims
                Self.answered(state, generation)
            }
        }
    }
}
