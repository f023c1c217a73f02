import ArgumentParser
import FoundationEssentials
import Logging
import NIOCore
import NIOPosix
import UploadAgent
import UploadCommandLine
import UnixSignals

struct Watch: AsyncParsableCommand {
    enum OnChange: String, ExpressibleByArgument, CaseIterable {
        case overwrite, skip
    }

    static let configuration = CommandConfiguration(
        abstract: "Upload what is in directories and what appears there, for as long as it runs.",
        discussion: """
            Scans each DIR at start, then watches it (inotify): a file goes up once it is complete, \
            that is closed after writing, moved in, or unchanged for --settle. Keys are paths from the \
            directory's parent, as with send (`watch ~/DCIM` stores DCIM/...), under --prefix.

            Nothing goes twice: a file uploaded before and unchanged (same device, inode, size and \
            modification time) is skipped without being read; identical content under another name \
            is found by the relay's dedup, and no byte moves. A file that changed is uploaded again \
            under its key, replacing the old version (--on-change skip keeps the first). A file \
            deleted before its upload finished is dropped from the queue; deleting a file never \
            deletes anything on the relay.

            When the relay has no room for a file (the account's quota: QUOTA_EXCEEDED, or its storage \
            full: STORAGE_ERROR), that file waits (10 s, doubling up to 10 minutes) and is tried again, \
            instead of failing; the other files go on meanwhile, so those that fit are stored. `status` \
            and --json ({"event":"waiting",...}) say why each waits.

            Only files are uploaded: a symbolic link (present at start or made later) is skipped and said \
            so unless --follow-symlinks; so are FIFOs, sockets, devices, directories that cannot be read \
            and names that are not UTF-8.

            Conditions (--only-on-ac, --min-battery, --only-on-wifi, --not-metered, --when CMD) are \
            checked every --when-interval: \
            while one is false, uploads stop (the relay keeps what it acknowledged) and go on by \
            themselves once it is true again. `upload-agent status` says what holds them.

            The queue lives in --state and survives kill -9 and reboots: a restart resumes every \
            upload from the relay's durable offset. The relay being unreachable never fails an item; \
            the agent retries with backoff. `upload-agent status` shows the queue, `pause` and \
            `resume` act on this running agent, `retry` queues failed items again.

            Stops on SIGINT or SIGTERM. Exit status: 0 when stopped, 1 when the relay refuses the \
            agent for good (a revoked token, a certificate that does not verify), 2 for a usage error.
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var stateOptions: StateOptions

    @Option(
        name: .long, help: ArgumentHelp("How long a file written without closing it must stay unchanged to count as complete.", valueName: "duration")
    )
    var settle: String = "2s"

    @Option(
        name: .long, help: ArgumentHelp("Upload only files matching this glob (repeatable; a pattern with / matches the path).", valueName: "glob"))
    var include: [String] = []

    @Option(name: .long, help: ArgumentHelp("Skip files and directories matching this glob (repeatable), e.g. '.*'.", valueName: "glob"))
    var exclude: [String] = []

    @Option(name: .long, help: "What a changed file does: overwrite (the latest content wins) or skip (the first upload stays).")
    var onChange: OnChange = .overwrite

    @Flag(name: .long, help: "Upload only while on mains power (Linux /sys/class/power_supply).")
    var onlyOnAc = false

    @Option(name: .long, help: ArgumentHelp("Upload only while the battery is at least this many percent, or on mains power.", valueName: "percent"))
    var minBattery: Int?

    @Flag(
        name: .customLong("only-on-wifi"),
        help: "Upload only while the default route goes through a wireless interface (Wi-Fi, not Ethernet or a mobile modem).")
    var onlyOnWiFi = false

    @Flag(
        name: .long,
        help:
            "Upload only while NetworkManager does not call the connection metered (a phone's hotspot, a mobile plan); without NetworkManager, always."
    )
    var notMetered = false

    @Option(name: .long, help: ArgumentHelp("Upload only while this shell command exits 0 (any other condition of your own).", valueName: "command"))
    var when: String?

    @Option(name: .long, help: ArgumentHelp("How often the conditions are checked again.", valueName: "duration"))
    var whenInterval: String = "30s"

    @Option(name: .long, help: .hidden)
    var powerSupplyDir: String = "/sys/class/power_supply"

    @Option(name: .long, help: .hidden)
    var routeTable: String = "/proc/net/route"

    @Option(name: .long, help: .hidden)
    var networkDir: String = "/sys/class/net"

    @Option(name: .long, help: .hidden)
    var meteredProgram: String = "nmcli"

    /// The first wait after the relay said it has no room (QUOTA_EXCEEDED, STORAGE_ERROR); tests shorten it.
    @Option(name: .long, help: .hidden)
    var relayFullBackoff: String = "10s"

    @Flag(
        name: [.customShort("L"), .long],
        help: "Follow symbolic links: upload the files they point to, and watch the directories. By default a link is skipped and said so.")
    var followSymlinks = false

    @Flag(
        name: .long,
        help:
            "Print one JSON object per event on stdout: {\"event\":\"started\",...}, {\"event\":\"finished\",...}, {\"event\":\"skipped\",\"path\",\"reason\"}, {\"event\":\"waiting\",\"key\",\"reason\",\"retry_in_seconds\"}."
    )
    var json = false

    @Flag(name: .long, help: "Print nothing on stderr but errors.")
    var quiet = false

    @Flag(
        name: .long,
        help:
            "Wait for a directory that does not exist yet (a card, a mount, a folder made later): said once on stderr, looked for every 5 seconds, watched once it is there. Without it, a missing directory is a usage error."
    )
    var waitForDirectories = false

    /// How often a missing directory is looked for again (``waitForDirectories``).
    static let directoryPollInterval: Duration = .seconds(5)

    @Argument(help: ArgumentHelp("Directories to watch.", valueName: "dir"))
    var directories: [String]

    func validate() throws {
        guard !self.directories.isEmpty else { throw ValidationError("name at least one directory to watch") }
        _ = try DurationText.parse(self.settle, option: "--settle")
        _ = try DurationText.parse(self.whenInterval, option: "--when-interval")
        _ = try DurationText.parse(self.relayFullBackoff, option: "--relay-full-backoff")
        if let minimum = self.minBattery, !(0...100).contains(minimum) { throw ValidationError("--min-battery takes a percentage, 0 to 100") }
        for directory in self.directories where !(self.waitForDirectories && !Platform.exists(directory)) {
            guard Platform.isDirectory(directory) else {
                throw ValidationError("\(directory): not a directory (watch takes directories; send takes files)")
            }
        }
    }

    func run() async throws {
        self.connection.bootstrapLogging()
        if self.waitForDirectories { try await self.waitForMissingDirectories() }
        var configuration = try self.connection.configuration()
        configuration.retryForever = true
        configuration.relayFullBackoff = try DurationText.parse(self.relayFullBackoff, option: "--relay-full-backoff")
        configuration.overwrite = self.onChange == .overwrite
        let store = try self.stateOptions.open()
        let target = AgentStateStore.target(of: configuration)
        guard let lock = try RunnerLock.tryAcquire(store: store, target: target) else {
            Platform.writeStandardError(
                "upload-agent: another upload-agent already uploads for this relay and token from \(store.directory); stop it first, or give this one another --state\n"
            )
            throw ExitCode(1)
        }
        let progress = ProgressPrinter(
            json: self.json, live: ProgressPrinter.liveWanted(json: self.json, quiet: self.quiet), quiet: self.quiet, totalItems: 0, events: true,
            connections: Uploader.connectionsAtStart(configuration)
        )
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let uploader = Uploader(configuration: configuration, group: group, logger: Logger(label: "upload-agent"))
        let runner = QueueRunner(uploader: uploader, store: store, lock: lock, keepResults: false)
        try runner.loadPending()

        var options = DirectoryWatcher.Options(roots: self.directories)
        options.settle = try DurationText.parse(self.settle, option: "--settle")
        options.filter = PathFilter(include: self.include, exclude: self.exclude)
        options.followSymlinks = self.followSymlinks
        let followSymlinks = self.followSymlinks
        let json = self.json
        let prefix = self.connection.prefix
        let limits = configuration.limits
        let onChange = self.onChange
        let watcher = DirectoryWatcher(options: options) { changes in
            var ready: [UploadItem] = []
            for change in changes {
                switch change {
                case .ready(let path, let relative, let fingerprint):
                    do {
                        let key = try ItemPlanner.key(relative: relative, prefix: prefix, limits: limits)
                        ready.append(
                            UploadItem(
                                key: key, displayPath: path, source: FileSource(path: path, followSymlinks: followSymlinks),
                                expectedFingerprint: fingerprint
                            )
                        )
                    } catch {
                        progress.skipped(path: path, reason: "\(error)", json: json)
                    }
                case .skipped(let path, _, let reason):
                    progress.skipped(path: path, reason: reason, json: json)
                case .removed(_, let relative):
                    guard let key = try? ItemPlanner.key(relative: relative, prefix: prefix, limits: limits) else { continue }
                    do { try runner.drop(key: key) } catch { progress.note("\(error)") }
                }
            }
            do {
                try runner.enqueue(ready, skipUnchanged: true, skipChanged: onChange == .skip)
            } catch {
                progress.note("cannot queue \(ready.count) file(s): \(error)")
            }
        }
        // SIGINT and SIGTERM end the watch as a stop does: no new upload starts, and the acknowledged bytes stay.
        let signals = await UnixSignalsSequence(trapping: .sigint, .sigterm)
        var conditions = UploadConditions()
        conditions.onlyOnAC = self.onlyOnAc
        conditions.minBattery = self.minBattery
        conditions.command = self.when
        conditions.powerSupplyDirectory = self.powerSupplyDir
        conditions.onlyOnWiFi = self.onlyOnWiFi
        conditions.notMetered = self.notMetered
        conditions.routeTable = self.routeTable
        conditions.networkDirectory = self.networkDir
        conditions.meteredProgram = self.meteredProgram
        // Checked before the first upload starts, then every --when-interval.
        runner.hold("conditions", conditions.blocker())
        let interval = try DurationText.parse(self.whenInterval, option: "--when-interval")
        do {
            try watcher.start()
            if !self.quiet { progress.note("watching \(self.directories.joined(separator: ", ")); state in \(store.directory)") }
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    for await _ in signals {
                        watcher.stop()
                        runner.stop()
                        return
                    }
                }
                group.addTask { [conditions] in await runner.follow(conditions, every: interval) }
                try await runner.run(service: true) { event in progress.handle(event) }
                group.cancelAll()
            }
        } catch {
            watcher.stop()
            try? await group.shutdownGracefully()
            Platform.writeError(error)
            throw ExitCode(1)
        }
        watcher.stop()
        try? await group.shutdownGracefully()
    }

    /// Returns once every directory exists; each missing one is said once on stderr (even with --quiet: a service that
    /// waits says why), and again when it appears. A path that exists but is not a directory is an error.
    private func waitForMissingDirectories() async throws {
        var said = Set<String>()
        while true {
            for directory in self.directories where Platform.exists(directory) && !Platform.isDirectory(directory) {
                throw ValidationError("\(directory): not a directory (watch takes directories; send takes files)")
            }
            let missing = self.directories.filter { !Platform.isDirectory($0) }
            for directory in said.subtracting(missing).sorted() {
                Platform.writeStandardError("upload-agent: \(directory) is there now: watching it\n")
                said.remove(directory)
            }
            if missing.isEmpty { return }
            for directory in missing where !said.contains(directory) {
                Platform.writeStandardError("upload-agent: waiting for \(directory) to exist (--wait-for-directories)\n")
                said.insert(directory)
            }
            try await Task.sleep(for: Self.directoryPollInterval)
        }
    }
}
