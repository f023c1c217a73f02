import Dispatch
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

    package init(pool: NIOThreadPool) {
        self.pool = pool
    }

    package func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = self.asUnownedTaskExecutor()
        self.pool.submit { _ in job.runSynchronously(on: executor) }
    }
}

extension RelayServices {
    /// Runs `body` as a task of the relay's (``RelayExecutor``); its outcome is delivered on `eventLoop`.
    package func task<T: Sendable>(on eventLoop: any EventLoop, _ body: @escaping @Sendable () async throws -> T) -> EventLoopFuture<T> {
        let promise = eventLoop.makePromise(of: T.self)
        Task(executorPreference: self.executor) {
            do {
                promise.succeed(try await body())
            } catch {
                promise.fail(error)
            }
        }
        return promise.futureResult
    }

    /// Runs `body` as a task of the relay's (``RelayExecutor``).
    package func task(_ body: @escaping @Sendable () async -> Void) {
        Task(executorPreference: self.executor) { await body() }
    }
}

/// Runs tasks' jobs on a concurrent dispatch queue of its own: for a backend's background tasks (a database client's
/// connection pool, its lock connection's heartbeat), which must go on whatever the process does with Swift's shared
/// cooperative pool. The jobs never block.
package final class QueueExecutor: TaskExecutor, @unchecked Sendable {
    private let queue: DispatchQueue

    package init(label: String) {
        self.queue = DispatchQueue(label: label, attributes: .concurrent)
    }

    package func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = self.asUnownedTaskExecutor()
        self.queue.async { job.runSynchronously(on: executor) }
    }
}
