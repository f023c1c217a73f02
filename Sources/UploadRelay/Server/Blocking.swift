import Dispatch
import NIOConcurrencyHelpers

/// Async work run from the relay's blocking side (the store and the catalog protocols block: their callers are the I/O
/// pool's threads, and at startup the main task): the work runs as a task on an executor of its own, never the
/// cooperative pool, which a blocked caller may be part of, and the caller waits for it.
package enum Blocking {
    package static func run<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
        let done = DispatchSemaphore(value: 0)
        let outcome = NIOLockedValueBox<Result<T, any Error>?>(nil)
        Task(executorPreference: Self.executor) {
            let result: Result<T, any Error>
            do {
                result = .success(try await body())
            } catch {
                result = .failure(error)
            }
            outcome.withLockedValue { $0 = result }
            done.signal()
        }
        done.wait()
        switch outcome.withLockedValue({ $0 }) {
        case .success(let value)?: return value
        case .failure(let error)?: throw error
        case nil: throw BlockingError()
        }
    }

    package static let executor = DispatchTaskExecutor()
}

package struct BlockingError: Error, CustomStringConvertible {
    package var description: String { "async work ended without an outcome" }
}

/// Runs tasks' jobs on a concurrent dispatch queue.
package final class DispatchTaskExecutor: TaskExecutor, @unchecked Sendable {
    private let queue = DispatchQueue(label: "upload-relay.blocking", attributes: .concurrent)

    package func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        self.queue.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}
