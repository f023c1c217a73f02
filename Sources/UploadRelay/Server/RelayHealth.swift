import Foundation
import Glibc
import NIOCore
import Logging
import NIOConcurrencyHelpers

/// What `/readyz` answers: whether this relay should be sent new agents, and each check's outcome.
public struct RelayReadiness: Sendable, Hashable {
    /// One check: its name and, when it failed, why.
    public struct Check: Sendable, Hashable {
        public var name: String
        public var failure: String?
    }

    public var checks: [Check]
    public var ready: Bool { self.checks.allSatisfy { $0.failure == nil } }

    /// The JSON body: `{"ready":BOOL,"checks":{"catalog":"ok"|REASON,...}}`, checks in a fixed order.
    public var json: [UInt8] {
        let checks = self.checks.map { "\(JSONText.quoted($0.name)):\(JSONText.quoted($0.failure ?? "ok"))" }.joined(separator: ",")
        return Array("{\"ready\":\(self.ready),\"checks\":{\(checks)}}\n".utf8)
    }
}

/// `/readyz` and the levels `/metrics` samples: what the relay's parts say of its health, asked of the catalog within
/// ``CatalogProbe/timeout``.
public final class RelayHealth: Sendable {
    private let catalog: any Catalog
    private let metrics: RelayMetrics
    private let space: StorageSpace
    private let memory: ResourceBudget
    private let uploadSlots: UploadSlots
    private let executor: RelayExecutor
    private let logger: Logger
    /// The catalog reads of `/readyz` and `/metrics`, bounded in time and threads.
    private let catalogProbe = CatalogProbe()
    /// Connection handlers alive now: one per connection, freed once its channel closed and its storage let go.
    let liveHandlers = NIOLockedValueBox(0)
    /// The relay is shutting down: `/readyz` says so, for the balancer to send new agents elsewhere.
    let draining = NIOLockedValueBox(false)

    init(
        catalog: any Catalog, metrics: RelayMetrics, space: StorageSpace, memory: ResourceBudget, uploadSlots: UploadSlots,
        executor: RelayExecutor, logger: Logger
    ) {
        self.catalog = catalog
        self.metrics = metrics
        self.space = space
        self.memory = memory
        self.uploadSlots = uploadSlots
        self.executor = executor
        self.logger = logger
    }

    /// `/readyz`: the catalog answers a query (within ``CatalogProbe/timeout``), the staging directory is writable,
    /// free space is above the reserve and what open uploads will still write, and the relay is not shutting down.
    public func readiness(on eventLoop: any EventLoop) -> EventLoopFuture<RelayReadiness> {
        let ping = self.timedPing
        return self.catalogProbe.probe("ping", on: eventLoop, executor: self.executor) {
            try await ping()
            return RelayMetrics.CatalogLevels()
        }.map { outcome in self.readiness(catalog: outcome) }
    }

    /// Asks the catalog a query, timed in the metrics.
    private var timedPing: @Sendable () async throws -> Void {
        let (catalog, metrics) = (self.catalog, self.metrics)
        return {
            let start = ContinuousClock.now
            try await catalog.ping()
            metrics.took("catalog", "ping", since: start)
        }
    }

    /// The checks, with the catalog's outcome given.
    private func readiness(catalog outcome: CatalogProbe.Outcome) -> RelayReadiness {
        var checks: [RelayReadiness.Check] = []
        switch outcome {
        case .success:
            if self.catalogProbe.note(answered: true) { self.logger.notice("ready: the catalog answers again") }
            checks.append(.init(name: "catalog", failure: nil))
        case .failure(let failure):
            self.metrics.failed("catalog", "ping")
            // The reason goes to the log; the probe's answer names the part, not the database's address.
            if self.catalogProbe.note(answered: false) {
                self.logger.warning("not ready: the catalog does not answer", metadata: ["error": "\(failure.reason)"])
            }
            checks.append(.init(name: "catalog", failure: "the catalog does not answer"))
        }
        let staging = self.space.directory
        checks.append(.init(name: "storage", failure: access(staging, W_OK) == 0 ? nil : "the staging directory is not writable"))
        checks.append(.init(name: "space", failure: self.space.isFull ? "free space is below the reserve" : nil))
        checks.append(.init(name: "accepting", failure: self.draining.withLockedValue { $0 } ? "the relay is shutting down" : nil))
        return RelayReadiness(checks: checks)
    }

    /// `/metrics`: samples the levels (readiness included; the catalog's within the probe's timeout), then writes every
    /// metric out.
    public func scrapeMetrics(on eventLoop: any EventLoop) -> EventLoopFuture<[UInt8]> {
        let (catalog, ping) = (self.catalog, self.timedPing)
        return self.catalogProbe.probe("metrics", on: eventLoop, executor: self.executor) {
            try await ping()
            var levels = RelayMetrics.CatalogLevels()
            let backlog = try await catalog.commitEventBacklog()
            levels.hookQueue = backlog.count
            levels.hookOldest = backlog.oldest
            (levels.sessionsStaged, levels.stagedBytes) = try await catalog.unfinishedTotals()
            return levels
        }.map { outcome in
            var levels = RelayMetrics.Levels()
            levels.connections = self.liveHandlers.withLockedValue { $0 }
            levels.uploadsOpen = self.uploadSlots.inUse
            levels.uploadSlots = self.uploadSlots.total
            levels.memoryGranted = self.memory.inUse
            levels.memoryBudget = self.memory.total
            levels.diskFree = self.space.free
            levels.diskPromised = self.space.promised
            levels.storageFull = self.space.isFull
            if case .success(let catalogLevels) = outcome { levels.catalog = catalogLevels }
            levels.ready = self.readiness(catalog: outcome).ready
            self.metrics.sample(levels)
            return self.metrics.render()
        }
    }
}
