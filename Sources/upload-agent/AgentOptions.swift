import ArgumentParser
import FoundationEssentials
import Logging
import UploadAgent
import UploadCommandLine
import UploadPlatform

/// Where the relay is and who the agent is: the options `send` and `watch` share.
struct ConnectionOptions: ParsableArguments {
    @Option(name: .long, help: ArgumentHelp("The relay, host:port (or UPLOAD_RELAY).", valueName: "host:port"))
    var relay: String?

    @Option(name: .long, help: ArgumentHelp("The account's token (or UPLOAD_TOKEN).", valueName: "token"))
    var token: String?

    @Option(
        name: .long,
        help: ArgumentHelp("PEM file of the CA that signed the relay's certificate (or UPLOAD_CA; default: system roots).", valueName: "file"))
    var ca: String?

    @Option(
        name: .long,
        help: ArgumentHelp(
            "The name the relay's certificate holds, when --relay gives an address it does not (TLS SNI and verification).", valueName: "name")
    )
    var serverName: String?

    @Option(name: .long, help: ArgumentHelp("Put every key under this prefix.", valueName: "prefix"))
    var prefix: String?

    @Option(
        name: .long,
        help: "Uploads in flight at once (default 5: keeps a phone-class host responsive). Files of 256 KiB or less count as 1/8 of one."
    )
    var concurrency: Int = 5

    @Option(
        name: .long,
        help: ArgumentHelp(
            "TLS connections to the relay: auto (the default) opens one; where the link's round trip is 5 ms or more and files wait, 4 at once (one connection carries about 26 MB/s over 100 ms with Linux's default socket buffers), then twice as many, up to --max-connections, while each step raises the rate; on loopback or a LAN it stays at one. A number opens exactly that many, sharing --concurrency. With more than one, a file above 16 MiB goes in 16 MiB stripes over all of them.",
            valueName: "auto|n"
        )
    )
    var connections: String = "auto"

    @Option(name: .long, help: ArgumentHelp("The most connections --connections auto opens (default 8).", valueName: "n"))
    var maxConnections: Int = 8

    @Flag(name: .long, help: "Do not ask the relay for the bytes before sending (no dedup): nothing hashed before OPEN, one read pass.")
    var noDedup = false

    @Flag(name: .long, help: "Deflate compressible chunks (helps on slow links).")
    var deflate = false

    @Option(
        name: .long,
        help: ArgumentHelp("Send at most this many payload bytes per second over all uploads, e.g. 10M, 500K (default: no limit).", valueName: "rate")
    )
    var bwlimit: String?

    @Option(
        name: .long,
        help: ArgumentHelp(
            "What the agent logs on stderr beside its results: trace, debug, info, notice, warning (the default), error.", valueName: "level")
    )
    var logLevel: String = "warning"

    func validate() throws {
        guard Logger.Level(rawValue: self.logLevel) != nil else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error")
        }
        guard self.concurrency >= 1 else { throw ValidationError("--concurrency must be at least 1") }
        guard self.connections == "auto" || Int(self.connections).map({ (1...64).contains($0) }) == true else {
            throw ValidationError("--connections must be auto or a number between 1 and 64, not \(self.connections)")
        }
        guard (1...64).contains(self.maxConnections) else { throw ValidationError("--max-connections must be between 1 and 64") }
        if let bwlimit = self.bwlimit, try ByteCount.parse(bwlimit, option: "--bwlimit") < 1 {
            throw ValidationError("--bwlimit must be at least 1 byte per second, e.g. 10M")
        }
        guard self.relay ?? Self.environment("UPLOAD_RELAY") != nil else {
            throw ValidationError("which relay? pass --relay host:port or set UPLOAD_RELAY")
        }
        guard self.token ?? Self.environment("UPLOAD_TOKEN") != nil else {
            throw ValidationError("no token: pass --token or set UPLOAD_TOKEN (the relay operator makes one with: upload-relay token add NAME)")
        }
    }

    /// Warnings and errors of the agent's libraries on stderr.
    /// Logs on stderr at `--log-level`.
    func bootstrapLogging() {
        let level = Logger.Level(rawValue: self.logLevel) ?? .warning
        LoggingSystem.bootstrap { label in
            // A relay's and a file system's words reach the terminal escaped.
            var handler = PrintableLogHandler(StreamLogHandler.standardError(label: label))
            handler.logLevel = level
            return handler
        }
    }

    static func environment(_ name: String) -> String? {
        ProcessInfo.processInfo.environment[name].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// The agent's configuration from these options and the environment.
    func configuration() throws -> AgentConfiguration {
        let relay = self.relay ?? Self.environment("UPLOAD_RELAY") ?? ""
        guard let colon = relay.lastIndex(of: ":"), let port = Int(relay[relay.index(after: colon)...]) else {
            throw ValidationError("--relay \"\(relay)\" is not host:port")
        }
        var host = String(relay[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        var configuration = AgentConfiguration(
            relayHost: host, relayPort: port, token: self.token ?? Self.environment("UPLOAD_TOKEN") ?? "",
            caPath: self.ca ?? Self.environment("UPLOAD_CA")
        )
        configuration.concurrency = self.concurrency
        if let fixed = Int(self.connections) {
            configuration.connections = fixed
            configuration.adaptiveConnections = false
        } else {
            configuration.connections = self.maxConnections
            configuration.adaptiveConnections = true
        }
        configuration.serverName = self.serverName
        configuration.dedup = !self.noDedup
        configuration.deflate = self.deflate
        configuration.bandwidthLimit = try self.bwlimit.map { Int(clamping: try ByteCount.parse($0, option: "--bwlimit")) }
        configuration.agentName = ProcessInfo.processInfo.hostName
        return configuration
    }
}

/// `--state DIR`: where the persistent queue lives.
struct StateOptions: ParsableArguments {
    @Option(
        name: .long,
        help: ArgumentHelp(
            "The agent's state directory: its queue, hash cache and pause flag (default: $XDG_STATE_HOME/upload-agent, else ~/.local/state/upload-agent).",
            valueName: "dir"
        )
    )
    var state: String?

    @Option(
        name: .long,
        help: ArgumentHelp(
            "Read options from this JSON file first; options given here override it. Keys are option names without dashes; a section per command (\"watch\": {...}) holds that command's own. See the README.",
            valueName: "file"
        )
    )
    var config: String?

    var directory: String { self.state ?? AgentStateStore.defaultDirectory() }

    func open() throws -> AgentStateStore {
        do {
            return try AgentStateStore(directory: self.directory)
        } catch {
            // Not a usage error: exit 1, with what failed and where.
            Platform.writeError(error)
            throw ExitCode(1)
        }
    }
}
