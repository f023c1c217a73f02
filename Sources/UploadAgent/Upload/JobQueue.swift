import NIOConcurrencyHelpers
import UploadChecksums
import UploadProtocol

/// The jobs of one run, shared by its successive connections.
final class JobQueue: Sendable {
    private struct State {
        var waiting: [UploadJob]
        var active: Int = 0
        var finished: [UploadResult] = []
    }

    private let state: NIOLockedValueBox<State>
    let total: Int
    /// Told whenever a job goes back to wait or finishes: the connection now running, which may have nothing else to
    /// wake it (a job's preparation on an earlier connection can end after that connection closed).
    private let listener = NIOLockedValueBox<Listener?>(nil)

    /// The closure, held in a class: a closure stored directly in the generic box is re-wrapped in two conversion
    /// thunks at every locked access, and the chain grew until releasing it overflowed the stack (soak seed 5511
    /// round 16: SIGSEGV at exit after 1,817 files).
    private final class Listener: Sendable {
        let call: @Sendable () -> Void
        init(_ call: @escaping @Sendable () -> Void) { self.call = call }
    }

    /// Sets (or clears) what is told when a job goes back to wait or finishes. It must not call back into the queue's
    /// caller synchronously: hop to the listener's event loop.
    func setListener(_ listener: (@Sendable () -> Void)?) {
        let boxed = listener.map(Listener.init)
        self.listener.withLockedValue { $0 = boxed }
    }

    init(_ jobs: [UploadJob]) {
        self.state = NIOLockedValueBox(State(waiting: jobs))
        self.total = jobs.count
    }

    /// The next job to start, if any.
    func next() -> UploadJob? {
        self.state.withLockedValue { state in
            guard !state.waiting.isEmpty else { return nil }
            state.active += 1
            return state.waiting.removeFirst()
        }
    }

    /// A job goes back to wait for the next connection (or a free stream).
    func requeue(_ job: UploadJob) {
        self.state.withLockedValue { state in
            state.active -= 1
            state.waiting.insert(job, at: 0)
        }
        self.listener.withLockedValue { $0 }?.call()
    }

    func finished(_ result: UploadResult) {
        self.state.withLockedValue { state in
            state.active -= 1
            state.finished.append(result)
        }
        self.listener.withLockedValue { $0 }?.call()
    }

    var isDone: Bool { self.state.withLockedValue { $0.waiting.isEmpty && $0.active == 0 } }
    var results: [UploadResult] { self.state.withLockedValue { $0.finished } }

    /// Gives up on every job still waiting.
    func failWaiting(_ message: String) -> [UploadResult] {
        self.state.withLockedValue { state in
            let results = state.waiting.map { job in
                job.finish(.failed, sha1: job.knownSHA1?.hex ?? "", error: job.lastError.map { "\(message); last error: \($0)" } ?? message)
            }
            state.waiting.removeAll()
            state.finished += results
            return results
        }
    }
}
