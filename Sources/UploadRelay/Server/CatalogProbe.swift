import NIOConcurrencyHelpers
import NIOCore

/// Catalog reads for `/readyz` and `/metrics`, bounded in time and in number: a catalog that hangs (a PostgreSQL server
/// gone without a reset) must not make the probes hang, nor pile reads up behind it.
///
/// Each kind of read runs at most once at a time, as a task of its own: a probe that comes while one is under way waits
/// for that one's outcome. A probe waits at most ``timeout``; the read goes on after that, and the
/// next probe waits for it again.
final class CatalogProbe: Sendable {
    typealias Outcome = Result<RelayMetrics.CatalogLevels, CatalogProbeFailure>

    /// How long a probe waits for the catalog.
    let timeout: TimeAmount
    private let inFlight = NIOLockedValueBox<[String: [EventLoopPromise<Outcome>]]>([:])

    /// Whether the last probe found the catalog answering (logged when it changes, not at every probe).
    private let answering = NIOLockedValueBox(true)

    /// Records whether the catalog answered; true when that differs from the last probe.
    func note(answered: Bool) -> Bool {
        self.answering.withLockedValue { last in
            defer { last = answered }
            return last != answered
        }
    }

    init(timeout: TimeAmount = .seconds(2)) {
        self.timeout = timeout
    }

    /// Runs `read` (once per `kind` at a time) and succeeds with its outcome, or with a timeout failure after ``timeout``.
    func probe(
        _ kind: String, on eventLoop: any EventLoop, executor: RelayExecutor,
        read: @escaping @Sendable () async throws -> RelayMetrics.CatalogLevels
    ) -> EventLoopFuture<Outcome> {
        let promise = eventLoop.makePromise(of: Outcome.self)
        let start = self.inFlight.withLockedValue { inFlight -> Bool in
            let waiting = inFlight[kind]
            inFlight[kind, default: []].append(promise)
            return waiting == nil
        }
        if start {
            Task(executorPreference: executor) {
                let outcome: Outcome
                do {
                    outcome = .success(try await read())
                } catch {
                    outcome = .failure(CatalogProbeFailure(reason: "\(error)", timedOut: false))
                }
                let waiting = self.inFlight.withLockedValue { $0.removeValue(forKey: kind) ?? [] }
                for waiter in waiting { waiter.succeed(outcome) }
            }
        }
        let timeout = self.timeout
        let timer = eventLoop.scheduleTask(in: timeout) {
            let removed = self.inFlight.withLockedValue { inFlight -> Bool in
                guard var waiting = inFlight[kind], let index = waiting.firstIndex(where: { $0.futureResult === promise.futureResult }) else {
                    return false
                }
                waiting.remove(at: index)
                // The read goes on with no one waiting: the next probe waits for it.
                inFlight[kind] = waiting
                return true
            }
            if removed {
                promise.succeed(.failure(CatalogProbeFailure(reason: "no answer within \(timeout.nanoseconds / 1_000_000) ms", timedOut: true)))
            }
        }
        promise.futureResult.whenComplete { _ in timer.cancel() }
        return promise.futureResult
    }
}

struct CatalogProbeFailure: Error, Sendable {
    var reason: String
    var timedOut: Bool
}
