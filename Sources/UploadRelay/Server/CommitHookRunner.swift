#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import UploadPlatform
import UploadProtocol

/// Delivers the catalog's queued commit events to the post-commit hooks (``CommitHooks``), in a child task of the
/// relay server's ``RelayServer/run()`` (``run()``): a hook command is waited for without holding a thread, so a slow or
/// hung hook holds no upload up. At least once: an event goes from the outbox only once every hook took it; a relay that
/// dies mid-delivery leaves it for the next look, its own or another relay's, once its lease ran out.
final class CommitHookRunner: Sendable {
    private let catalog: any HookOutbox
    private let metrics: RelayMetrics
    private let logger: Logger
    private let hooks: CommitHooks
    private let wake = Wakeup()
    private let stopping = NIOLockedValueBox(false)
    /// Threads that wait for hook commands, one per delivery at once: a hook never holds a thread of the relay's I/O
    /// pool, however long it runs.
    private let processes: NIOThreadPool

    init(catalog: any HookOutbox, metrics: RelayMetrics, logger: Logger, hooks: CommitHooks) {
        self.catalog = catalog
        self.metrics = metrics
        self.logger = logger
        self.hooks = hooks
        self.processes = NIOThreadPool(numberOfThreads: max(1, hooks.concurrency))
    }

    /// A commit queued an event: look now.
    func nudge() {
        self.wake.signal()
    }

    /// Ends ``run()`` once the deliveries under way end (each within the hook timeout); what is left waits in the
    /// outbox.
    func stop() {
        self.stopping.withLockedValue { $0 = true }
        self.wake.signal()
    }

    /// Delivers until ``stop()`` or cancellation, then lets the hook threads go.
    func run() async {
        self.processes.start()
        await self.loop()
        try? await self.processes.shutdownGracefully()
    }

    private func loop() async {
        let logger = self.logger
        // Held long enough for a delivery to end, however slow: then another look may take it again.
        let lease = self.hooks.timeout * 2 + .seconds(10)
        while !self.stopping.withLockedValue({ $0 }) && !Task.isCancelled {
            let events: [CommitEvent]
            do {
                events = try await self.catalog.claimCommitEvents(limit: max(1, self.hooks.concurrency), lease: lease)
            } catch {
                logger.warning("could not read the commit events", metadata: ["error": "\(error)"])
                events = []
            }
            if events.isEmpty {
                await self.wake.wait(upTo: self.hooks.pollInterval)
                continue
            }
            await withTaskGroup(of: Void.self) { group in
                for event in events {
                    group.addTask { await self.deliver(event) }
                }
            }
        }
    }

    private func deliver(_ event: CommitEvent) async {
        let logger = self.logger
        var metadata: Logger.Metadata = ["upload.key": "\(event.key)", "account": "\(event.account)", "attempt": "\(event.attempts)"]
        var failure: String? = nil
        if let command = self.hooks.command {
            failure = await self.run(command, event)
        }
        if failure == nil, let text = self.hooks.url {
            if let endpoint = HookEndpoint(text) {
                failure = await self.post(endpoint, event)
            } else {
                failure = "--on-commit-url \(HookEndpoint.redact(text)) is not an http(s) URL"
            }
        }
        self.metrics.hookRan(failed: failure != nil)
        do {
            guard let failure else {
                try await self.catalog.finishCommitEvent(id: event.id)
                logger.info("post-commit hooks took the event", metadata: metadata)
                return
            }
            let doubled = self.hooks.retryDelay * (1 << min(20, max(0, event.attempts - 1)))
            let delay = min(doubled, self.hooks.maxRetryDelay)
            try await self.catalog.retryCommitEvent(id: event.id, at: Date().addingTimeInterval(delay.inSeconds), error: failure)
            metadata["error"] = "\(failure)"
            metadata["retry.in"] = "\(delay)"
            logger.warning("post-commit hook failed; the event is kept and tried again", metadata: metadata)
        } catch {
            metadata["error"] = "\(error)"
            logger.warning("could not record a commit event's delivery; it is tried again once its lease ends", metadata: metadata)
        }
    }

    /// The event as the hooks get it.
    static func json(_ event: CommitEvent) -> [UInt8] {
        let object: [String: Any] = [
            "event": "commit", "id": event.id, "account": event.account, "key": event.key, "size": event.size, "sha1": event.sha1,
            "location": event.location, "committed_at": ISO8601DateFormatter().string(from: event.committedAt), "attempt": event.attempts,
        ]
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
        return Array(data) + [UInt8(ascii: "\n")]
    }

    /// Runs the command, the event on its stdin and in its environment, isolated from the relay
    /// (``IsolatedCommand``): its own session and process group, no blocked signal, only descriptors 0 to 2. At the
    /// timeout its group gets TERM, then KILL ``CommitHooks/killGrace`` later; its delivery is over when its first
    /// process exits, whatever a background job keeps open. What it writes goes to the log, bounded and escaped. Nil
    /// when it exited 0; else why not.
    private func run(_ command: String, _ event: CommitEvent) async -> String? {
        var environment = Self.environment(ProcessInfo.processInfo.environment, passing: self.hooks.environment)
        environment["UPLOAD_EVENT_ID"] = "\(event.id)"
        environment["UPLOAD_ACCOUNT"] = event.account
        environment["UPLOAD_KEY"] = event.key
        environment["UPLOAD_SIZE"] = "\(event.size)"
        environment["UPLOAD_SHA1"] = event.sha1
        environment["UPLOAD_LOCATION"] = event.location
        environment["UPLOAD_ATTEMPT"] = "\(event.attempts)"
        let run = IsolatedCommand(
            command: command, environment: environment, input: Self.json(event), timeout: self.hooks.timeout, grace: self.hooks.killGrace)
        let ended: IsolatedCommand.Ended
        do {
            ended = try await self.processes.runIfActive { run.run() }
        } catch {
            return "could not start the --on-commit command: the relay is stopping"
        }
        if !ended.output.isEmpty {
            self.logger.info(
                "post-commit hook wrote",
                metadata: ["upload.key": "\(Printable.escaped(event.key))", "hook.output": "\(ended.printableOutput)"])
        }
        switch ended.outcome {
        case .exited(0) where !ended.timedOut:
            return nil
        case .couldNotStart(let reason):
            return "could not start the --on-commit command: \(reason)"
        case _ where ended.timedOut:
            return "the --on-commit command ran longer than \(self.hooks.timeout) and was killed"
        case .exited(let status):
            return "the --on-commit command exited \(status)"
        case .signalled(let signal):
            return "the --on-commit command was killed by signal \(signal)"
        }
    }

    /// What a hook command's environment holds of the relay's: ``CommitHooks/baseEnvironment`` and the names the
    /// operator passes (`--hook-env`), never the rest (the relay's S3 keys, its catalog URL and password).
    static func environment(_ relay: [String: String], passing names: [String]) -> [String: String] {
        IsolatedCommand.environment(relay, passing: CommitHooks.baseEnvironment + names)
    }

    /// POSTs the event; nil on a 2xx answer. Messages name the URL without its user information or query.
    private func post(_ endpoint: HookEndpoint, _ event: CommitEvent) async -> String? {
        guard let poster = self.hooks.poster else { return "--on-commit-url \(endpoint.redacted): this relay has no HTTP client" }
        do {
            let status = try await poster.post(
                url: endpoint.url, authorization: endpoint.authorization, json: Self.json(event), timeout: self.hooks.timeout)
            return (200..<300).contains(status) ? nil : "--on-commit-url \(endpoint.redacted) answered HTTP \(status)"
        } catch {
            return "--on-commit-url \(endpoint.redacted): \(error)"
        }
    }
}

/// A signal a task waits for without holding a thread: ``signal()`` wakes the waiter, or the next ``wait(upTo:)`` when
/// none waits (signals in between count once).
final class Wakeup: Sendable {
    private struct State {
        var signalled = false
        var waiter: (generation: Int, continuation: CheckedContinuation<Bool, Never>)?
        /// Tells a cancelled wait apart from the next one.
        var generation = 0
        var cancelled = 0
    }

    private let state = NIOLockedValueBox(State())

    func signal() {
        let waiter = self.state.withLockedValue { state -> CheckedContinuation<Bool, Never>? in
            guard let waiter = state.waiter else {
                state.signalled = true
                return nil
            }
            state.waiter = nil
            return waiter.continuation
        }
        waiter?.resume(returning: true)
    }

    /// Waits for a signal, at most `limit` (nil: for ever); whether one came. One waiter at a time.
    @discardableResult
    func wait(upTo limit: Duration? = nil) async -> Bool {
        guard let limit else { return await self.waitForSignal() }
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask { await self.waitForSignal() }
            group.addTask {
                try? await Task.sleep(for: limit)
                return false
            }
            var signalled = await group.next() ?? false
            group.cancelAll()
            // A signal that came as the time ran out is not lost.
            while let other = await group.next() { signalled = signalled || other }
            return signalled
        }
    }

    /// Waits for a signal until the task is cancelled; whether one came.
    private func waitForSignal() async -> Bool {
        let generation = self.state.withLockedValue { state -> Int in
            state.generation += 1
            return state.generation
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let now = self.state.withLockedValue { state -> Bool? in
                    if state.signalled {
                        state.signalled = false
                        return true
                    }
                    if state.cancelled == generation { return false }
                    state.waiter = (generation, continuation)
                    return nil
                }
                if let now { continuation.resume(returning: now) }
            }
        } onCancel: {
            let waiter = self.state.withLockedValue { state -> CheckedContinuation<Bool, Never>? in
                state.cancelled = generation
                guard let waiter = state.waiter, waiter.generation == generation else { return nil }
                state.waiter = nil
                return waiter.continuation
            }
            waiter?.resume(returning: false)
        }
    }
}
