import FoundationEssentials
import Logging
import NIOConcurrencyHelpers
import NIOPosix
import UploadChecksums
import UploadProtocol

/// Uploads a target's persistent queue: the one process that holds the target's ``RunnerLock`` (a `send`, or a
/// `watch` that runs for days). It loads what earlier runs left, takes new items, records every job's progress in the
/// state database (the relay's durable offset with the SHA-1 state there, the hash cache), and follows the pause flag
/// and new items that other processes write.
public final class QueueRunner: Sendable {
    public let store: AgentStateStore
    public let target: String
    private let uploader: Uploader
    private let lock: RunnerLock
    let queue: JobQueue
    private let journal: QueueJournal

    private struct State {
        /// Jobs of this run by row, waiting or active.
        var jobs: [Int64: UploadJob] = [:]
        /// Rows queued again (a newer version of the file) while their job ran: the next job, once that one ends.
        var after: [Int64: UploadItem] = [:]
        /// Rows whose job ended but whose end is not written yet: a look at the database meanwhile still sees them
        /// queued or uploading, and must not start them again.
        var ending: Set<Int64> = []
        /// Why uploads are held, by who holds them ("pause", a condition).
        var holds: [String: String] = [:]
        var generation = -1
        /// A load of more rows is scheduled (whether the database holds rows beyond the window, the queue knows:
        /// ``JobQueue/hasUnloaded``).
        var loading = false

        /// The hold that shows: the first by holder's name.
        var hold: String? { self.holds.sorted { $0.key < $1.key }.map(\.value).first }
    }

    /// The most jobs held in memory (``AgentConfiguration/queueWindow``).
    private let window: Int

    private let state = NIOLockedValueBox(State())

    /// `lock` must be the target's: one runner per target at a time. `keepResults` keeps every finished item's result
    /// in memory (a `send` reports them); a long-running agent leaves them in the database only.
    public init(uploader: Uploader, store: AgentStateStore, lock: RunnerLock, keepResults: Bool) {
        self.store = store
        self.target = AgentStateStore.target(of: uploader.configuration)
        self.uploader = uploader
        self.lock = lock
        self.window = max(1, uploader.configuration.queueWindow)
        let journal = QueueJournal(store: store)
        self.journal = journal
        self.queue = JobQueue([], journal: journal, keepResults: keepResults)
        journal.runner.withLockedValue { $0 = WeakRunner(self) }
    }

    /// Loads what earlier runs left for this target (queued, or uploading when the agent stopped) and the pause flag.
    public func loadPending() throws {
        try self.store.resetUploading(target: self.target)
        try self.store.setHoldReason(nil)
        try self.refresh()
    }

    /// Adds files to the queue (and to this run); other sources are uploaded by this run only, not recorded.
    /// `skipUnchanged` leaves files done before with the same fingerprint alone (watch's scans). Items without their
    /// own overwrite and dedup settings take the uploader's configuration's.
    @discardableResult
    public func enqueue(_ items: [UploadItem], skipUnchanged: Bool, skipChanged: Bool = false) throws -> [EnqueueOutcome] {
        // A thousand at a time: what recording them takes on the side stays small for 100,000 files.
        var outcomes: [EnqueueOutcome] = []
        outcomes.reserveCapacity(items.count)
        var start = items.startIndex
        while start < items.endIndex {
            let end = min(start + Self.enqueueSlice, items.endIndex)
            outcomes += try self.enqueue(items[start..<end], skipUnchanged: skipUnchanged, skipChanged: skipChanged)
            start = end
        }
        return outcomes
    }

    private static let enqueueSlice = 1000

    private func enqueue(_ items: ArraySlice<UploadItem>, skipUnchanged: Bool, skipChanged: Bool) throws -> [EnqueueOutcome] {
        guard !items.isEmpty else { return [] }
        var entries: [QueueEntry] = []
        // By the key's bytes: an NFC and an NFD name are two keys (SPEC §12.2), one under String's equality.
        var byKey: [[UInt8]: UploadItem] = [:]
        var streams: [UploadJob] = []
        for item in items {
            guard let entry = QueueEntry(item: item, configuration: self.uploader.configuration) else {
                streams.append(UploadJob(item: item))
                continue
            }
            entries.append(entry)
            byKey[Array(item.key.utf8)] = item
        }
        let outcomes = try self.store.enqueue(entries, target: self.target, skipUnchanged: skipUnchanged, skipChanged: skipChanged, external: false)
        var jobs = streams
        // Jobs made for an older version of a file that have not started: the new version's job takes their place.
        var replaced: [(old: UploadJob, new: UploadJob)] = []
        let unloaded: Bool = self.state.withLockedValue { state in
            var unloaded = false
            for (entry, outcome) in zip(entries, outcomes) {
                guard var item = byKey[Array(entry.key.utf8)] else { continue }
                item.overwrite = entry.overwrite
                item.dedup = entry.dedup
                item.expectedFingerprint = entry.fingerprint
                switch outcome {
                case .queued(let id), .alreadyQueued(let id):
                    if state.jobs[id] == nil {
                        // Beyond the window, the row waits in the database until jobs end.
                        guard state.jobs.count < self.window else {
                            unloaded = true
                            continue
                        }
                        let job = UploadJob(item: item, queueID: id)
                        state.jobs[id] = job
                        jobs.append(job)
                    } else if case .queued = outcome {
                        state.after[id] = item
                    } else if let running = state.jobs[id], running.item.expectedFingerprint != entry.fingerprint {
                        // A newer version of a file whose job was made for an older one: its job, in the older one's
                        // place if that has not started; else it goes up once that one ends (which refuses the file it
                        // finds changed, or stops on the change).
                        state.after[id] = item
                        replaced.append((running, UploadJob(item: item, queueID: id)))
                    }
                case .unchanged:
                    continue
                }
            }
            return unloaded
        }
        for (old, new) in replaced {
            guard let id = new.queueID else { continue }
            // Under the queue's lock: only a job no connection took is replaced.
            self.state.withLockedValue { state in
                guard state.jobs[id] === old, state.after[id] != nil, self.queue.replaceWaiting(old, with: new) else { return }
                state.jobs[id] = new
                state.after[id] = nil
            }
        }
        self.queue.add(jobs)
        if unloaded { self.queue.setUnloaded(true) }
        return outcomes
    }

    /// The file under `key` was deleted: it leaves the queue, and an upload of it in flight stops without committing.
    public func drop(key: String) throws {
        let id = try self.store.drop(target: self.target, key: key, reason: "removed before its upload finished: not uploaded")
        let reason = "\(key) was removed before its upload finished: not uploaded (nothing on the relay was deleted)"
        if let job = self.queue.drop(key: key, reason: reason), let queueID = job.queueID {
            self.state.withLockedValue { $0.jobs[queueID] = nil }
        }
        if let id { self.state.withLockedValue { _ = $0.after.removeValue(forKey: id) } }
        self.loadMoreIfLow()
    }

    /// Holds uploads for `reason` under the name `holder` ("pause", a condition), or releases that hold with nil.
    public func hold(_ holder: String, _ reason: String?) {
        let combined: String? = self.state.withLockedValue { state in
            state.holds[holder] = reason
            return state.hold
        }
        if combined != self.queue.holdReason {
            self.queue.hold(combined)
            // For `upload-agent status`, from any process.
            try? self.store.setHoldReason(combined)
        }
    }

    /// Holds uploads while `conditions` say so, looking every `interval`, until the task is cancelled.
    public func follow(_ conditions: UploadConditions, every interval: Duration) async {
        guard !conditions.isEmpty else { return }
        while !Task.isCancelled {
            self.hold("conditions", conditions.blocker())
            try? await Task.sleep(for: interval)
        }
    }

    /// Jobs held in memory now, waiting or active (at most the window, and the streams of a `send`).
    var heldJobs: Int { self.state.withLockedValue { $0.jobs.count } }

    /// Why uploads are held now, or nil.
    public var holdReason: String? { self.queue.holdReason }

    /// Picks up what other processes changed since the last look: the pause flag, items queued (`send` handing its
    /// files to this agent, `retry`). Cheap when nothing changed: one row read.
    public func refresh() throws {
        let generation = try self.store.generation()
        guard
            self.state.withLockedValue({ state in
                defer { state.generation = generation }
                return state.generation != generation
            })
        else { return }
        self.hold("pause", try self.store.isPaused() ? "paused (upload-agent resume lets uploads go on)" : nil)
        // Holding the journal's `writing`, as every load: a load that read the rows before a job's end was written, and looked at
        // the jobs after that write, took the finished row for a new one and uploaded it again (a `send --connections 2`
        // reported a key twice).
        try self.journal.onQueueAndWait { try self.load() }
    }

    /// Loads pending rows not in memory, oldest first, up to the window (blocking: never on an event loop). Only holding
    /// the journal's `writing`, so that no end is written between its read of the rows and its look at the jobs.
    private func load() throws {
        let (known, room) = self.state.withLockedValue { ($0.jobs.count + $0.ending.count, self.window - $0.jobs.count) }
        guard room > 0 else { return }
        // The rows already in memory (or ending) are among these at most `known` times: `room` new ones, if there are.
        let limit = known + room
        let rows = try self.store.pending(target: self.target, limit: limit)
        let jobs: [UploadJob] = self.state.withLockedValue { state in
            var jobs: [UploadJob] = []
            for row in rows where jobs.count < room {
                guard state.jobs[row.id] == nil, !state.ending.contains(row.id) else { continue }
                let job = Self.job(for: row)
                state.jobs[row.id] = job
                jobs.append(job)
            }
            return jobs
        }
        self.queue.add(jobs)
        self.queue.setUnloaded(rows.count == limit)
    }

    /// Jobs ended and the window is half empty: more rows come from the database, through the journal (after the
    /// ends it has to write).
    private func loadMoreIfLow() {
        guard self.queue.hasUnloaded else { return }
        let schedule: Bool = self.state.withLockedValue { state in
            guard !state.loading, state.jobs.count <= self.window / 2 else { return false }
            state.loading = true
            return true
        }
        guard schedule else { return }
        self.journal.onQueue {
            do {
                try self.load()
            } catch {
                // The rows stay queued for the next run; this run does not wait for them.
                Platform.writeStandardError("upload-agent: cannot load more of the queue: \(error)\n")
                self.queue.setUnloaded(false)
            }
            self.state.withLockedValue { $0.loading = false }
            self.loadMoreIfLow()
        }
    }

    static func job(for row: QueuedItem) -> UploadJob {
        let source = FileSource(path: row.path, followSymlinks: row.followSymlinks)
        let item = UploadItem(
            key: row.key, displayPath: row.path, source: source, overwrite: row.overwrite, dedup: row.dedup, expectedFingerprint: row.fingerprint
        )
        let job = UploadJob(item: item, queueID: row.id)
        if let bytes = row.sha1State, row.acked > 0, let state = try? SHA1(importing: bytes), state.byteCount == row.acked {
            job.recorded = (row.fingerprint, row.acked, state)
        }
        return job
    }

    /// Uploads until the queue is empty (`service` false) or until ``stop()``, looking for changes from other
    /// processes every `pollInterval`.
    public func run(service: Bool, pollInterval: Duration = .seconds(1), onEvent: @escaping @Sendable (UploadEvent) -> Void) async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await self.journal.run() }
            group.addTask {
                // A look that fails ends the looking; the run goes on with what it has.
                do {
                    while true {
                        try await Task.sleep(for: pollInterval)
                        try self.refresh()
                    }
                } catch {}
            }
            defer { self.journal.flushNow() }
            do {
                try await self.uploader.run(self.queue, service: service, onEvent: onEvent)
            } catch {
                group.cancelAll()
                throw error
            }
            // No more loads from here on; what the journal has pending is written below.
            group.cancelAll()
            try await group.waitForAll()
            guard !service, let reason = self.queue.gaveUpReason else { return }
            // The run gave up (a refused token, no progress): the items still in the database, which it never loaded,
            // get their result too, as those it held did. Rows loaded after the give-up (another process queued more
            // meanwhile) fail here with the rest.
            let code = self.queue.gaveUpCode
            for result in self.queue.failWaiting(reason, code: code) { onEvent(.finished(result)) }
            self.journal.flushNow()
            let known = self.state.withLockedValue { Set($0.jobs.keys).union($0.ending) }
            let rows = try self.store.failPending(target: self.target, reason: "not attempted: \(reason)").filter { !known.contains($0.id) }
            let results = rows.map { row in
                var result = QueuedSend.result(row)
                result.errorCode = code
                return result
            }
            self.queue.record(results)
            for result in results { onEvent(.finished(result)) }
        }
    }

    /// Ends a long-running ``run(service:pollInterval:onEvent:)``: no new upload starts; the connection closes.
    public func stop() {
        self.queue.stop()
        self.queue.hold("stopping")
    }

    /// The results of this run's finished items (kept when `keepResults`).
    public var results: [UploadResult] { self.queue.results }

    /// A job ended: the row's next version, if one was queued meanwhile, goes next.
    fileprivate func ended(_ job: UploadJob) {
        guard let id = job.queueID else { return }
        let next: UploadJob? = self.state.withLockedValue { state in
            state.jobs[id] = nil
            state.ending.insert(id)
            guard let item = state.after.removeValue(forKey: id) else { return nil }
            let next = UploadJob(item: item, queueID: id)
            state.jobs[id] = next
            return next
        }
        if let next { self.queue.add([next]) }
        self.loadMoreIfLow()
    }

    /// The journal wrote these rows' ends.
    fileprivate func written(_ ids: [Int64]) {
        self.state.withLockedValue { state in
            for id in ids { state.ending.remove(id) }
        }
    }
}

struct WeakRunner: Sendable {
    weak var runner: QueueRunner?
    init(_ runner: QueueRunner) { self.runner = runner }
}

/// Records jobs in the state database, coalescing progress: at most one write per `interval` for all jobs together,
/// on the thread pool (never on an event loop) by ``run()``, a child task of the runner's run. Every write and every
/// load of rows holds `writing`, so that no end is written between a load's read of the rows and its look at the jobs.
final class QueueJournal: JobJournal {
    private let store: AgentStateStore
    let runner = NIOLockedValueBox<WeakRunner?>(nil)
    private let writing = NIOLock()
    private let interval: Duration
    private let pool: NIOThreadPool

    /// What ``run()`` does next, in order.
    private enum Work: Sendable {
        /// Writes what is pending once `interval` passed.
        case flush
        /// Runs the body (holding `writing`).
        case run(@Sendable () -> Void)
    }

    private let work: (stream: AsyncStream<Work>, continuation: AsyncStream<Work>.Continuation) = AsyncStream.makeStream()

    private struct Pending {
        var updates: [Int64: AgentStateStore.Progress] = [:]
        var scheduled = false
        /// Per row: the acknowledged offset and time of the last write, and the rate then.
        var rates: [Int64: (acked: UInt64, time: Double, rate: Double)] = [:]
        /// SHA-1s learnt by hashing (dedup), for the hash cache, by fingerprint.
        var hashes: [[UInt8]: String] = [:]
    }

    private let pending = NIOLockedValueBox(Pending())

    init(store: AgentStateStore, interval: Duration = .milliseconds(50), pool: NIOThreadPool = .singleton) {
        self.store = store
        self.interval = interval
        self.pool = pool
    }

    /// Does the writes and loads asked for, in order, until cancelled; what is still pending then is for
    /// ``flushNow()``.
    func run() async {
        for await work in self.work.stream {
            switch work {
            case .flush:
                do {
                    try await Task.sleep(for: self.interval)
                } catch {
                    return
                }
                try? await self.pool.runIfActive { self.writing.withLock { self.flush() } }
            case .run(let body):
                try? await self.pool.runIfActive { self.writing.withLock { body() } }
            }
        }
    }

    private func submit(_ job: UploadJob, _ status: QueuedItem.Status, result: UploadResult? = nil, waiting: String? = nil) {
        guard let id = job.queueID else { return }
        let snapshot = job.knownSHA1 == nil ? job.snapshots[job.acked].map { $0.exportState() } : nil
        let sha1 = job.knownSHA1?.hex ?? result.flatMap { $0.sha1.isEmpty ? nil : $0.sha1 }
        // The version this job was made for: a row queued again meanwhile for a newer one keeps its own record.
        let fingerprint = job.item.checkedFingerprint ?? job.info?.fingerprint
        let progress = AgentStateStore.Progress(
            status: status, size: job.info?.size ?? (result.map { $0.bytes }), fingerprint: fingerprint, sha1: sha1,
            acked: result?.status == .failed || result == nil ? job.acked : (job.info?.size ?? job.bytesRead), sha1State: snapshot,
            sentBytes: job.sentBytes, hashedBytes: job.hashedBytes,
            outcome: result.flatMap { $0.status == .failed ? nil : $0.status.rawValue }, error: result?.error ?? waiting, rate: 0
        )
        self.schedule { $0.updates[id] = progress }
    }

    /// Adds to what the next write records, and schedules it unless one is.
    private func schedule(_ change: (inout Pending) -> Void) {
        let schedule: Bool = self.pending.withLockedValue { pending in
            change(&pending)
            defer { pending.scheduled = true }
            return !pending.scheduled
        }
        if schedule { self.work.continuation.yield(.flush) }
    }

    private func flush() {
        let now = Platform.unixTime()
        var hashes: [([UInt8], String)] = []
        let updates: [(Int64, AgentStateStore.Progress)] = self.pending.withLockedValue { pending in
            pending.scheduled = false
            hashes = pending.hashes.map { ($0.key, $0.value) }
            pending.hashes.removeAll()
            defer { pending.updates.removeAll() }
            return pending.updates.sorted { $0.key < $1.key }.map { id, progress in
                var progress = progress
                if progress.status == .uploading {
                    // Bytes acknowledged per second, smoothed over the writes at least half a second apart.
                    let last = pending.rates[id] ?? (progress.acked, now, 0)
                    let elapsed = now - last.time
                    if elapsed >= 0.5 {
                        let recent = Double(progress.acked - min(progress.acked, last.acked)) / elapsed
                        pending.rates[id] = (progress.acked, now, last.rate == 0 ? recent : (last.rate + recent) / 2)
                    } else if pending.rates[id] == nil {
                        pending.rates[id] = last
                    }
                    progress.rate = pending.rates[id]?.rate ?? 0
                } else {
                    pending.rates[id] = nil
                }
                return (id, progress)
            }
        }
        do {
            try self.store.record(updates, hashes: hashes)
            let ended = updates.filter { ![.queued, .uploading].contains($0.1.status) }.map(\.0)
            if !ended.isEmpty { self.runner.withLockedValue { $0 }?.runner?.written(ended) }
        } catch {
            Platform.writeStandardError("upload-agent: cannot record progress: \(error)\n")
        }
    }

    /// Runs `body` after the writes and loads asked for before it, holding `writing` (``run()`` does it).
    func onQueue(_ body: @escaping @Sendable () -> Void) {
        self.work.continuation.yield(.run(body))
    }

    /// Runs `body` now, holding `writing`: blocking, never on an event loop.
    func onQueueAndWait<T>(_ body: () throws -> T) rethrows -> T {
        try self.writing.withLock(body)
    }

    /// Writes what is pending now (at the end of a run).
    func flushNow() {
        self.writing.withLock { self.flush() }
    }

    func started(_ job: UploadJob) { self.submit(job, .uploading) }
    func progressed(_ job: UploadJob) { self.submit(job, .uploading) }
    func requeued(_ job: UploadJob) { self.submit(job, .queued) }
    /// Queued, with why it waits (`upload-agent status` shows it).
    func deferred(_ job: UploadJob, reason: String) { self.submit(job, .queued, waiting: reason) }

    func finished(_ job: UploadJob, _ result: UploadResult) {
        var status: QueuedItem.Status = result.status == .failed ? .failed : .done
        if status == .failed, let file = job.item.source as? FileSource,
            FileSource.currentInfo(path: file.path, followSymlinks: file.followSymlinks) == nil
        {
            status = .dropped
        }
        self.submit(job, status, result: result)
        self.runner.withLockedValue { $0 }?.runner?.ended(job)
    }

    func cachedSHA1(fingerprint: [UInt8]) -> SHA1Digest? {
        (try? self.store.cachedSHA1(fingerprint: fingerprint)).flatMap { $0.flatMap(SHA1Digest.init(hex:)) }
    }

    /// Recorded with the next write, not in a transaction of its own per file: lost to a kill within the interval, it
    /// costs a hash again (on 10,000 small files, a write per file was a third of the agent's system calls).
    func hashed(fingerprint: [UInt8], sha1: SHA1Digest) {
        guard !fingerprint.isEmpty else { return }
        self.schedule { $0.hashes[fingerprint] = sha1.hex }
    }
}
