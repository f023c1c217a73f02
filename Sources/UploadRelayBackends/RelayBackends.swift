#if canImport(Glibc)
import Glibc
#endif
import AsyncHTTPClient
import Logging
import NIOCore
import NIOPosix
import UploadRelay
import UploadRelayLocalStore
import UploadRelayPostgres
import UploadRelayS3Store
import UploadRelaySQLite
import UploadS3
import NIOHTTP1

/// The relay put together from its configuration: which catalog and which store, the only place that knows every
/// backend. The relay's core (``RelayRuntime``, the server) sees them through ``Catalog`` and ``BlobStore`` alone.
extension RelayRuntime {
    /// Opens the SQLite catalog in `dataDirectory`, creating the directory (and the catalog's file, which its journal
    /// files take their mode from) with `modes`.
    public static func openCatalog(dataDirectory: String, modes: FileModes = .private) throws -> SQLiteCatalog {
        try Self.makeDataDirectory(dataDirectory, modes: modes)
        let path = dataDirectory + "/catalog.sqlite"
        // SQLite creates its file (and gives its -wal and -shm files the same mode) as 0644 less the umask: made first,
        // with the relay's mode, it is private whatever the umask.
        let fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, modes.file)
        if fd >= 0 { close(fd) }
        return try SQLiteCatalog(path: path)
    }

    /// The catalog `url` names (`postgres://...`: ``PostgresCatalog``), or the SQLite catalog in `dataDirectory` when nil.
    public static func openCatalog(
        dataDirectory: String, url: String?, logger: Logger, modes: FileModes = .private
    ) async throws -> any Catalog {
        guard let url else { return try Self.openCatalog(dataDirectory: dataDirectory, modes: modes) }
        try Self.makeDataDirectory(dataDirectory, modes: modes)
        return try await PostgresCatalog(url: url, logger: logger)
    }

    /// Creates the data directory (and its missing parents) with `modes`; one that exists is left as it is.
    static func makeDataDirectory(_ path: String, modes: FileModes) throws {
        do {
            try FileSystem.makeDirectories(path, mode: modes.directory)
        } catch {
            throw CatalogError.unavailable("cannot create the data directory \(path): \(error) (choose another with --data)")
        }
    }

    /// Wires the relay's parts on the store the configuration names, or on the bucket `s3` names (whose
    /// capabilities may narrow it: an S3 store takes no stripes, and no blob above S3's largest object).
    public static func makeRelay(
        configuration: RelayConfiguration, s3: S3StoreConfiguration? = nil, catalog: any Catalog, logger: Logger
    ) async throws -> Relay {
        var configuration = configuration
        if configuration.hooks?.url != nil && configuration.hooks?.poster == nil { configuration.hooks?.poster = HTTPHookPoster() }
        // The store's system calls run on the relay's I/O pool.
        let pool = NIOThreadPool(numberOfThreads: configuration.ioThreads)
        pool.start()
        do {
            let store = try Self.openStore(configuration, s3: s3, catalog: catalog, logger: logger, threadPool: pool)
            return try await Self.makeRelay(configuration: configuration, catalog: catalog, store: store, logger: logger, threadPool: pool)
        } catch {
            try? await pool.shutdownGracefully()
            throw error
        }
    }

    /// The S3 bucket `s3` names, else the local directory the configuration names. The admin commands (`rm`, `token
    /// delete`) open the same as `serve`. Its system calls run on `threadPool`.
    public static func openStore(
        _ configuration: RelayConfiguration, s3: S3StoreConfiguration? = nil, catalog: any Catalog, logger: Logger,
        threadPool: NIOThreadPool = .singleton
    ) throws -> any BlobStore {
        if let s3 {
            if s3.prefix.isEmpty {
                logger.warning(
                    "the S3 store has no prefix: objects go at the top of the bucket; share the bucket with nothing else, or give --store s3://BUCKET/PREFIX",
                    metadata: ["s3.bucket": "\(s3.bucket)"]
                )
            }
            let client = S3Client(endpoint: s3.endpoint, credentials: s3.credentials, http: HTTPClient.shared)
            return try S3Store(
                client: client, bucket: s3.bucket, prefix: s3.prefix, spoolDirectory: configuration.spoolDirectory,
                minPartBytes: s3.minPartBytes, modes: configuration.fileModes, ledger: catalog as? any MultipartLedger, logger: logger,
                threadPool: threadPool, commitsAtOnce: s3.commitsAtOnce
            )
        }
        return try LocalDirectoryStore(
            root: configuration.storePath, stagingDirectory: configuration.stagingDirectory, directBuffer: configuration.directIOBuffer,
            modes: configuration.fileModes, threadPool: threadPool
        )
    }
}

/// URL hooks' POSTs on AsyncHTTPClient's shared client.
struct HTTPHookPoster: HookPoster {
    func post(url: String, authorization: String?, json: [UInt8], timeout: Duration) async throws -> Int {
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: "Content-Type", value: "application/json")
        request.headers.add(name: "User-Agent", value: "upload-relay")
        if let authorization { request.headers.add(name: "Authorization", value: authorization) }
        request.body = .bytes(ByteBuffer(bytes: json))
        let response = try await HTTPClient.shared.execute(request, timeout: TimeAmount(timeout))
        _ = try? await response.body.collect(upTo: 1 << 16)
        return Int(response.status.code)
    }
}
