import ArgumentParser
import Foundation
import Logging
import NIOCore
import NIOPosix
import UploadAgent
import UploadCommandLine

struct Send: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Upload files, directories or stdin to a relay.",
        discussion: """
            PATH is a file (stored under its base name), a directory (walked recursively; keys are \
            paths relative to the directory's parent, so `send photos` stores photos/a/b.jpg), or - \
            for standard input together with --name KEY.

            Every item is checked end to end: a CRC32 per chunk and the SHA-1 of the whole blob; the \
            relay commits it atomically and only then reports it stored. When the connection drops \
            or the relay restarts, the agent reconnects (for --retry-for) and resumes from the \
            relay's durable offset; running the same command again after the agent was stopped \
            resumes too. A file the relay already holds (same size and SHA-1) is not sent again.

            Environment: UPLOAD_RELAY, UPLOAD_TOKEN and UPLOAD_CA stand in for --relay, --token and --ca.

            Exit status: 0 when every item was stored or deduplicated, 1 when any failed, 2 for a usage error.
            """
    )

    @Option(name: .long, help: ArgumentHelp("The relay, host:port (or UPLOAD_RELAY).", valueName: "host:port"))
    var relay: String?

    @Option(name: .long, help: ArgumentHelp("The account's token (or UPLOAD_TOKEN).", valueName: "token"))
    var token: String?

    @Option(name: .long, help: ArgumentHelp("PEM file of the CA that signed the relay's certificate (or UPLOAD_CA; default: system roots).", valueName: "file"))
    var ca: String?

    @Option(
        name: .long,
        help: ArgumentHelp("The name the relay's certificate holds, when --relay gives an address it does not (TLS SNI and verification).", valueName: "name")
    )
    var serverName: String?

    @Option(name: .long, help: ArgumentHelp("Put every key under this prefix.", valueName: "prefix"))
    var prefix: String?

    @Option(name: .long, help: ArgumentHelp("The key for data read from stdin (-).", valueName: "key"))
    var name: String?

    @Option(name: .long, help: "Uploads in flight at once on the connection.")
    var concurrency: Int = 8

    @Option(name: .long, help: ArgumentHelp("Keep reconnecting this long without progress, e.g. 60s, 5m.", valueName: "duration"))
    var retryFor: String = "60s"

    @Flag(name: .long, help: "Print one JSON object per finished item on stdout.")
    var json = false

    @Flag(name: .long, help: "Do not hash files before sending: no dedup, one read pass.")
    var noDedup = false

    @Flag(name: .long, help: "Deflate compressible chunks (helps on slow links).")
    var deflate = false

    @Flag(name: .long, help: "Replace different content already stored under a key.")
    var overwrite = false

    @Flag(name: .long, help: "No progress display on stderr.")
    var quiet = false

    @Argument(help: ArgumentHelp("Files, directories, or - for stdin.", valueName: "path"))
    var paths: [String]

    func validate() throws {
        guard !self.paths.isEmpty else { throw ValidationError("name at least one file, directory or -") }
        guard self.concurrency >= 1 else { throw ValidationError("--concurrency must be at least 1") }
        _ = try DurationText.parse(self.retryFor, option: "--retry-for")
        guard self.relay ?? Self.environment("UPLOAD_RELAY") != nil else {
            throw ValidationError("which relay? pass --relay host:port or set UPLOAD_RELAY")
        }
        guard self.token ?? Self.environment("UPLOAD_TOKEN") != nil else {
            throw ValidationError("no token: pass --token or set UPLOAD_TOKEN (the relay operator makes one with: upload-relay token add NAME)")
        }
    }

    static func environment(_ name: String) -> String? {
        ProcessInfo.processInfo.environment[name].flatMap { $0.isEmpty ? nil : $0 }
    }

    func run() async throws {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .warning
            return handler
        }
        let relay = self.relay ?? Self.environment("UPLOAD_RELAY")!
        guard let colon = relay.lastIndex(of: ":"), let port = Int(relay[relay.index(after: colon)...]) else {
            throw ValidationError("--relay \"\(relay)\" is not host:port")
        }
        var host = String(relay[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        var configuration = AgentConfiguration(
            relayHost: host, relayPort: port, token: self.token ?? Self.environment("UPLOAD_TOKEN")!,
            caPath: self.ca ?? Self.environment("UPLOAD_CA")
        )
        configuration.concurrency = self.concurrency
        configuration.serverName = self.serverName
        configuration.retryFor = try DurationText.parse(self.retryFor, option: "--retry-for")
        configuration.dedup = !self.noDedup
        configuration.deflate = self.deflate
        configuration.overwrite = self.overwrite
        configuration.agentName = ProcessInfo.processInfo.hostName

        let items: [UploadItem]
        do {
            items = try ItemPlanner.plan(paths: self.paths, prefix: self.prefix, stdinName: self.name, limits: configuration.limits)
        } catch let error as ItemPlanner.PlanError {
            throw ValidationError(error.description)
        }
        let progress = ProgressPrinter(
            json: self.json, live: !self.quiet && isatty(2) == 1, quiet: self.quiet, totalItems: items.count
        )
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let uploader = Uploader(configuration: configuration, group: group, logger: Logger(label: "upload-agent"))
        let results: [UploadResult]
        do {
            results = try await uploader.upload(items) { event in progress.handle(event) }
        } catch {
            try? await group.shutdownGracefully()
            FileHandle.standardError.write(Data("upload-agent: \(error)\n".utf8))
            throw ExitCode(1)
        }
        try? await group.shutdownGracefully()
        progress.summary(results)
        if results.contains(where: { $0.status == .failed }) {
            throw ExitCode(1)
        }
    }
}
