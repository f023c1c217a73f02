import FoundationEssentials
import NIOConcurrencyHelpers

/// `upload-agent send` through the persistent queue: files are recorded before a byte moves, so a `send` that is
/// killed resumes where the relay's durable offset stands the next time any agent runs for that relay. When another
/// process already uploads for the same relay and account (a `watch`, another `send`), the files are handed to it
/// through the queue and this one waits for them: the same work is never done twice. It takes over if that process
/// ends first.
public enum QueuedSend {
    /// Uploads `items`, returning their results (in the order they finished). `onHandOver` is told when the files
    /// went to another running agent.
    public static func run(
        _ items: consuming [UploadItem], uploader: Uploader, store: AgentStateStore, pollInterval: Duration = .milliseconds(200),
        onHandOver: @Sendable (Int) -> Void = { _ in }, onEvent: @escaping @Sendable (UploadEvent) -> Void
    ) async throws -> [UploadResult] {
        let configuration = uploader.configuration
        let target = AgentStateStore.target(of: configuration)
        // Once recorded, the files are rows in the database: their items are let go (10,000 photos are megabytes).
        var files: [UploadItem] = []
        var streams: [UploadItem] = []
        for item in items {
            if item.source is FileSource { files.append(item) } else { streams.append(item) }
        }
        let keys = Set(files.map(\.key) + streams.map(\.key))
        var handed: [Int64]? = nil
        // The group holds, at most, the upload of the streams of a send whose files went to another agent.
        return try await withThrowingTaskGroup(of: [UploadResult].self) { group in
            while true {
                if let lock = try RunnerLock.tryAcquire(store: store, target: target) {
                    let runner = QueueRunner(uploader: uploader, store: store, lock: lock, keepResults: true)
                    try runner.loadPending()
                    if handed == nil {
                        try runner.enqueue(files + streams, skipUnchanged: false)
                        files = []
                    }
                    let reported = NIOLockedValueBox(Set<String>())
                    try await runner.run(service: false) { event in
                        // Items other runs left in the queue go up too, but this command reports its own, once each: another
                        // send of the same files meanwhile queues them again, and this runner takes them up again.
                        if case .finished(let result) = event {
                            guard keys.contains(result.key), reported.withLockedValue({ $0.insert(result.key).inserted }) else { return }
                        }
                        onEvent(event)
                    }
                    // Shared, not copied, when every result is this command's, once (10,000 results are megabytes).
                    let all = runner.results
                    var results =
                        all.allSatisfy({ keys.contains($0.key) }) && Set(all.map(\.key)).count == all.count
                        ? all : Self.firstOfEach(all.filter { keys.contains($0.key) })
                    if let handed {
                        // Files handed to a runner that ended before they did: this run finished the rest.
                        let reported = Set(results.map(\.key))
                        results = try store.items(ids: handed).map(Self.result)
                        for result in results where !reported.contains(result.key) { onEvent(.finished(result)) }
                        results += try await group.next() ?? []
                    }
                    return results
                }
                if handed == nil {
                    let entries = files.compactMap { QueueEntry(item: $0, configuration: configuration) }
                    let outcomes = try store.enqueue(entries, target: target, skipUnchanged: false, external: true)
                    handed = outcomes.map { outcome in
                        switch outcome {
                        case .queued(let id), .alreadyQueued(let id), .unchanged(let id): return id
                        }
                    }
                    files = []
                    onHandOver(entries.count)
                    if !streams.isEmpty {
                        // A stream cannot be handed over: it goes up from here, outside the queue.
                        group.addTask { [streams] in try await uploader.upload(streams, onEvent: onEvent) }
                    }
                }
                let rows = try store.items(ids: handed ?? [])
                if rows.allSatisfy({ [.done, .failed, .dropped].contains($0.status) }) {
                    for row in rows { onEvent(.finished(Self.result(row))) }
                    return rows.map(Self.result) + (try await group.next() ?? [])
                }
                try await Task.sleep(for: pollInterval)
            }
        }
    }

    /// Each key's first result, in order.
    static func firstOfEach(_ results: [UploadResult]) -> [UploadResult] {
        var seen = Set<String>()
        return results.filter { seen.insert($0.key).inserted }
    }

    /// A queue row's outcome, as a run reports it.
    static func result(_ row: QueuedItem) -> UploadResult {
        let status: UploadResult.Status =
            row.status == .done ? (row.outcome == UploadResult.Status.deduplicated.rawValue ? .deduplicated : .stored) : .failed
        var result = UploadResult(
            key: row.key, path: row.path, bytes: row.size ?? 0, sha1: row.sha1 ?? "", status: status, sentBytes: row.sentBytes,
            hashedBytes: row.hashedBytes, error: status == .failed ? row.error ?? "\(row.status.rawValue)" : nil
        )
        // The database keeps the words of a failure, not its code.
        if status == .failed { result.errorCode = UploadResult.ErrorCode.failed }
        return result
    }
}
