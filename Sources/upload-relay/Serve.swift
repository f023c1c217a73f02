import ArgumentParser
import Foundation
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import UploadCommandLine
import UploadPlatform
import UploadRelay
import UploadRelayBackends
import UploadRelayLocalStore
import UploadRelayS3Store
import UploadS3
import UnixSignals
import UploadProtocol

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the relay.",
        discussion: """
            The relay owns --data: the SQLite catalog (catalog.sqlite), staged uploads (staging/), \
            dev certificates (dev/) and, unless --store says otherwise, the objects: the object for \
            key K is the plain file <store>/K. SIGTERM or SIGINT stops it gracefully: agents get \
            GOAWAY, in-flight uploads become durable and are acknowledged, and it exits 0.

            With --store s3://BUCKET/PREFIX the objects go to an S3-compatible bucket instead, as \
            PREFIX/ACCOUNT/KEY: each upload is staged as a multipart upload (an acknowledgement means \
            the bytes are in an uploaded part) and committed with CompleteMultipartUpload, or one \
            PutObject when small, with If-None-Match: * unless the agent asked to overwrite; parts are at \
            least 5 MiB, so a graceful stop leaves the bytes since an upload's last part unacknowledged \
            (the agent sends them again). Keys come \
            from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the AWS_PROFILE profile of \
            ~/.aws/credentials. Example: --store s3://photos/relay --s3-endpoint http://127.0.0.1:8333
            """
    )

    @Option(name: .long, help: ArgumentHelp("Address to listen on.", valueName: "host:port"))
    var listen: String = "0.0.0.0:7443"

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Also serve the read-only HTTPS status endpoint here, on the same certificate: GET /v1/status?key=KEY or ?prefix=P, with the account's token as Authorization: Bearer TOKEN, answers {key, status: uploading|stored, bytes, size} from the catalog. Off unless given.",
            valueName: "host:port"
        )
    )
    var statusListen: String?

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Also serve plain HTTP here for operators: GET /metrics (Prometheus' text format), /healthz (the process answers) and /readyz (503 unless the catalog answers, the staging directory is writable, free space is above --min-free and the relay is not shutting down). No token: keep it on loopback or a private network. A port alone listens on 127.0.0.1. Off unless given.",
            valueName: "[host:]port"
        )
    )
    var metricsListen: String?

    @Flag(name: .long, help: "With --metrics-listen: count committed uploads and bytes per account (a label per account).")
    var metricsPerAccount = false

    @Option(name: .long, help: "With --status-listen: its connections at once.")
    var statusMaxConnections: Int = 256

    @Option(
        name: .long,
        help: ArgumentHelp(
            "With --status-listen: a connection closes when a request is not read and answered within this long of the connection opening (TLS handshake included) or of the previous answer being written.",
            valueName: "duration"
        )
    )
    var statusRequestTimeout: String = "30s"

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Directory the relay owns: its catalog, staged uploads and, by default, objects (or UPLOAD_RELAY_DATA). Required.", valueName: "dir")
    )
    var data: String?

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Read options from this JSON file first: keys are option names without dashes ({\"listen\": \"0.0.0.0:7443\", \"dev\": true}); UPLOAD_RELAY_<NAME> variables override it, the command line overrides both. Any option NAME may be read from a file as NAME-file (--catalog-file, \"catalog-file\", UPLOAD_RELAY_CATALOG_FILE), for secrets. See the README.",
            valueName: "file"
        )
    )
    var config: String?

    /// `--data`, else UPLOAD_RELAY_DATA (``validate()`` makes sure one is given).
    var dataDirectory: String { DataDirectory.resolve(self.data, environment: ProcessInfo.processInfo.environment) ?? "" }

    @Flag(
        name: .long,
        help:
            "Let the relay's group read what it creates (directories 0750, files 0640). By default its data, staged uploads and objects are private to its user (0700, 0600), whatever the umask."
    )
    var groupAccess = false

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Directory objects are committed to (default: <data>/store; must share a file system with --data), or s3://BUCKET[/PREFIX] for an S3-compatible bucket.",
            valueName: "dir|s3-url"
        )
    )
    var store: String?

    @Option(
        name: .long,
        help: ArgumentHelp("With an s3:// store: the S3 service's URL (default: AWS's, https://s3.<region>.amazonaws.com).", valueName: "url")
    )
    var s3Endpoint: String?

    @Option(
        name: .long,
        help: ArgumentHelp("With an s3:// store: the region requests are signed for (default: AWS_REGION, else us-east-1).", valueName: "region"))
    var s3Region: String?

    @Option(
        name: .long,
        help: ArgumentHelp("With an s3:// store: uploads of one commit group made objects at once (default 8).", valueName: "n"))
    var s3CommitsAtOnce: Int = S3StoreConfiguration.defaultCommitsAtOnce

    @Option(
        name: .long,
        help: ArgumentHelp(
            "After each commit, run this shell command with the object as JSON on stdin and in UPLOAD_ACCOUNT, UPLOAD_KEY, UPLOAD_SIZE, UPLOAD_SHA1, UPLOAD_LOCATION; exit 0 means done. Failures are logged and retried, never lost (the catalog keeps the event), and never hold uploads up.",
            valueName: "command"
        )
    )
    var onCommit: String?

    @Option(
        name: .long,
        help: ArgumentHelp(
            "After each commit, POST the same JSON to this http(s) URL; a 2xx answer means done, else it is retried.", valueName: "url"))
    var onCommitUrl: String?

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Pass this variable of the relay's environment to the --on-commit command (repeatable). A hook gets only PATH, HOME, LANG, LC_ALL, LC_CTYPE, TZ, TMPDIR, the UPLOAD_* of the event and these: never the relay's S3 keys or catalog URL unless named here.",
            valueName: "name"
        )
    )
    var hookEnv: [String] = []

    @Option(name: .long, help: ArgumentHelp("The longest a hook may run before it is killed and retried.", valueName: "duration"))
    var hookTimeout: String = "30s"

    @Option(name: .long, help: ArgumentHelp("Hook deliveries at once, per relay.", valueName: "n"))
    var hookConcurrency: Int = 4

    @Option(
        name: .long,
        help: ArgumentHelp(
            "A catalog several relays share, postgres://USER:PASSWORD@HOST:PORT/DATABASE[?sslmode=MODE&sslrootcert=CA.pem] (or UPLOAD_RELAY_CATALOG); MODE is libpq's: disable, allow, prefer (the default), require, verify-ca or verify-full; sslrootcert names the CA to verify the server by. Default: SQLite in --data.",
            valueName: "url"
        )
    )
    var catalog: String?

    @Option(name: .long, help: ArgumentHelp("Server certificate chain, PEM.", valueName: "file"))
    var cert: String?

    @Option(name: .long, help: ArgumentHelp("Server private key, PEM.", valueName: "file"))
    var key: String?

    @Flag(name: .long, help: "First try: make a private CA, a certificate for localhost and a token under <data>/dev/.")
    var dev = false

    @Option(
        name: .long,
        help: ArgumentHelp(
            "With --dev: another name or address agents reach this relay by, put in its certificate (repeatable). The listen address, or this host's name and addresses when listening on all, are in it already.",
            valueName: "name"
        )
    )
    var devHost: [String] = []

    @Option(name: .long, help: ArgumentHelp("Once listening, write host:port to this file (for scripts).", valueName: "file"))
    var readyFile: String?

    @Option(name: .long, help: ArgumentHelp("Log level: trace, debug, info, notice, warning, error.", valueName: "level"))
    var logLevel: String = "info"

    @Option(
        name: .long,
        help: ArgumentHelp(
            "text (one line per event, for people) or json (one object per line: time, level, label, message, source and each metadata key, for log shippers).",
            valueName: "text|json"
        )
    )
    var logFormat: String = "text"

    @Option(name: .long, help: ArgumentHelp("Acknowledge once this many bytes of an upload wait to be made durable.", valueName: "bytes"))
    var syncBytes: String = "8M"

    @Option(
        name: .long,
        help: ArgumentHelp(
            "The largest direct write: staging writes bypass the page cache (O_DIRECT) through aligned buffers of this size, shared by the writes under way, and each open upload keeps one 4 KiB block between writes; 0 writes through the page cache.",
            valueName: "bytes"
        )
    )
    var directIoBuffer: String = "1M"

    @Flag(name: .long, help: "Refuse deflated chunks (SPEC §9).")
    var noDeflate = false

    @Option(name: .long, help: ArgumentHelp("Credit of each upload: how far an agent may run ahead of storage (SPEC §5).", valueName: "bytes"))
    var streamWindow: String = "8M"

    @Option(name: .long, help: ArgumentHelp("Credit of each connection: the most chunk bytes it may hold in memory (SPEC §5).", valueName: "bytes"))
    var connectionWindow: String = "8M"

    @Option(name: .long, help: "Uploads open at once on one connection.")
    var maxStreams: Int = 64

    @Option(name: .long, help: "Authenticated connections at once (connections still authenticating have places of their own).")
    var maxConnections: Int = 512

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Connections from one address that have not authenticated yet, at once (as sshd's MaxStartups); more are refused at accept. Behind a balancer that hides the agents' addresses, raise it to the agents that may connect at once.",
            valueName: "n")
    )
    var maxStrangersPerSource: Int = 64

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Connections that have not authenticated yet, at once from all addresses; when full, the oldest is closed.", valueName: "n")
    )
    var maxStrangers: Int = 256

    @Option(
        name: .long,
        help:
            "Most uploads committed together (group commit: one catalog transaction and one directory sync for all). Commits never wait for a group to fill."
    )
    var commitGroup: Int = 256

    @Option(
        name: .long,
        help: "Threads for the relay's storage and catalog work (chunk checks, SHA-1, writes, fsyncs, commits, lookups)."
    )
    var ioThreads: Int = 4

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Most chunk bytes all connections together may make the relay hold; each connection's window is its share of it, resized as connections come and go.",
            valueName: "bytes"
        )
    )
    var memoryBudget: String = "32M"

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Socket reads of one connection per wakeup, each up to 64 KiB (fewer wakeups, more of one connection at a time).",
            valueName: "count"
        )
    )
    var readsPerWakeup: Int = 2

    @Option(name: .long, help: ArgumentHelp("OPENs of one connection looked up at once; the others wait, in order, as frames.", valueName: "count"))
    var lookupsPerConnection: Int = 8

    @Option(name: .long, help: ArgumentHelp("Close a connection that sends no whole frame for this long (SPEC §2.3).", valueName: "duration"))
    var idleTimeout: String = "120s"

    @Option(name: .long, help: ArgumentHelp("Close a connection when one frame takes longer than this to arrive (SPEC §2.3).", valueName: "duration"))
    var frameTimeout: String = "120s"

    @Option(name: .long, help: ArgumentHelp("Close a connection not authenticated within this time (SPEC §2.3).", valueName: "duration"))
    var handshakeTimeout: String = "10s"

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Keep this much free on the disk uploads are staged on: an upload whose bytes do not fit above it, with what the uploads open now will still write, is refused at its start (STORAGE_ERROR, \"storage is full; retry later\"), before a byte is staged. Default: 1G, or a twentieth of the disk when that is smaller. Files are kept free alike: a twentieth of the disk's inodes, at most 65,536, so that many small uploads cannot use up its inodes.",
            valueName: "bytes"
        )
    )
    var minFree: String?

    @Option(
        name: .long,
        help: ArgumentHelp("Delete unfinished uploads untouched for this long, with their staged bytes (SPEC §6.6).", valueName: "duration"))
    var sessionExpiry: String = "24h"

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Unfinished uploads one account may have (each holds a staging file); a new upload past it is refused with QUOTA_EXCEEDED until some finish, are cancelled or expire.",
            valueName: "n")
    )
    var maxUnfinishedUploads: Int = 1000

    /// Every usage error before anything is created, with `serve`'s usage: the options that go together, then every
    /// value, through the one function that turns them into the relay's configuration (``relayConfiguration()``).
    func validate() throws {
        guard DataDirectory.resolve(self.data, environment: ProcessInfo.processInfo.environment) != nil else { throw DataDirectory.missing }
        guard (self.cert == nil) == (self.key == nil) else {
            throw ValidationError("--cert and --key go together")
        }
        guard self.dev || self.cert != nil else {
            throw ValidationError("the relay needs a certificate: pass --cert and --key, or --dev for a first try")
        }
        guard Logger.Level(rawValue: self.logLevel) != nil else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error")
        }
        guard ["text", "json"].contains(self.logFormat) else {
            throw ValidationError("--log-format must be text or json")
        }
        _ = try self.relayConfiguration()
        _ = try self.s3Store()
    }

    func run() async throws {
        // From the first moment: SIGHUP's default would end a relay still starting (waiting for its catalog, say) when a
        // certificate renewal signals it. One that comes before the listeners are up reloads once they are.
        let hangup = await Hangup()
        let level = Logger.Level(rawValue: self.logLevel) ?? .info
        let json = self.logFormat == "json"
        LoggingSystem.bootstrap { label in
            if json {
                var handler = JSONLogHandler.standardError(label: label)
                handler.logLevel = level
                return handler
            }
            // Peers' words reach the text log escaped (SPEC §12.4); JSON quotes them.
            var handler = PrintableLogHandler(StreamLogHandler.standardError(label: label))
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "upload-relay")
        // Before anything is created: a bad value, or missing S3 keys, is a usage error.
        var configuration = try self.relayConfiguration()
        let host = configuration.host
        let modes = configuration.fileModes
        // What the libraries and hooks create, too, gets no more than the relay's own modes.
        umask(modes.umask)
        let catalogURL = self.catalog ?? ProcessInfo.processInfo.environment["UPLOAD_RELAY_CATALOG"]
        let catalog: any Catalog
        do {
            catalog = try await RelayRuntime.openCatalog(dataDirectory: self.dataDirectory, url: catalogURL, logger: logger, modes: modes)
        } catch let error as CatalogError where error.isUnavailable {
            throw ValidationError("--catalog: \(error)")
        }
        var certificate = self.cert
        var privateKey = self.key
        let everyAddress = ["0.0.0.0", "::", "*"].contains(host)
        let localNames = everyAddress ? DevCertificates.localNames() : []
        var devSetup: RelayRuntime.DevSetup? = nil
        if self.dev {
            let names = (everyAddress ? localNames : [host]) + self.devHost
            let setup = try await RelayRuntime.prepareDev(dataDirectory: self.dataDirectory, catalog: catalog, names: names)
            if certificate == nil {
                certificate = setup.paths.serverCertificate
                privateKey = setup.paths.serverKey
            }
            devSetup = setup
        }
        guard let certificatePath = certificate, let keyPath = privateKey else {
            throw ValidationError("the relay needs a certificate: pass --cert and --key, or --dev for a first try")
        }
        configuration.certificatePath = certificatePath
        configuration.privateKeyPath = keyPath
        do {
            try RelayServer.checkCertificate(configuration)
        } catch {
            FileHandle.standardError.write(Data("upload-relay: \(error)\n".utf8))
            throw ExitCode(1)
        }
        let relay = try await RelayRuntime.makeRelay(configuration: configuration, s3: try self.s3Store(), catalog: catalog, logger: logger)
        let group = MultiThreadedEventLoopGroup(numberOfThreads: System.coreCount)
        let server = try RelayServer(relay: relay, group: group)
        let statusServer = try configuration.status.map { try RelayStatusServer(relay: relay, endpoint: $0, group: group) }
        let operationsServer = try configuration.operations.map { try RelayStatusServer(relay: relay, endpoint: $0, group: group) }
        // Every listener is bound before the relay says it is ready: an address in use ends the start here, with the
        // address named, instead of a relay serving without one of its endpoints.
        let address: SocketAddress
        do {
            address = try await server.bind()
        } catch {
            await Self.stop(relay: relay, group: group)
            throw Self.listenFailure(error, option: "--listen", address: self.listen)
        }
        if let statusServer, let status = self.statusListen {
            do {
                try await statusServer.bind()
            } catch {
                server.shutdown()
                await Self.stop(relay: relay, group: group)
                throw Self.listenFailure(error, option: "--status-listen", address: status)
            }
        }
        if let operationsServer, let metrics = self.metricsListen {
            do {
                try await operationsServer.bind()
            } catch {
                server.shutdown()
                statusServer?.shutdown()
                await Self.stop(relay: relay, group: group)
                throw Self.listenFailure(error, option: "--metrics-listen", address: metrics)
            }
        }
        if let port = address.port {
            if let devSetup {
                // Agents elsewhere reach a relay on every address by this host's first address, not by 127.0.0.1.
                let shownHost = everyAddress ? (localNames.first(where: { DevCertificates.isIPAddress($0) }) ?? "127.0.0.1") : host
                Self.printDevHelp(devSetup, host: shownHost, port: port)
            }
            if let readyFile = self.readyFile {
                let text = "\(address.ipAddress ?? host):\(port)\n"
                let temporary = readyFile + ".tmp"
                _ = FileManager.default.createFile(atPath: temporary, contents: Data(text.utf8))
                _ = rename(temporary, readyFile)
            }
        }
        // SIGHUP: the certificate and key are read again (a renewal); connections open keep theirs.
        let reloader = ReloadOnHangup(hangup: hangup) {
            do {
                try server.reloadCertificate()
                try statusServer?.reloadCertificate()
                logger.notice("certificate reloaded (SIGHUP): new connections get it", metadata: ["certificate": "\(certificatePath)"])
            } catch {
                logger.error(
                    "could not reload the certificate (SIGHUP); the old one stays",
                    metadata: ["certificate": "\(certificatePath)", "error": "\(error)"]
                )
            }
        }
        let group2 = ServiceGroup(
            configuration: .init(
                services: [
                    .init(service: server, failureTerminationBehavior: .gracefullyShutdownGroup)
                ]
                    + [statusServer, operationsServer].compactMap { $0 }.map {
                        .init(service: $0, successTerminationBehavior: .gracefullyShutdownGroup, failureTerminationBehavior: .gracefullyShutdownGroup)
                    }
                    // Last: the first to stop at shutdown, so that no reload runs while the servers close.
                    + [.init(service: reloader, successTerminationBehavior: .ignore, failureTerminationBehavior: .ignore)],
                gracefulShutdownSignals: [.sigterm, .sigint], logger: logger
            )
        )
        try await group2.run()
        try await relay.threadPool.shutdownGracefully()
        try await group.shutdownGracefully()
    }

    /// `--metrics-listen`: HOST:PORT, or a port alone on loopback.
    static func metricsAddress(_ text: String) throws -> (String, Int) {
        if let port = Int(text) {
            guard (0...65535).contains(port) else { throw ValidationError("--metrics-listen \"\(text)\" is not a port (0 to 65535)") }
            return ("127.0.0.1", port)
        }
        return try HostPort.parse(text, option: "--metrics-listen")
    }

    /// A listener that could not be bound, said so that the operator can act: which option, which address, why.
    static func listenFailure(_ error: any Error, option: String, address: String) -> any Error {
        let reason: String
        if let io = error as? IOError {
            reason =
                String(cString: strerror(io.errnoCode))
                + (io.errnoCode == EADDRINUSE ? " (another process listens there: stop it, or choose another port)" : "")
        } else {
            reason = "\(error)"
        }
        FileHandle.standardError.write(Data("upload-relay: cannot listen on \(address) (\(option)): \(reason)\n".utf8))
        return ExitCode(1)
    }

    /// Lets the I/O threads and event loops go when the relay stops before it ran.
    static func stop(relay: Relay, group: MultiThreadedEventLoopGroup) async {
        try? await relay.threadPool.shutdownGracefully()
        try? await group.shutdownGracefully()
    }

    static func printDevHelp(_ setup: RelayRuntime.DevSetup, host: String, port: Int) {
        let relay = host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        var text = "upload-relay --dev: CA \(setup.paths.caCertificate), token in \(setup.paths.token)"
        text += setup.createdToken ? " (new)\n" : "\n"
        text +=
            "  certificate for: \((try? String(contentsOfFile: setup.paths.serverNames, encoding: .utf8))?.split(separator: "\n").joined(separator: ", ") ?? "localhost")\n"
        text +=
            "  upload with: upload-agent send --relay \(relay) --ca \(setup.paths.caCertificate) --token \"$(cat \(setup.paths.token))\" FILE...\n"
        FileHandle.standardError.write(Data(text.utf8))
    }
}
