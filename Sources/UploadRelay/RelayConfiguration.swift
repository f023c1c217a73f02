import Foundation
import UploadProtocol

/// Everything `upload-relay serve` can be told, typed (the CLI only fills this in).
public struct RelayConfiguration: Sendable {
    /// Where to listen. Port 0 picks a free port (see ``RelayServer/localAddress``).
    public var host: String = "0.0.0.0"
    public var port: Int = 7443

    /// PEM files of the server certificate chain and its private key.
    public var certificatePath: String
    public var privateKeyPath: String

    /// The directory the relay owns: `catalog.sqlite`, `staging/`, `dev/`, and `store/` unless ``storePath`` says otherwise.
    public var dataDirectory: String
    /// The directory objects are committed to; the object for key K of account A is the file `<store>/A/K`.
    public var storePath: String

    /// The modes of what the relay creates: private to its user by default (directories 0700, files 0600).
    public var fileModes: FileModes = .private

    /// What runs after each commit (`--on-commit`, `--on-commit-url`); nil: nothing, and no events are queued.
    public var hooks: CommitHooks? = nil
    /// The HTTPS status endpoint (`--status-listen`); nil: none.
    public var status: StatusEndpoint? = nil
    /// The plain-HTTP operations endpoint, `/metrics`, `/healthz`, `/readyz` (`--metrics-listen`); nil: none.
    public var operations: StatusEndpoint? = nil
    /// Whether committed uploads and bytes are counted per account in the metrics (`--metrics-per-account`).
    public var metricsPerAccount = false
    /// Whether agents may send one blob as stripes on several streams (SPEC §6.7). An S3 store does not take stripes.
    public var allowStripes = true

    /// Wire limits announced in WELCOME and enforced by the codec (SPEC §12).
    public var limits = ProtocolLimits()
    /// Whether agents may deflate chunks (SPEC §9).
    public var allowDeflate = true

    /// Acknowledge (fsync + catalog) once this many bytes of a stream are unacknowledged.
    public var syncBytes: Int = 8 << 20
    /// …or once the oldest unacknowledged byte has waited this long.
    public var syncInterval: Duration = .milliseconds(250)

    /// Staging writes bypass the page cache (Linux `O_DIRECT`), each write at once, through aligned buffers of this
    /// many bytes that the writes under way borrow (one per I/O thread at most); each open upload
    /// keeps one 4 KiB block between writes. 0 writes through the page cache. Where the file system refuses direct
    /// I/O the relay falls back to plain writes by itself.
    public var directIOBuffer: Int = RelayConfiguration.defaultDirectIOBuffer
    /// The local store's default ``directIOBuffer``: 1 MiB.
    public static let defaultDirectIOBuffer = 1 << 20

    /// The most authenticated connections at once; one more is closed when it authenticates.
    public var maxConnections: Int = 512
    /// What connections that have not authenticated may hold, beside the ``maxConnections`` places (sshd's
    /// `MaxStartups`): 64 from one source address at once (more are refused at accept), 256 in all (the oldest is
    /// closed to admit a new one). Behind a balancer that does not pass the client's address, every agent comes from
    /// the balancer's: raise ``StrangerLimits/perSource`` to the agents that may connect at once.
    public var strangers = StrangerLimits(perSource: 64, total: 256)
    /// The most chunk bytes all connections together may make the relay hold. Each connection's window is a share of
    /// it (SPEC §5.5): the budget divided among the connections, no more than ``ProtocolLimits/connectionWindow`` and
    /// never less than ``minimumConnectionWindow``. A connection starts with its share while the budget has it free,
    /// else with the floor, and moves toward its share each time storage consumes its bytes, so the connections that
    /// came first give back what later ones need. Default 32 MiB: four connections' whole windows, or eight halves
    /// (4 MiB each, about what a connection carries over a round trip of 100 ms with Linux's socket buffers). More
    /// mostly holds chunks waiting for a slow disk; less slows uploads over long links, whose rate is a window per
    /// round trip (docs/benchmarks.md, `tools/bench-many.sh`).
    public var memoryBudget: Int = 32 << 20
    /// Reads of one connection's socket per wakeup of its event loop (NIO's `maxMessagesPerRead`), each of up to
    /// 64 KiB. TLS hands on each read's plaintext before the next (`ReadCycleSplitter`), so a connection's plaintext
    /// buffer holds one read whatever this is. Default 2: one read per wakeup pays a wakeup per 64 KiB, and many let
    /// one busy connection delay the others of its event loop for no gain in CPU (`tools/cpu-per-gib.sh`).
    public var readsPerWakeup: Int = 2
    /// OPENs of one connection looked up at once (catalog reads, the quota decision, the staging file opened); the
    /// others wait, in order, as frames. Default 8: one agent's small files keep the relay's I/O threads busy, and the OPENs
    /// of 100 agents at once wait as frames, not as one task each.
    public var lookupsPerConnection: Int = 8
    /// The smallest connection window a connection is given when the memory budget is spent: agents are slowed, never
    /// refused. Default 128 KiB; never below 64 KiB (SPEC §5.5).
    public var minimumConnectionWindow: Int = 128 << 10
    /// The most uploads open at once relay-wide, each holding a file descriptor for its staging file; past it an OPEN
    /// is answered REFUSED_STREAM (the agent retries). Nil: derived at start from the descriptor limit (RLIMIT_NOFILE,
    /// raised to its hard limit) less one per connection and a reserve.
    public var maxOpenUploads: Int? = nil
    /// The most uploads committed together by one group commit (one catalog transaction to reserve, one per
    /// directory to sync, one to record). Commits never wait for a group to fill.
    public var commitGroup: Int = 256
    /// Threads of the relay's I/O pool: its tasks run there (``RelayExecutor``), and the local store's system calls.
    public var ioThreads: Int = 4
    /// How long GOAWAY waits for in-flight uploads to reach a durable point before closing.
    public var shutdownGrace: Duration = .seconds(10)
    /// A connection that has sent nothing but PINGs for this long, has no upload open and holds more than its fair share
    /// of the memory budget is asked to go (GOAWAY) while the budget cannot give every connection a whole window: the
    /// credit it holds cannot be taken back otherwise (SPEC §5.5), and uploads of other connections wait for it.
    public var idleShareTimeout: Duration = .seconds(5)
    /// Unfinished uploads untouched this long are deleted with their staging files (SPEC §6.6), checked at start and
    /// then every ``maintenanceInterval``.
    public var sessionExpiry: Duration = .seconds(86400)
    /// How often the relay looks for revoked tokens (their live connections close) and expired sessions.
    public var maintenanceInterval: Duration = .seconds(2)
    /// Bytes the relay keeps free on the disk it stages uploads on: an OPEN whose bytes do not fit above it (with what
    /// the uploads open now will still write) is refused with STORAGE_ERROR, before a byte is staged (SPEC §7). Nil: 1 GiB,
    /// or a twentieth of the file system when that is smaller.
    public var minFreeBytes: Int64? = nil
    /// The most unfinished uploads one account may have recorded (each holds a staging file, an inode of the disk
    /// every account shares): a new upload past it is refused QUOTA_EXCEEDED, saying so; resuming one is not (SPEC §7).
    public var maxUnfinishedUploads: Int = 1000
    /// The largest blob accepted (SPEC §10, TOO_LARGE).
    public var maxBlobSize: Int64 = 1 << 50

    public init(certificatePath: String, privateKeyPath: String, dataDirectory: String, storePath: String? = nil) {
        self.certificatePath = certificatePath
        self.privateKeyPath = privateKeyPath
        self.dataDirectory = dataDirectory
        self.storePath = storePath ?? dataDirectory + "/store"
    }

    public var catalogPath: String { self.dataDirectory + "/catalog.sqlite" }
    /// Where an S3 store spools the bytes since an upload's last part.
    public var spoolDirectory: String { self.dataDirectory + "/spool" }
    public var stagingDirectory: String { self.dataDirectory + "/staging" }
}

/// Post-commit hooks: a command, a URL, or both, given each committed object as JSON. Each event waits in
/// the catalog's outbox, queued by the commit's own transaction, until every hook took it: a failing or hung hook is
/// retried (the delay doubling from ``retryDelay`` up to ``maxRetryDelay``) and logged, never lost, and never holds
/// an upload up.
public struct CommitHooks: Sendable {
    /// Run by `/bin/sh -c`, the event as JSON on its stdin and in `UPLOAD_*` variables; exit 0 means taken.
    public var command: String?
    /// POSTed the event as JSON; a 2xx answer means taken. A user and password in it go as HTTP Basic authentication;
    /// messages and the catalog show it without them and without its query.
    public var url: String?
    /// Names of the relay's environment variables a hook command also gets, beside ``baseEnvironment`` and the
    /// `UPLOAD_*` of the event (`--hook-env`): nothing else of the relay's environment (its S3 keys, its catalog URL)
    /// reaches a hook.
    public var environment: [String] = []
    /// What every hook command gets of the relay's environment.
    public static let baseEnvironment = ["PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR"]
    /// The longest a hook may run: then its process group gets SIGTERM, and SIGKILL ``killGrace`` later.
    public var timeout: Duration = .seconds(30)
    /// How long a hook told to stop (SIGTERM) has before SIGKILL.
    public var killGrace: Duration = .seconds(2)
    /// Events delivered at once by one relay.
    public var concurrency: Int = 4
    public var retryDelay: Duration = .seconds(1)
    public var maxRetryDelay: Duration = .seconds(300)
    /// How often the outbox is looked at when no commit said so (events other relays queued, retries due).
    public var pollInterval: Duration = .seconds(1)
    /// How a ``url`` hook's event is POSTed. The relay's core holds no HTTP client: `RelayRuntime.makeServices` of
    /// UploadRelayBackends gives one (on AsyncHTTPClient) when this is nil.
    public var poster: (any HookPoster)? = nil

    public init(command: String? = nil, url: String? = nil) {
        self.command = command
        self.url = url
    }
}

/// The read-only HTTPS endpoint an app polls for its account's uploads (those in progress too, visible to the account's
/// other clients):
/// `GET /v1/status?key=KEY` or `?prefix=P`, with the account's token as `Authorization: Bearer TOKEN`. It serves the
/// relay's certificate, and reads the catalog, so every relay sharing one answers for every upload.
public struct StatusEndpoint: Sendable {
    /// What a listener serves.
    public struct Routes: OptionSet, Sendable, Hashable {
        public let rawValue: Int
        public init(rawValue: Int) { self.rawValue = rawValue }

        /// `GET /v1/status`: an account's keys, for its token.
        public static let status = Routes(rawValue: 1 << 0)
        /// `GET /healthz` (alive) and `GET /readyz` (fit for new agents), for anyone: probes carry no token.
        public static let health = Routes(rawValue: 1 << 1)
        /// `GET /metrics`, Prometheus' text format, for anyone who reaches the listener (loopback by default).
        public static let metrics = Routes(rawValue: 1 << 2)
    }

    public var host: String
    /// Port 0 picks a free port (see ``RelayStatusServer/waitUntilListening()``).
    public var port: Int
    /// What this listener serves: the status endpoint serves status and health over TLS, the operations endpoint
    /// (`--metrics-listen`) metrics and health in plain HTTP.
    public var routes: Routes = [.status, .health]
    /// Whether connections speak TLS first (on the relay's certificate).
    public var tls = true
    /// The most connections at once; more are closed at accept. No connection here authenticates as a whole (each
    /// request carries its token): all are strangers, at most ``StrangerLimits/perSource`` from one source address.
    public var maxConnections: Int = 256
    /// The most connections from one source address at once; more are refused at accept.
    public var maxConnectionsPerSource: Int = 32
    /// A connection closes when a request is not read and answered, its answer written to the socket, within this long
    /// of the connection opening (TLS handshake included) or of the previous answer's being written.
    public var requestTimeout: Duration = .seconds(30)
    /// The most requests one connection may send ahead of the answers it has not yet read (HTTP pipelining); past it the
    /// connection closes. Requests are answered one at a time, and the connection is not read while one is answered or
    /// while its answers are not being read, so this bounds what a client that never reads can make the relay hold.
    public var maxPipelinedRequests: Int = 16
    /// The most keys one listing answers (its `limit` at most).
    public var maxListed: Int = 1000
    /// The most bytes of a request's URI and headers (each, and all together); a longer request is answered 400.
    public var maxHeadBytes: Int = 16 << 10
    /// The most headers in a request; more are answered 400.
    public var maxHeaders: Int = 100
    /// The most bytes one connection's HTTP decoder holds unparsed (requests sent ahead, a head in pieces); past it the
    /// connection closes.
    public var maxBufferedBytes: Int = 64 << 10
    /// How long a connection the relay closes waits for the client's TLS close_notify.
    public var tlsShutdownTimeout: Duration = .seconds(1)
    /// Requests carry no body; one longer than this is refused and its connection closed.
    public var maxBody: Int = 4096

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// The operations endpoint: `/metrics`, `/healthz` and `/readyz` in plain HTTP.
    public static func operations(host: String, port: Int) -> StatusEndpoint {
        var endpoint = StatusEndpoint(host: host, port: port)
        endpoint.routes = [.metrics, .health]
        endpoint.tls = false
        endpoint.maxConnections = 64
        endpoint.maxConnectionsPerSource = 16
        return endpoint
    }
}
