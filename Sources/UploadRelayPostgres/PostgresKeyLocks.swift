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

/// Key locks across the relays sharing one PostgreSQL catalog: session-level advisory locks, all taken on one
/// connection of the relay's own, so that they go when the relay dies (PostgreSQL releases a session's locks when its
/// connection drops) and never by a timeout.
///
/// Advisory locks are reentrant within their session: this relay's own claims (``KeyClaims``) keep a key to one of its
/// uploads at a time, and each lock taken is let go exactly once, whatever order the two reach the server in.
///
/// The size an admitted upload announced is recorded under its key's lock (`open_reservation`, with ``backendPID``):
/// other relays count it against the account's quota while this connection holds the key's lock, and no longer once it
/// is let go or the connection drops (``PostgresCatalog/admit(account:key:announced:growth:active:)``).
final class PostgresKeyLocks: KeyLocks, @unchecked Sendable {
    private struct State {
        var connection: PostgresConnection?
        /// The server process of `connection`: the one that holds its locks in `pg_locks`.
        var pid: Int32?
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
            throw CatalogFailure(
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

    /// The lock number of a key: the first 8 bytes of the SHA-1 of account, NUL, key. Two keys that share one only
    /// wait for each other.
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

    func tryLock(account: String, key: String) async throws -> KeyLock? {
        let id = Self.lockID(account: account, key: key)
        let (connection, generation) = try await self.connection()
        let (logger, state) = (self.logger, self.state)
        let taken = try await PostgresCatalog.mapped(timeout: self.timeout) {
            let rows = try await connection.query("SELECT pg_try_advisory_lock(\(id)) AS taken", logger: logger).collect()
            Self.answered(state, generation)
            return try rows.first?.makeRandomAccess()["taken"].decode(Bool.self) ?? false
        }
        return taken ? KeyLock(id: id, generation: generation) : nil
    }

    private static func answered(_ state: NIOLockedValueBox<State>, _ generation: Int) {
        state.withLockedValue { state in
            if state.generation == generation { state.lastAnswer = .now }
        }
    }

    func unlock(_ lock: KeyLock) {
        guard let connection = self.state.withLockedValue({ $0.generation == lock.generation ? $0.connection : nil }) else { return }
        let (logger, state) = (self.logger, self.state)
        // The key's reservation, if any, stays: held by no lock, it counts for nothing, and the account's next
        // admission drops it (a DELETE here could take a newer upload's reservation of the key, made under the same
        // lock taken again).
        Task(executorPreference: PostgresCatalog.executor) {
            do {
                _ = try await connection.query("SELECT pg_advisory_unlock(\(lock.id))", logger: logger)
                Self.answered(state, lock.generation)
            } catch {
                // The connection is going: the lock goes with it.
                logger.debug("could not release a key lock", metadata: ["error": "\(error)"])
            }
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

    /// The connection locks are taken on, made when there is none.
    private func connection() async throws -> (PostgresConnection, Int) {
        try await self.connecting.withLock {
            let current = self.state.withLockedValue { state -> (PostgresConnection, Int)? in
                guard let connection = state.connection, !connection.isClosed else { return nil }
                return (connection, state.generation)
            }
            if let current { return current }
            if self.state.withLockedValue({ $0.shutDown }) { throw CatalogFailure("the relay is stopping") }
            let (configuration, logger) = (self.configuration, self.logger)
            let (connection, pid) = try await PostgresCatalog.mapped(timeout: self.timeout) {
                let connection = try await PostgresConnection.connect(
                    on: MultiThreadedEventLoopGroup.singleton.next(), configuration: configuration, id: 1, logger: logger
                )
                do {
                    let rows = try await connection.query("SELECT pg_backend_pid() AS pid", logger: logger).collect()
                    return (connection, try rows.first?.makeRandomAccess()["pid"].decode(Int32.self))
                } catch {
                    try? await connection.close()
                    throw error
                }
            }
            let generation = self.state.withLockedValue { state -> Int in
                state.generation += 1
                state.connection = connection
                state.pid = pid
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
            return (connection, generation)
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
