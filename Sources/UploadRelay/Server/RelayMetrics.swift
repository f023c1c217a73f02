import CoreMetrics
import Foundation
import NIOConcurrencyHelpers
import Prometheus
import UploadProtocol

/// What the relay counts and measures, in swift-metrics' types on a registry of its own (two relays in one process,
/// as in the tests, count apart), read out in Prometheus' text format on the operations endpoint's `/metrics`.
///
/// Counters are kept where the work happens: the frames a connection writes (uploads opened, committed, refused by
/// wire code; credit granted), the bytes it reads, and the storage steps (sync and commit latency, bytes made durable,
/// store and catalog errors). Levels (connections, memory, disk, the hooks' queue, staged sessions) are sampled when
/// Prometheus scrapes (``sample(_:)``). No label names a key; an account only with ``perAccount``.
public final class RelayMetrics: Sendable {
    /// The registry the metrics live in; ``render()`` writes it out.
    public let registry: PrometheusCollectorRegistry
    private let factory: PrometheusMetricsFactory
    /// Whether committed bytes and uploads carry an `account` label (`--metrics-per-account`).
    public let perAccount: Bool

    let connectionsAccepted: CoreMetrics.Counter
    let receivedBytes: CoreMetrics.Counter
    let creditGranted: CoreMetrics.Counter
    let durableBytes: CoreMetrics.Counter
    let deduplicatedUploads: CoreMetrics.Counter
    let deduplicatedBytes: CoreMetrics.Counter
    let syncSeconds: CoreMetrics.Timer
    let commitSeconds: CoreMetrics.Timer
    let commitGroupSize: CoreMetrics.Recorder

    // Levels, sampled at each scrape.
    let connectionsOpen: CoreMetrics.Gauge
    let uploadsOpen: CoreMetrics.Gauge
    let uploadSlots: CoreMetrics.Gauge
    let memoryInUse: CoreMetrics.Gauge
    let memoryBudget: CoreMetrics.Gauge
    let diskFree: CoreMetrics.Gauge
    let diskPromised: CoreMetrics.Gauge
    let storageFull: CoreMetrics.Gauge
    let hookQueue: CoreMetrics.Gauge
    let hookOldestSeconds: CoreMetrics.Gauge
    let sessionsStaged: CoreMetrics.Gauge
    let sessionsStagedBytes: CoreMetrics.Gauge
    let ready: CoreMetrics.Gauge

    public init(perAccount: Bool = false) {
        let registry = PrometheusCollectorRegistry()
        var factory = PrometheusMetricsFactory(registry: registry)
        // Syncs and commits take from a millisecond (a local fsync) to seconds (S3, a busy disk).
        factory.defaultDurationHistogramBuckets = [
            .milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
            .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .milliseconds(2500), .seconds(5),
            .seconds(10), .seconds(30),
        ]
        factory.valueHistogramBuckets["upload_relay_commit_group_size"] = [1, 2, 4, 8, 16, 32, 64, 128]
        self.registry = registry
        self.factory = factory
        self.perAccount = perAccount
        self.connectionsAccepted = CoreMetrics.Counter(label: "upload_relay_connections_accepted_total", factory: factory)
        self.receivedBytes = CoreMetrics.Counter(label: "upload_relay_received_bytes_total", factory: factory)
        self.creditGranted = CoreMetrics.Counter(label: "upload_relay_credit_granted_bytes_total", factory: factory)
        self.durableBytes = CoreMetrics.Counter(label: "upload_relay_durable_bytes_total", factory: factory)
        self.deduplicatedUploads = CoreMetrics.Counter(label: "upload_relay_uploads_deduplicated_total", factory: factory)
        self.deduplicatedBytes = CoreMetrics.Counter(label: "upload_relay_deduplicated_bytes_total", factory: factory)
        self.syncSeconds = CoreMetrics.Timer(label: "upload_relay_sync_seconds", factory: factory)
        self.commitSeconds = CoreMetrics.Timer(label: "upload_relay_commit_seconds", factory: factory)
        self.commitGroupSize = CoreMetrics.Recorder(label: "upload_relay_commit_group_size", factory: factory)
        self.connectionsOpen = CoreMetrics.Gauge(label: "upload_relay_connections", factory: factory)
        self.uploadsOpen = CoreMetrics.Gauge(label: "upload_relay_uploads_open", factory: factory)
        self.uploadSlots = CoreMetrics.Gauge(label: "upload_relay_uploads_open_limit", factory: factory)
        self.memoryInUse = CoreMetrics.Gauge(label: "upload_relay_memory_granted_bytes", factory: factory)
        self.memoryBudget = CoreMetrics.Gauge(label: "upload_relay_memory_budget_bytes", factory: factory)
        self.diskFree = CoreMetrics.Gauge(label: "upload_relay_disk_free_bytes", factory: factory)
        self.diskPromised = CoreMetrics.Gauge(label: "upload_relay_disk_promised_bytes", factory: factory)
        self.storageFull = CoreMetrics.Gauge(label: "upload_relay_storage_full", factory: factory)
        self.hookQueue = CoreMetrics.Gauge(label: "upload_relay_hook_events_queued", factory: factory)
        self.hookOldestSeconds = CoreMetrics.Gauge(label: "upload_relay_hook_oldest_event_age_seconds", factory: factory)
        self.sessionsStaged = CoreMetrics.Gauge(label: "upload_relay_sessions_staged", factory: factory)
        self.sessionsStagedBytes = CoreMetrics.Gauge(label: "upload_relay_sessions_staged_bytes", factory: factory)
        self.ready = CoreMetrics.Gauge(label: "upload_relay_ready", factory: factory)
        // Exposed at 0 from the start, as every counter here: a dashboard's rate() needs the series before the first
        // refusal.
        for refusal in [ListenerLifecycle.Refusal.sourceFull, .placesFull] { _ = self.refusals("upload", refusal) }
    }

    // MARK: Events

    /// A connection `listener` (upload, status, operations) did not admit, and why.
    func refused(_ refusal: ListenerLifecycle.Refusal, listener: String) {
        self.refusals(listener, refusal).increment()
    }

    private func refusals(_ listener: String, _ refusal: ListenerLifecycle.Refusal) -> CoreMetrics.Counter {
        let reason =
            switch refusal {
            case .notRunning: "not_running"
            case .sourceFull: "source_full"
            case .poolFull: "pool_full"
            case .placesFull: "places_full"
            }
        return self.counter("upload_relay_connections_refused_total", ["listener": listener, "reason": reason])
    }

    /// A frame the relay wrote to an agent: what it says of the uploads.
    func wrote(_ frame: Frame, account: String?) {
        switch frame {
        case .offset(let offset):
            switch offset.disposition {
            case .start, .resume:
                self.counter("upload_relay_uploads_opened_total", ["disposition": offset.disposition == .start ? "start" : "resume"])
                    .increment()
            case .stored:
                self.deduplicatedUploads.increment()
                self.deduplicatedBytes.increment(by: Int64(clamping: offset.offset))
            case .confirm:
                break
            }
        case .result(let result):
            switch result.status {
            case .stored:
                let labels = self.perAccount ? ["account": account ?? ""] : [:]
                self.counter("upload_relay_uploads_committed_total", labels).increment()
                self.counter("upload_relay_committed_bytes_total", labels).increment(by: Int64(clamping: result.size))
            case .unchanged:
                self.deduplicatedUploads.increment()
                self.deduplicatedBytes.increment(by: Int64(clamping: result.size))
            }
        case .error(let error):
            if error.streamID == .connection {
                self.counter("upload_relay_connection_errors_total", ["code": error.code.name]).increment()
            } else {
                self.counter("upload_relay_upload_failures_total", ["code": error.code.name]).increment()
            }
        case .credit(let credit):
            self.creditGranted.increment(by: Int64(credit.increment))
        default:
            break
        }
    }

    /// A storage or catalog operation failed (`what`: write, sync, commit, record, lookup...).
    func failed(_ system: String, _ operation: String) {
        self.counter("upload_relay_\(system)_errors_total", ["operation": operation]).increment()
    }

    /// How long a catalog or store operation took.
    func took(_ system: String, _ operation: String, since start: ContinuousClock.Instant) {
        CoreMetrics.Timer(label: "upload_relay_\(system)_seconds", dimensions: [("operation", operation)], factory: self.factory)
            .recordInterval(since: start)
    }

    /// A post-commit hook run ended.
    func hookRan(failed: Bool) {
        self.counter("upload_relay_hook_runs_total", ["outcome": failed ? "failed" : "delivered"]).increment()
    }

    private func counter(_ label: String, _ labels: [String: String]) -> CoreMetrics.Counter {
        // The registry hands back the one counter of a name and label set each time.
        CoreMetrics.Counter(label: label, dimensions: labels.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }, factory: self.factory)
    }

    // MARK: Reading out

    /// Levels at the time of a scrape.
    public struct Levels: Sendable {
        public var connections = 0
        public var uploadsOpen = 0
        public var uploadSlots = 0
        public var memoryGranted = 0
        public var memoryBudget = 0
        public var diskFree: Int64?
        public var diskPromised: Int64 = 0
        public var storageFull = false
        /// Nil when the catalog did not answer.
        public var catalog: CatalogLevels?
        public var ready = false
    }

    /// Levels read from the catalog.
    public struct CatalogLevels: Sendable {
        public var hookQueue = 0
        public var hookOldest: Date?
        public var sessionsStaged = 0
        public var stagedBytes: Int64 = 0
    }

    func sample(_ levels: Levels, now: Date = Date()) {
        self.connectionsOpen.record(levels.connections)
        self.uploadsOpen.record(levels.uploadsOpen)
        if levels.uploadSlots < Int.max { self.uploadSlots.record(levels.uploadSlots) }
        self.memoryInUse.record(levels.memoryGranted)
        self.memoryBudget.record(levels.memoryBudget)
        if let free = levels.diskFree { self.diskFree.record(free) }
        self.diskPromised.record(levels.diskPromised)
        self.storageFull.record(levels.storageFull ? 1 : 0)
        if let catalog = levels.catalog {
            self.hookQueue.record(catalog.hookQueue)
            self.hookOldestSeconds.record(catalog.hookOldest.map { max(0, now.timeIntervalSince($0)) } ?? 0)
            self.sessionsStaged.record(catalog.sessionsStaged)
            self.sessionsStagedBytes.record(catalog.stagedBytes)
        }
        self.ready.record(levels.ready ? 1 : 0)
    }

    /// The metrics in Prometheus' text exposition format (version 0.0.4), each family with its HELP line.
    public func render() -> [UInt8] {
        // swift-metrics carries no help text: it is added here, before each family's TYPE line.
        let text = String(decoding: self.registry.emitToBuffer(), as: UTF8.self)
        var out = ""
        out.reserveCapacity(text.utf8.count + 4096)
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("# TYPE "), let name = line.dropFirst(7).split(separator: " ").first, let help = Self.help[String(name)] {
                out += "# HELP \(name) \(help)\n"
            }
            out += line
            out += "\n"
        }
        if out.hasSuffix("\n\n") { out.removeLast() }
        return Array(out.utf8)
    }

    /// What each family counts (the README's metrics table says the same).
    static let help: [String: String] = [
        "upload_relay_connections_accepted_total": "Agent connections accepted.",
        "upload_relay_connections_refused_total": "Agent connections closed at accept: too many, or shutting down.",
        "upload_relay_connections": "Agent connections open.",
        "upload_relay_connection_errors_total": "Connections closed with an ERROR frame, by wire code.",
        "upload_relay_received_bytes_total": "Bytes read from agents' connections (frames, after TLS).",
        "upload_relay_credit_granted_bytes_total": "Flow-control credit granted to agents, in bytes.",
        "upload_relay_durable_bytes_total": "Upload bytes made durable (fsync and catalog record) before their commit: what ACKs acknowledged.",
        "upload_relay_uploads_opened_total": "Uploads opened, by disposition: start (new) or resume (from durable bytes).",
        "upload_relay_uploads_committed_total": "Uploads committed: verified, durable and visible.",
        "upload_relay_committed_bytes_total": "Bytes of the uploads committed.",
        "upload_relay_uploads_deduplicated_total": "Uploads answered without their bytes: the relay held the same content.",
        "upload_relay_deduplicated_bytes_total": "Bytes agents did not send because the relay held them.",
        "upload_relay_upload_failures_total": "Uploads ended by an error, by wire code.",
        "upload_relay_sync_seconds": "Time to make an upload's bytes durable: fsync and catalog record.",
        "upload_relay_commit_seconds": "Time from an upload's HASH to its durable commit.",
        "upload_relay_commit_group_size": "Commits made durable together in one group.",
        "upload_relay_catalog_seconds": "Catalog operations' time, by operation.",
        "upload_relay_catalog_errors_total": "Catalog operations that failed, by operation.",
        "upload_relay_store_seconds": "Store operations' time, by operation.",
        "upload_relay_store_errors_total": "Store operations that failed, by operation.",
        "upload_relay_hook_runs_total": "Post-commit hook deliveries, by outcome.",
        "upload_relay_hook_events_queued": "Commit events waiting for the post-commit hooks.",
        "upload_relay_hook_oldest_event_age_seconds": "Age of the oldest commit event waiting for the hooks.",
        "upload_relay_uploads_open": "Uploads open now (each holds a staging file).",
        "upload_relay_uploads_open_limit": "The most uploads open at once (file descriptors).",
        "upload_relay_memory_granted_bytes": "Window bytes granted to connections from the memory budget.",
        "upload_relay_memory_budget_bytes": "The memory budget for chunk bytes of all connections (--memory-budget).",
        "upload_relay_disk_free_bytes": "Free bytes on the file system holding the staging directory.",
        "upload_relay_disk_promised_bytes": "Bytes open uploads may still write to staging.",
        "upload_relay_storage_full": "1 while free space is below the reserve and what open uploads will write.",
        "upload_relay_sessions_staged": "Upload sessions the catalog holds (in progress or resumable).",
        "upload_relay_sessions_staged_bytes": "Durable bytes of the staged sessions.",
        "upload_relay_ready": "1 when /readyz answers ready.",
    ]

    /// The content type of ``render()``.
    public static let contentType = "text/plain; version=0.0.4; charset=utf-8"
}

extension CoreMetrics.Timer {
    /// Records the time from `start` to now.
    func recordInterval(since start: ContinuousClock.Instant) {
        let elapsed = ContinuousClock.now - start
        let (seconds, attoseconds) = elapsed.components
        self.recordNanoseconds(seconds &* 1_000_000_000 &+ attoseconds / 1_000_000_000)
    }
}
