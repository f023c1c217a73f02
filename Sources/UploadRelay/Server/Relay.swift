import Logging
import NIOConcurrencyHelpers
import NIOPosix
import UploadProtocol

/// One relay's parts, wired once (``RelayRuntime/makeRelay(configuration:catalog:store:threadPool:logger:metrics:)``,
/// which `upload-relay serve` and the tests' relay both call): the servers take from it what their connections are
/// given. Nothing below the servers holds it: a connection gets ``RelayConnectionDependencies``, an upload's
/// storage ``UploadStorage/Context``, the group commit its committer, the status endpoint ``RelayHealth``.
public final class Relay: Sendable {
    public let configuration: RelayConfiguration
    public let catalog: any Catalog
    public let store: any BlobStore
    public let threadPool: NIOThreadPool
    /// Where the relay's tasks run: the threads of ``threadPool``.
    package let executor: RelayExecutor
    public let logger: Logger
    /// Keys with an upload in progress on any connection: a second one gets KEY_BUSY.
    package let claims: KeyClaims
    /// Chunk bytes the connections' windows may make the relay hold, all together.
    package let memory: ResourceBudget
    /// Uploads open at once (each holds its staging file's descriptor).
    package let uploadSlots: UploadSlots
    /// The relay's disk: what open uploads will still stage there, above the free-space reserve.
    package let space: StorageSpace
    /// The rules for OPEN, PLAN and commit.
    package let policy: UploadPolicy
    /// Commits of all connections, made durable in groups.
    let commits: CommitGroup
    /// Told when commits queued events for the post-commit hooks (the hook runner listens while it runs).
    let commitEvents: CommitEventSignal
    /// What the relay counts, read out on `/metrics`.
    public let metrics: RelayMetrics
    /// `/readyz` and the levels of `/metrics`.
    public let health: RelayHealth

    public convenience init(
        configuration: RelayConfiguration, catalog: any Catalog, store: any BlobStore, threadPool: NIOThreadPool, logger: Logger,
        metrics: RelayMetrics = RelayMetrics()
    ) {
        self.init(
            configuration: configuration, catalog: catalog, store: store, threadPool: threadPool, logger: logger, metrics: metrics,
            measureSpace: StorageSpace.look
        )
    }

    /// `measureSpace` tells the free bytes, size and inodes of the file system holding a directory (tests give their own).
    /// The configuration is narrowed to what the store can do: no stripes offered on a store without them, no blob
    /// above its largest object.
    init(
        configuration: RelayConfiguration, catalog: any Catalog, store: any BlobStore, threadPool: NIOThreadPool, logger: Logger,
        metrics: RelayMetrics = RelayMetrics(), measureSpace: @escaping @Sendable (String) -> StorageSpace.Look?
    ) {
        var configuration = configuration
        let capabilities = store.capabilities
        configuration.allowStripes = configuration.allowStripes && capabilities.stripes
        configuration.maxBlobSize = min(configuration.maxBlobSize, capabilities.largestObject)
        self.configuration = configuration
        self.metrics = metrics
        self.catalog = catalog
        self.store = store
        self.threadPool = threadPool
        let executor = RelayExecutor(pool: threadPool)
        self.executor = executor
        self.logger = logger
        self.claims = KeyClaims(locks: catalog.keyLocks)
        self.memory = ResourceBudget(total: configuration.memoryBudget)
        self.uploadSlots = UploadSlots(total: configuration.maxOpenUploads ?? Int.max, floor: configuration.limits.maxConcurrentStreams)
        self.space = StorageSpace(
            directory: store.localSpace(forBlobOf: 0).directory, reserve: configuration.minFreeBytes, logger: logger, measure: measureSpace
        )
        self.commitEvents = CommitEventSignal()
        let policy = UploadPolicy(
            configuration: configuration, catalog: catalog, store: store, claims: self.claims, space: self.space, executor: executor,
            logger: logger, commitEvents: self.commitEvents
        )
        self.policy = policy
        self.commits = CommitGroup(maxGroup: configuration.commitGroup, executor: executor, metrics: metrics) { requests in
            await policy.commit(requests)
        }
        self.health = RelayHealth(
            catalog: catalog, metrics: metrics, space: self.space, memory: self.memory, uploadSlots: self.uploadSlots, executor: executor,
            logger: logger
        )
    }

    /// What every connection's handler is given.
    package var connectionDependencies: RelayConnectionDependencies {
        RelayConnectionDependencies(
            resources: RelaySessionResources(
                configuration: self.configuration, claims: self.claims, memory: self.memory, uploadSlots: self.uploadSlots),
            policy: self.policy,
            storage: UploadStorage.Context(catalog: self.catalog, store: self.store, commits: self.commits, space: self.space, metrics: self.metrics),
            executor: self.executor, metrics: self.metrics, health: self.health
        )
    }
}

/// Told when commits queued events for the post-commit hooks: the hook runner, while it runs, is the one told.
package final class CommitEventSignal: Sendable {
    private let listener = NIOLockedValueBox<(@Sendable () -> Void)?>(nil)

    /// Sets (or, with nil, clears) who is told.
    func listen(_ listener: (@Sendable () -> Void)?) {
        self.listener.withLockedValue { $0 = listener }
    }

    func signal() {
        self.listener.withLockedValue { $0 }?()
    }
}
