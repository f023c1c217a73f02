import Logging
import NIOConcurrencyHelpers
import NIOPosix
import UploadProtocol

/// What every connection of one relay shares. Sendable: handlers on many event loops hold it.
public final class RelayServices: Sendable {
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
    /// Commits of all connections, made durable in groups.
    let commits: CommitGroup
    /// The relay's disk: what open uploads will still stage there, above the free-space reserve.
    package let space: StorageSpace
    /// Told when commits queued events for the post-commit hooks (set by the server that runs them).
    let commitEventsQueued = NIOLockedValueBox<(@Sendable () -> Void)?>(nil)
    /// Connection handlers alive now: one per connection, freed once its channel closed and its storage let go.
    let liveHandlers = NIOLockedValueBox(0)
    /// What the relay counts, read out on `/metrics`.
    public let metrics: RelayMetrics
    /// The relay is shutting down: `/readyz` says so, for the balancer to send new agents elsewhere.
    let draining = NIOLockedValueBox(false)
    /// The catalog reads of `/readyz` and `/metrics`, bounded in time and threads.
    let catalogProbe = CatalogProbe()

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
        self.executor = RelayExecutor(pool: threadPool)
        self.logger = logger
        self.claims = KeyClaims(locks: catalog.keyLocks)
        self.memory = ResourceBudget(total: configuration.memoryBudget)
        self.uploadSlots = UploadSlots(total: configuration.maxOpenUploads ?? Int.max, floor: configuration.limits.maxConcurrentStreams)
        self.commits = CommitGroup(maxGroup: configuration.commitGroup)
        self.space = StorageSpace(
            directory: store.localSpace(forBlobOf: 0).directory, reserve: configuration.minFreeBytes, logger: logger, measure: measureSpace
        )
    }

}
