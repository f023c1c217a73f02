import NIOConcurrencyHelpers
import NIOPosix
import UploadProtocol

/// Group commit: the commits of many uploads, from any connection, made durable together. A commit that
/// arrives while a group is under way waits for the next group; each group is one trip to the I/O thread pool, one
/// catalog transaction to reserve, one fsync per directory, one transaction to record (``UploadPolicy/commit(_:)``).
/// Nothing waits for a group to fill: when commits come one at a time, each is a group of one, as fast as before.
///
/// RESULT still means durable: each upload's completion runs only after its group's records are durable.
final class CommitGroup: Sendable {
    typealias Completion = @Sendable (Result<Frame.Result.Status, UploadPolicy.Refusal>) -> Void

    private struct Waiting {
        var request: UploadPolicy.CommitRequest
        var completion: Completion
    }

    private struct State {
        var waiting: [Waiting] = []
        var running = false
        var groups = 0
    }

    private let state = NIOLockedValueBox(State())
    /// The most commits in one group.
    let maxGroup: Int

    init(maxGroup: Int) {
        self.maxGroup = max(1, maxGroup)
    }

    /// How many groups have run (for tests and figures).
    var groupsRun: Int { self.state.withLockedValue { $0.groups } }

    /// Commits `request` with the next group; `completion` runs on the thread pool once the outcome is durable.
    func submit(_ request: UploadPolicy.CommitRequest, services: RelayServices, completion: @escaping Completion) {
        let start = self.state.withLockedValue { state -> Bool in
            state.waiting.append(Waiting(request: request, completion: completion))
            guard !state.running else { return false }
            state.running = true
            return true
        }
        guard start else { return }
        services.threadPool.submit { poolState in
            self.drain(services: services, active: poolState == .active)
        }
    }

    /// Runs groups until none is waiting. With the pool stopped, every waiting commit is refused, keeping its session.
    private func drain(services: RelayServices, active: Bool) {
        while true {
            let group = self.state.withLockedValue { state -> [Waiting] in
                let group = Array(state.waiting.prefix(self.maxGroup))
                state.waiting.removeFirst(group.count)
                if group.isEmpty { state.running = false } else { state.groups += 1 }
                return group
            }
            guard !group.isEmpty else { return }
            let results: [Result<Frame.Result.Status, UploadPolicy.Refusal>]
            if active {
                let start = ContinuousClock.now
                results = UploadPolicy(services: services).commit(group.map(\.request))
                services.metrics.took("store", "commit_group", since: start)
                services.metrics.commitGroupSize.record(group.count)
                for case .failure(let refusal) in results where refusal.code == .storageError {
                    services.metrics.failed("store", "commit")
                }
            } else {
                let refusal = UploadPolicy.Refusal(code: .internalError, message: "the relay is stopping: nothing was committed", keepSession: true)
                results = group.map { _ in .failure(refusal) }
            }
            for (waiting, result) in zip(group, results) { waiting.completion(result) }
        }
    }
}
