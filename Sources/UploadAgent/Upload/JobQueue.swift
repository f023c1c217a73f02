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
    }

    func finished(_ result: UploadResult) {
        self.state.withLockedValue { state in
            state.active -= 1
            state.finished.append(result)
        }
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
