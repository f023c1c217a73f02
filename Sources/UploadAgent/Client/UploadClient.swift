import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// Uploads from any ``BlobSource`` with async/await: what an app embeds instead of running `upload-agent`.
///
/// A client keeps at most one TLS connection to its relay, opened when there is work and closed when there is none,
/// and multiplexes every upload given to it on that connection (``AgentConfiguration/concurrency`` at once, the rest
/// in order). A broken link is retried with backoff for ``AgentConfiguration/retryFor`` and every upload resumes from
/// the relay's durable offset; a source that becomes invalid is reopened (``BlobSource/reopen()``).
///
/// ```swift
/// let client = UploadClient(configuration: AgentConfiguration(relayHost: "relay.example", relayPort: 7443, token: token, caPath: nil))
/// let upload = client.upload(FileSource(path: "/data/clip.mp4"), key: "clips/clip.mp4")
/// for await progress in upload.progress {
///     print(progress.acknowledged, "of", progress.size ?? 0)
/// }
/// let result = try await upload.result  // throws UploadFailure when the relay did not store it
/// try await client.shutdown()
/// ```
public final class UploadClient: Sendable {
    public let configuration: AgentConfiguration
    private let uploader: Uploader
    private let group: any EventLoopGroup
    private let ownsGroup: Bool
    private let state = NIOLockedValueBox(State())

    private struct State {
        /// The queue of the run now going, nil when none runs (the next upload starts one).
        var queue: JobQueue? = nil
        var run: Task<Void, Never>? = nil
        var uploads: [String: Registration] = [:]
        var shutDown = false
    }

    /// One upload under way: where its progress and its result go.
    private struct Registration {
        var progress: UploadProgress
        let continuation: AsyncStream<UploadProgress>.Continuation
        let promise: EventLoopPromise<UploadResult>
    }

    /// A client on its own event loop thread, or on `group` (which the caller then shuts down after ``shutdown()``).
    public init(configuration: AgentConfiguration, group: (any EventLoopGroup)? = nil, logger: Logger = Logger(label: "upload-agent")) {
        self.configuration = configuration
        self.ownsGroup = group == nil
        self.group = group ?? MultiThreadedEventLoopGroup(numberOfThreads: 1)
        self.uploader = Uploader(configuration: configuration, group: self.group, logger: logger)
    }

    /// Uploads `source` under `key`. `overwrite` and `dedup` default to the configuration's.
    public func upload(_ source: any BlobSource, key: String, overwrite: Bool? = nil, dedup: Bool? = nil) -> Upload {
        self.upload(UploadItem(key: key, displayPath: source.displayName, source: source, overwrite: overwrite, dedup: dedup))
    }

    /// Uploads one item. Keys are unique among the uploads under way in one client: a second upload of a key still
    /// going fails at once.
    public func upload(_ item: UploadItem) -> Upload {
        let (stream, continuation) = AsyncStream.makeStream(of: UploadProgress.self, bufferingPolicy: .bufferingNewest(1))
        let promise = self.group.any().makePromise(of: UploadResult.self)
        let upload = Upload(key: item.key, progress: stream, result: promise.futureResult, client: self)
        let refusal: String? = self.state.withLockedValue { state in
            if state.shutDown { return "the upload client was shut down" }
            if state.uploads[item.key] != nil { return "an upload of \"\(item.key)\" is already under way in this client" }
            state.uploads[item.key] = Registration(
                progress: UploadProgress(key: item.key), continuation: continuation, promise: promise
            )
            let queue = state.queue ?? self.startRun(&state)
            queue.add([UploadJob(item: item)])
            return nil
        }
        if let refusal {
            continuation.finish()
            promise.succeed(.failed(key: item.key, path: item.displayPath, error: refusal))
        }
        return upload
    }

    /// Records files and directories (walked as `upload-agent send` walks them; `prefix` goes before every key) in the
    /// persistent queue `store` keeps for this client's relay and token. They go up even after this process ended:
    /// a running `upload-agent watch` or `send` for the same relay and token takes them within a second, or the next
    /// one to start does. Returns what became of each (queued, already queued, unchanged since it was stored); each path
    /// not queued (a symbolic link unless `followSymlinks`, a name no key may have, ...) goes to `notQueued`, with why.
    public func enqueue(
        paths: [String], prefix: String? = nil, followSymlinks: Bool = false, into store: AgentStateStore,
        notQueued: (UploadResult) -> Void = { _ in }
    ) throws -> [EnqueueOutcome] {
        let plan = try ItemPlanner.plan(
            paths: paths.filter { $0 != "-" }, prefix: prefix, stdinName: nil, limits: self.configuration.limits, followSymlinks: followSymlinks
        )
        plan.results.forEach(notQueued)
        let entries = plan.items.compactMap { QueueEntry(item: $0, configuration: self.configuration) }
        return try store.enqueue(entries, target: AgentStateStore.target(of: self.configuration), skipUnchanged: false, external: true)
    }

    /// Stops `key`'s upload: nothing of it is committed, and its result is a failure that says it was cancelled.
    public func cancel(key: String) {
        let reason = "the upload of \"\(key)\" was cancelled: nothing was committed"
        let (queue, registered) = self.state.withLockedValue { ($0.queue, $0.uploads[key] != nil) }
        guard registered else { return }
        if let job = queue?.drop(key: key, reason: reason) {
            // It had not started: it ends here. One that started ends when its stream is cancelled.
            self.handle(.finished(job.finish(.failed, sha1: "", error: reason)))
        }
    }

    /// Cancels every upload under way, waits for the connection to end, and releases the event loop (when the client
    /// made its own).
    public func shutdown() async throws {
        let (queue, run, keys): (JobQueue?, Task<Void, Never>?, [String]) = self.state.withLockedValue { state in
            state.shutDown = true
            return (state.queue, state.run, Array(state.uploads.keys))
        }
        for key in keys { self.cancel(key: key) }
        queue?.stop()
        await run?.value
        self.failAll("the upload client was shut down")
        if self.ownsGroup { try await self.group.shutdownGracefully() }
    }

    /// Starts a run for a new queue (under the state's lock).
    private func startRun(_ state: inout State) -> JobQueue {
        let queue = JobQueue([], keepResults: false)
        state.queue = queue
        let uploader = self.uploader
        state.run = Task {
            var failure = "the upload client stopped"
            do {
                try await uploader.run(queue, service: true) { event in self.handle(event) }
            } catch {
                failure = "\(error)"
            }
            self.state.withLockedValue { state in
                if state.queue === queue { state.queue = nil }
            }
            // Retrying cannot help (a revoked token, the wrong CA): what is left fails; the next upload tries afresh.
            self.failAll(failure)
        }
        return queue
    }

    private func failAll(_ reason: String) {
        let left: [Registration] = self.state.withLockedValue { state in
            defer { state.uploads.removeAll() }
            return Array(state.uploads.values)
        }
        for registration in left {
            registration.continuation.finish()
            registration.promise.succeed(.failed(key: registration.progress.key, error: reason))
        }
    }

    /// Routes the uploader's events to the uploads they concern.
    private func handle(_ event: UploadEvent) {
        switch event {
        case .connected, .reconnecting, .waiting, .connections:
            return
        case .started(let key, let size, let offset):
            self.update(key) { progress in
                progress.size = size
                progress.acknowledged = offset
                progress.sent = offset
            }
        case .sent(let key, let bytes):
            self.update(key) { $0.sent += UInt64(bytes) }
        case .acknowledged(let key, let offset):
            self.update(key) { $0.acknowledged = offset }
        case .finished(let result):
            guard let registration = self.state.withLockedValue({ $0.uploads.removeValue(forKey: result.key) }) else { return }
            var last = registration.progress
            if result.status != .failed {
                last.size = result.bytes
                last.acknowledged = result.bytes
                last.sent = max(last.sent, result.bytes)
            }
            registration.continuation.yield(last)
            registration.continuation.finish()
            registration.promise.succeed(result)
        }
    }

    private func update(_ key: String, _ body: (inout UploadProgress) -> Void) {
        let update: (UploadProgress, AsyncStream<UploadProgress>.Continuation)? = self.state.withLockedValue { state in
            guard var registration = state.uploads[key] else { return nil }
            body(&registration.progress)
            state.uploads[key] = registration
            return (registration.progress, registration.continuation)
        }
        if let (progress, continuation) = update { continuation.yield(progress) }
    }
}

/// Where one upload stands.
public struct UploadProgress: Hashable, Sendable {
    public var key: String
    /// The blob's size, when known (nil for a stream until it ended).
    public var size: UInt64?
    /// Bytes the relay holds durably: they survive a crash of either side and are never sent again.
    public var acknowledged: UInt64 = 0
    /// How far the agent has sent (the relay may not have acknowledged all of it yet).
    public var sent: UInt64 = 0

    public init(key: String, size: UInt64? = nil, acknowledged: UInt64 = 0, sent: UInt64 = 0) {
        self.key = key
        self.size = size
        self.acknowledged = acknowledged
        self.sent = sent
    }

    /// The durable share of the blob, from 0 to 1; nil while the size is unknown.
    public var fractionAcknowledged: Double? {
        guard let size else { return nil }
        return size == 0 ? 1 : Double(self.acknowledged) / Double(size)
    }
}

/// An upload under way: its progress as an `AsyncSequence`, then its result.
public struct Upload: Sendable {
    public let key: String
    /// The latest progress each time it moves (older values are dropped when the reader is slower); it ends when the
    /// upload ends. Iterate it from one task only.
    public let progress: AsyncStream<UploadProgress>
    private let future: EventLoopFuture<UploadResult>
    private let client: UploadClient

    init(key: String, progress: AsyncStream<UploadProgress>, result: EventLoopFuture<UploadResult>, client: UploadClient) {
        self.key = key
        self.progress = progress
        self.future = result
        self.client = client
    }

    /// How the upload ended: stored or deduplicated. Throws ``UploadFailure`` when it failed.
    public var result: UploadResult {
        get async throws {
            let result = try await self.future.get()
            guard result.status != .failed else { throw UploadFailure(result: result) }
            return result
        }
    }

    /// How the upload ended, failures included, without throwing.
    public var outcome: UploadResult {
        get async {
            // The promise is only ever succeeded.
            (try? await self.future.get()) ?? .failed(key: self.key, error: "no result")
        }
    }

    /// Stops the upload; ``result`` then throws.
    public func cancel() {
        self.client.cancel(key: self.key)
    }

}

/// An upload the relay did not store; ``result`` says why (``UploadResult/error``).
public struct UploadFailure: Error, Hashable, Sendable, CustomStringConvertible {
    public var result: UploadResult
    public var description: String { "\(self.result.key): \(self.result.error ?? "failed")" }
}
