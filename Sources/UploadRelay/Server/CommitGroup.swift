import NIOConcurrencyHelpers
import UploadProtocol
import CoreMetrics

/// Group commit: the commits of many uploads, from any connection, made durable together. A commit that
/// arrives while a group is under way waits for the next group; each group is one task of the relay's, one call of the
/// injected `committer` (``UploadPolicy/commit(_:)``: one catalog transaction to reserve, one fsync per directory, one
/// transaction to record). Storage hands its commit here and never reaches the policy itself. Nothing waits for a
/// group to fill: when commits come one at a time, each is a group of one, as fast as before.
///
/// RESULT still means durable: each upload's commit returns only after its group's records are durable.
final class CommitGroup: Sendable {
    typealias Outcome = Result<Frame.Result.Status, UploadPolicy.Refusal>

    private struct Waiting {
        var request: UploadPolicy.CommitRequest
        var continuation: CheckedContinuation<Outcome, Never>
    }

    private struct State {
        var waiting: [Waiting] = []
        var running = false
        var groups = 0
        var submitted = 0
    }

    private let state = NIOLockedValueBox(State())
    /// The most commits in one group.
    let maxGroup: Int
    private let executor: RelayExecutor
    private let metrics: RelayMetrics
    /// Commits one group, an outcome per request, in order.
    private let committer: @Sendable ([UploadPolicy.CommitRequest]) async -> [Outcome]

    init(
        maxGroup: Int, executor: RelayExecutor, metrics: RelayMetrics,
        committer: @escaping @Sendable ([UploadPolicy.CommitRequest]) async -> [Outcome]
    ) {
        self.maxGroup = max(1, maxGroup)
        self.executor = executor
        self.metrics = metrics
        self.committer = committer
    }

    /// How many groups have run (for tests and figures).
    var groupsRun: Int { self.state.withLockedValue { $0.groups } }
    /// How many commits have been asked for (for tests).
    var submitted: Int { self.state.withLockedValue { $0.submitted } }

    /// Commits `request` with the next group; returns once the outcome is durable.
    func commit(_ request: UploadPolicy.CommitRequest) async -> Outcome {
        await withCheckedContinuation { continuation in
            let start = self.state.withLockedValue { state -> Bool in
                state.waiting.append(Waiting(request: request, continuation: continuation))
                state.submitted += 1
                guard !state.running else { return false }
                state.running = true
                return true
            }
            guard start else { return }
            self.executor.task { await self.drain() }
        }
    }

    /// Runs groups until none is waiting.
    private func drain() async {
        while true {
            let group = self.state.withLockedValue { state -> [Waiting] in
                let group = Array(state.waiting.prefix(self.maxGroup))
                state.waiting.removeFirst(group.count)
                if group.isEmpty { state.running = false } else { state.groups += 1 }
                return group
            }
            guard !group.isEmpty else { return }
            let start = ContinuousClock.now
            let results = await self.committer(group.map(\.request))
            self.metrics.took("store", "commit_group", since: start)
            self.metrics.commitGroupSize.record(group.count)
            for case .failure(let refusal) in results where refusal.code == .storageError {
                self.metrics.failed("store", "commit")
            }
            for (waiting, result) in zip(group, results) { waiting.continuation.resume(returning: result) }
        }
    }
}
