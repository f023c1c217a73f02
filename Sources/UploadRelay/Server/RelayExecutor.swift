import NIOCore
import NIOPosix

/// Where the relay's tasks run (an OPEN's lookup, an upload's storage steps, a commit group, the probes, the hooks):
/// the threads of the relay's I/O pool, never Swift's shared cooperative pool. The relay's own work never blocks a
/// thread (the catalogs and stores are async; the local store's system calls hop to the pool), but a process that
/// embeds the relay (tests, `upload-joined`) may block the shared pool's few threads: the relay answers on regardless.
///
/// A job enqueued once the pool has stopped runs at once on the enqueuing thread, so that no task is left suspended
/// for ever while the relay winds down.
package final class RelayExecutor: TaskExecutor, @unchecked Sendable {
    private let pool: NIOThreadPool
    private let thread: PoolThread

    package init(pool: NIOThreadPool) {
        self.pool = pool
        self.thread = PoolThread(pool)
    }

    /// An executor on a pool of its own, started and never stopped: for a backend's background tasks (a database
    /// client's connection pool, its lock connection's heartbeat), which must go on whatever the process does with
    /// Swift's shared cooperative pool. Their jobs never block.
    package static func dedicated(threads: Int = System.coreCount) -> RelayExecutor {
        let pool = NIOThreadPool(numberOfThreads: max(1, threads))
        pool.start()
        return RelayExecutor(pool: pool)
    }

    package func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = self.asUnownedTaskExecutor()
        let thread = self.thread
        self.pool.submit { state in
            // Cancelled: the pool stopped, and this is the enqueuing thread, not one of the pool's.
            if case .active = state { thread.mark() }
            job.runSynchronously(on: executor)
        }
    }
}

/// Which pool, if any, the current thread belongs to, as far as the relay's tasks ran on it: a system call of the
/// relay's made on a thread of the pool it would hop to runs where it is (``NIOThreadPool/runBlocking(_:)``).
package final class PoolThread: Sendable {
    private let pool: ObjectIdentifier
    private static let current = ThreadSpecificVariable<PoolThread>()

    init(_ pool: NIOThreadPool) {
        self.pool = ObjectIdentifier(pool)
    }

    /// The current thread is one of this pool's.
    func mark() {
        if Self.current.currentValue !== self { Self.current.currentValue = self }
    }

    /// Whether the current thread is one of a relay's pools' (a task of the relay's runs on it): a short blocking call,
    /// a catalog's query on its own connection, say, may run here rather than hop to a thread of its own and back.
    package static var mayBlock: Bool { Self.current.currentValue != nil }

    static func isOn(_ pool: NIOThreadPool) -> Bool {
        Self.current.currentValue?.pool == ObjectIdentifier(pool)
    }
}

extension NIOThreadPool {
    /// `body`, a blocking system call, on this pool: where it is when the caller runs on one of the pool's threads (a
    /// task of the relay's, ``RelayExecutor``), else on a thread of the pool. Each hop between threads cost a wake-up
    /// and a switch, several per small file on each of the relay's steps.
    package func runBlocking<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        if PoolThread.isOn(self) { return try body() }
        return try await self.runIfActive(body)
    }
}

extension RelayExecutor {
    /// Runs `body` as a task of the relay's; its outcome is delivered on `eventLoop`.
    package func task<T: Sendable>(on eventLoop: any EventLoop, _ body: @escaping @Sendable () async throws -> T) -> EventLoopFuture<T> {
        let promise = eventLoop.makePromise(of: T.self)
        Task(executorPreference: self) {
            do {
                promise.succeed(try await body())
            } catch {
                promise.fail(error)
            }
        }
        return promise.futureResult
    }

    /// Runs `body` as a task of the relay's.
    package func task(_ body: @escaping @Sendable () async -> Void) {
        Task(executorPreference: self) { await body() }
    }
}
