import NIOConcurrencyHelpers
import UploadChecksums
import UploadProtocol

/// Where a run records its jobs as they go, so that a restart resumes them: the agent's state database
/// (``QueueRunner``), or nothing for a run without state. Its calls come from event-loop threads, except the hash
/// cache's, which come from the thread pool; none may block on the network.
protocol JobJournal: Sendable {
    func started(_ job: UploadJob)
    /// The relay's durable offset moved (or the job's SHA-1 became known).
    func progressed(_ job: UploadJob)
    func requeued(_ job: UploadJob)
    /// The relay had no room for it: it waits, for `reason` (``JobQueue/deferJob(_:for:reason:)``).
    func deferred(_ job: UploadJob, reason: String)
    func finished(_ job: UploadJob, _ result: UploadResult)
    /// The SHA-1 of a source hashed before, by its fingerprint (blocking, on the thread pool).
    func cachedSHA1(fingerprint: [UInt8]) -> SHA1Digest?
    /// Remembers a source's SHA-1 (blocking, on the thread pool).
    func hashed(fingerprint: [UInt8], sha1: SHA1Digest)
}

/// The jobs of one run, shared by its successive connections. A run of `send` is done when every job finished; a
/// long-running agent (`watch`) keeps adding jobs and only stops when told.
final class JobQueue: Sendable {
    private struct State {
        var waiting: [UploadJob]
        var active: Int = 0
        /// Keys of the jobs started and not yet back or finished.
        var activeKeys: Set<String> = []
        var finished: [UploadResult] = []
        /// Why no job may start now (a pause, a condition), or nil.
        var hold: String? = nil
        /// Jobs waiting for the relay to have room for them (QUOTA_EXCEEDED, its storage full), each until its own time:
        /// they go back to wait then (``returnDeferredJobs(clock:)``). The other jobs go on meanwhile.
        var deferred: [ObjectIdentifier: Deferred] = [:]
        /// Why the run gave up on what was left (a refused token, no progress for --retry-for), once it did.
        var gaveUp: String? = nil
        var gaveUpCode = UploadResult.ErrorCode.failed
        /// Keys whose source went away (a watched file deleted) or whose upload was cancelled, with why: their uploads
        /// stop and never commit.
        var dropped: [String: String] = [:]
        var stopped = false
        /// More jobs wait in the state database than this queue holds (a persistent queue loads them as jobs end):
        /// a run is not done while there are.
        var unloaded = false
        var waiters: [CheckedContinuation<Void, Never>] = []
        /// Jobs deferred so far, and who waits for the next (``returnDeferredJobs(clock:)``, woken by nothing else).
        var deferrals = 0
        var deferralWaiters: [CheckedContinuation<Void, Never>] = []
        /// How many times ``returnDeferredJobs(clock:)`` looked at the deferred jobs (tests).
        var deferralLooks = 0
        /// Jobs finished and acknowledgements received, on any connection.
        var progress = 0
    }

    private struct Deferred {
        var job: UploadJob
        var until: ContinuousClock.Instant
    }

    private let state: NIOLockedValueBox<State>
    let journal: (any JobJournal)?
    /// Keep the results of finished jobs (a `send` reports them all; a long-running agent does not grow).
    private let keepResults: Bool
    /// Told whenever a job goes back to wait or finishes: the connections now running, which may have nothing else to
    /// wake them (a job's preparation on an earlier connection can end after that connection closed; with
    /// ``AgentConfiguration/connections`` above 1, an idle connection waits for jobs another one gives back).
    private let listeners = NIOLockedValueBox<[ObjectIdentifier: Listener]>([:])

    /// The closure, held in a class: a closure stored directly in the generic box is re-wrapped in two conversion
    /// thunks at every locked access, and the chain grew until releasing it overflowed the stack (a SIGSEGV at
    /// exit after some 1,800 files).
    private final class Listener: Sendable {
        let call: @Sendable () -> Void
        init(_ call: @escaping @Sendable () -> Void) { self.call = call }
    }

    /// Sets (or clears) what is told, for the connection `owner`, when a job goes back to wait or finishes. It must not
    /// call back into the queue's caller synchronously: hop to the listener's event loop.
    func setListener(_ owner: ObjectIdentifier, _ listener: (@Sendable () -> Void)?) {
        let boxed = listener.map(Listener.init)
        self.listeners.withLockedValue { $0[owner] = boxed }
    }

    init(_ jobs: [UploadJob], journal: (any JobJournal)? = nil, keepResults: Bool = true) {
        self.state = NIOLockedValueBox(State(waiting: jobs))
        self.journal = journal
        self.keepResults = keepResults
    }

    /// The next job to start, if any may start.
    func next() -> UploadJob? {
        let job: UploadJob? = self.state.withLockedValue { state in
            guard state.hold == nil, !state.stopped, !state.waiting.isEmpty else { return nil }
            state.active += 1
            let job = state.waiting.removeFirst()
            if job.stripe == nil { state.activeKeys.insert(job.key) }
            return job
        }
        if let job, job.stripe == nil { self.journal?.started(job) }
        return job
    }

    /// PART jobs of a striped upload (SPEC §6.7): first in line, so that its stripes go out together on every connection.
    /// They are the agent's own: never journaled, never reported.
    func addStripes(_ jobs: [UploadJob]) {
        guard !jobs.isEmpty else { return }
        self.changed { $0.waiting.insert(contentsOf: jobs, at: 0) }
    }

    /// A PART job ended (its stripe complete, given up, or no longer wanted); every connection hears it, so the main
    /// stream's connection sends HASH once the last stripe is in.
    func finishedStripe(_ job: UploadJob) {
        self.changed { state in
            state.active -= 1
            state.progress += 1
        }
    }

    /// More jobs, after those waiting.
    func add(_ jobs: [UploadJob]) {
        guard !jobs.isEmpty else { return }
        self.changed { $0.waiting += jobs }
    }

    /// Puts `new` in `old`'s place if `old` has not started (it waits, or waits for room); false when it has.
    func replaceWaiting(_ old: UploadJob, with new: UploadJob) -> Bool {
        var replaced = false
        self.changed { state in
            if let index = state.waiting.firstIndex(where: { $0 === old }) {
                state.waiting[index] = new
                replaced = true
            } else if state.deferred.removeValue(forKey: ObjectIdentifier(old)) != nil {
                state.waiting.append(new)
                replaced = true
            }
        }
        return replaced
    }

    /// A job goes back to wait for the next connection (or a free stream).
    func requeue(_ job: UploadJob) {
        self.changed { state in
            state.active -= 1
            if job.stripe == nil { state.activeKeys.remove(job.key) }
            state.waiting.insert(job, at: 0)
        }
        if job.stripe == nil { self.journal?.requeued(job) }
    }

    func finished(_ job: UploadJob, _ result: UploadResult) {
        var idle = false
        self.changed { state in
            state.active -= 1
            state.progress += 1
            if self.keepResults { state.finished.append(result) }
            state.activeKeys.remove(job.key)
            state.dropped[job.key] = nil
            idle = state.active == 0 && state.waiting.isEmpty
        }
        // Nothing left to read for now (a watch waiting for files): the read blocks kept for the next file go.
        if idle { RecycledBlocks.shared.drain() }
        self.journal?.finished(job, result)
    }

    /// The job's durable offset moved (or its SHA-1 became known): recorded.
    func progressed(_ job: UploadJob) {
        if job.stripe == nil { self.journal?.progressed(job) }
    }

    /// The relay acknowledged more of the job's bytes: recorded, and counted as progress (``progressMark``).
    func acknowledged(_ job: UploadJob) {
        self.state.withLockedValue { $0.progress += 1 }
        self.journal?.progressed(job)
    }

    /// Grows whenever a job finishes or the relay acknowledges bytes, on any connection (what a connection's own
    /// ``ConnectionOutcome/madeProgress`` counts): a connection that cannot get through gives up only when none of the
    /// others makes progress either.
    var progressMark: Int { self.state.withLockedValue { $0.progress } }

    /// Jobs wait that a connection could start now (not held, nor only waiting for the relay to have room).
    var hasWaiting: Bool { self.state.withLockedValue { $0.hold == nil && !$0.stopped && !$0.waiting.isEmpty } }

    /// Stops new jobs from starting (`reason` says why) or, with nil, lets them start again. Uploads in flight stop
    /// at once: the connection closes, and the relay keeps every acknowledged byte for the resume.
    func hold(_ reason: String?) {
        self.changed { $0.hold = reason }
    }

    var holdReason: String? { self.state.withLockedValue { $0.hold } }

    /// The relay had no room for `job` (`reason`): it leaves the line for `wait`, then goes back to its end
    /// (``returnDeferredJobs(clock:)``). The other jobs go on meanwhile; a `send` is not done while a job waits so.
    func deferJob(_ job: UploadJob, for wait: Duration, reason: String, now: ContinuousClock.Instant = .now) {
        var returner: [CheckedContinuation<Void, Never>] = []
        self.changed { state in
            state.active -= 1
            state.activeKeys.remove(job.key)
            state.deferred[ObjectIdentifier(job)] = Deferred(job: job, until: now + wait)
            state.deferrals += 1
            swap(&returner, &state.deferralWaiters)
        }
        for waiter in returner { waiter.resume() }
        self.journal?.deferred(job, reason: reason)
    }

    /// Brings each deferred job back to the end of the line when its wait is over, until cancelled: a child task of
    /// the run, beside its connections.
    func returnDeferredJobs(clock: ContinuousClock = ContinuousClock()) async {
        while !Task.isCancelled {
            let (due, seen) = self.state.withLockedValue { state in
                state.deferralLooks += 1
                return (Self.earliestReturn(state), state.deferrals)
            }
            guard let due else {
                await self.waitForDeferral(after: seen)
                continue
            }
            // Until the earliest is due, or another job is deferred meanwhile (its wait may end sooner).
            await withTaskGroup(of: Void.self) { group in
                group.addTask { try? await Task.sleep(until: due, clock: clock) }
                group.addTask { await self.waitForDeferral(after: seen) }
                await group.next()
                group.cancelAll()
            }
            let now = clock.now
            self.changed { state in
                for (id, deferred) in state.deferred.sorted(by: { $0.value.until < $1.value.until }) where deferred.until <= now {
                    state.deferred[id] = nil
                    state.waiting.append(deferred.job)
                }
            }
        }
    }

    /// Waits until a job is deferred after the `seen`-th, or for the task's cancellation. Nothing else wakes it: the
    /// queue changes with every file, and a deferral is rare.
    private func waitForDeferral(after seen: Int) async {
        await self.park(in: .deferral) { $0.deferrals == seen }
    }

    /// Tasks waiting for a deferral now, and how many looks ``returnDeferredJobs(clock:)`` took (tests).
    var deferralWatch: (parked: Int, looks: Int) {
        self.state.withLockedValue { ($0.deferralWaiters.count, $0.deferralLooks) }
    }

    private static func earliestReturn(_ state: State) -> ContinuousClock.Instant? {
        state.deferred.values.lazy.map(\.until).min()
    }

    /// Jobs are waiting for the relay to have room, and nothing else is to be done now.
    var hasOnlyDeferred: Bool {
        self.state.withLockedValue { $0.waiting.isEmpty && $0.active == 0 && !$0.deferred.isEmpty }
    }

    /// Why the run gave up on the jobs left, once it did (``failWaiting(_:)``).
    var gaveUpReason: String? { self.state.withLockedValue { $0.gaveUp } }
    /// The code of ``gaveUpReason``.
    var gaveUpCode: String { self.state.withLockedValue { $0.gaveUpCode } }

    /// Results of items this queue never held (rows the state database kept, failed when the run gave up), kept with its own.
    func record(_ results: [UploadResult]) {
        guard self.keepResults, !results.isEmpty else { return }
        self.state.withLockedValue { $0.finished += results }
    }

    var isStopped: Bool { self.state.withLockedValue { $0.stopped } }

    /// The source of `key` is gone or its upload was cancelled (`reason` says which): a waiting job leaves the queue
    /// (returned), an active one stops without committing.
    func drop(key: String, reason: String) -> UploadJob? {
        var removed: UploadJob? = nil
        self.changed { state in
            // A PART job carries its main job's key: the main job is the one dropped (its stripes are dropped with it).
            if let index = state.waiting.firstIndex(where: { $0.key == key && $0.stripe == nil }) {
                removed = state.waiting.remove(at: index)
            } else if let waiting = state.deferred.first(where: { $0.value.job.key == key && $0.value.job.stripe == nil }) {
                removed = state.deferred.removeValue(forKey: waiting.key)?.job
            } else if state.activeKeys.contains(key) {
                state.dropped[key] = reason
            }
        }
        return removed
    }

    /// Why the job was dropped, or nil while it goes on.
    func dropReason(_ job: UploadJob) -> String? {
        self.state.withLockedValue { $0.dropped[job.key] }
    }

    /// Ends a long-running queue: ``waitForWork()`` returns false from now on.
    func stop() {
        self.changed { $0.stopped = true }
    }

    /// The run is over: the sources of jobs that did not finish are closed, so a read still waiting for input (stdin
    /// that never ends) gives up and the thread pool can drain.
    func closeUnfinishedSources() {
        for job in self.state.withLockedValue({ $0.waiting + $0.deferred.values.map(\.job) }) where job.result == nil {
            job.item.source.close()
        }
    }

    /// Waits until a job may start; false once the queue is stopped, the waiting task is cancelled (a run's other
    /// connection stopped it: a revoked token), or, for a `send`, every job finished.
    func waitForWork(service: Bool) async -> Bool {
        while true {
            if Task.isCancelled { return false }
            if let answer = self.state.withLockedValue({ Self.answer($0, service: service) }) { return answer }
            await self.park(in: .work) { Self.answer($0, service: service) == nil }
        }
    }

    /// Who a parked task waits with: every change wakes ``State/waiters``, a deferral ``State/deferralWaiters``.
    private enum Line {
        case work, deferral
    }

    /// Waits in `line` for its next wake-up, unless `unchanged` is false already, or for the task's cancellation.
    private func park(in line: Line, while unchanged: (State) -> Bool) async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let asked: Bool = self.state.withLockedValue { state in
                    // Asked again under the lock: a change, or a cancellation, between the two looks is never missed.
                    guard unchanged(state), !Task.isCancelled else { return true }
                    switch line {
                    case .work: state.waiters.append(continuation)
                    case .deferral: state.deferralWaiters.append(continuation)
                    }
                    return false
                }
                if asked { continuation.resume() }
            }
        } onCancel: {
            // Every waiter of the line looks again; the cancelled one returns.
            let waiters = self.state.withLockedValue { state in
                var waiters: [CheckedContinuation<Void, Never>] = []
                switch line {
                case .work: swap(&waiters, &state.waiters)
                case .deferral: swap(&waiters, &state.deferralWaiters)
                }
                return waiters
            }
            for waiter in waiters { waiter.resume() }
        }
    }

    /// Tasks parked in ``waitForWork(service:)`` now (tests).
    var parkedWaiters: Int { self.state.withLockedValue { $0.waiters.count } }

    private static func answer(_ state: State, service: Bool) -> Bool? {
        if state.stopped { return false }
        if !service && state.waiting.isEmpty && state.active == 0 && !state.unloaded && state.deferred.isEmpty { return false }
        if state.hold == nil && !state.waiting.isEmpty { return true }
        return nil
    }

    /// Changes the state, then wakes the connection and whoever waits for work (they look again).
    private func changed(_ body: (inout State) -> Void) {
        let waiters: [CheckedContinuation<Void, Never>] = self.state.withLockedValue { state in
            body(&state)
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
        for listener in self.listeners.withLockedValue({ Array($0.values) }) { listener.call() }
    }

    var isDone: Bool { self.state.withLockedValue { $0.waiting.isEmpty && $0.active == 0 && !$0.unloaded && $0.deferred.isEmpty } }

    /// Records whether more jobs wait in the state database than were added here.
    func setUnloaded(_ unloaded: Bool) {
        self.changed { $0.unloaded = unloaded }
    }

    /// Whether more jobs wait in the state database than were added here.
    var hasUnloaded: Bool { self.state.withLockedValue { $0.unloaded } }

    var results: [UploadResult] { self.state.withLockedValue { $0.finished } }

    /// Gives up on every job still waiting.
    func failWaiting(_ message: String, code: String) -> [UploadResult] {
        var failed: [(UploadJob, UploadResult)] = []
        // Through `changed`: with --connections, the others hear that the queue may be done now (else an idle one
        // waited for jobs forever).
        self.changed { state in
            // PART jobs are the agent's own: not reported; their main job, waiting on another connection, fails.
            for job in state.waiting {
                if let stripe = job.stripe { stripe.set.fail("stripe \(stripe.index): \(message)") }
            }
            // And the jobs waiting for room: the run is over for them too.
            failed = (state.waiting + state.deferred.values.map(\.job)).filter { $0.stripe == nil }.map { job in
                (
                    job,
                    job.finish(
                        .failed, sha1: job.knownSHA1?.hex ?? "", error: job.lastError.map { "\(message); last error: \($0)" } ?? message, code: code
                    )
                )
            }
            state.waiting.removeAll()
            state.deferred.removeAll()
            state.gaveUp = message
            state.gaveUpCode = code
            // Items not loaded are the runner's to fail (``QueueRunner``): each gets its result there.
            state.unloaded = false
            if self.keepResults { state.finished += failed.map(\.1) }
        }
        for (job, result) in failed { self.journal?.finished(job, result) }
        return failed.map(\.1)
    }
}
