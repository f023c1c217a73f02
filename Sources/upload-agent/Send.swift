import ArgumentParser
import FoundationEssentials
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
            relay's durable offset. A file the relay already holds (same size and SHA-1) is not sent again.

            Files go through the agent's persistent queue (--state): a send that is killed resumes the \
            next time an agent runs for the same relay, without re-reading what the relay acknowledged, \
            and a file hashed before is not hashed again while it is unchanged. When `upload-agent watch` \
            (or another send) already runs for the same relay and token, the files are handed to it and \
            this command waits for their results. --no-state uploads without recording anything.

            Before anything is sent the relay is asked what the selection would add to the account's quota \
            (files it holds already under their keys add nothing). When it does not all fit, nothing is sent: \
            each file is reported (QUOTA_EXCEEDED), those that do not fit first, with what is left of the quota. \
            --send-what-fits sends the files that fit instead, in order, passing over those that do not; \
            --no-quota-check skips the question (the relay still refuses each upload that would pass the quota).

            Environment: UPLOAD_RELAY, UPLOAD_TOKEN and UPLOAD_CA stand in for --relay, --token and --ca.

            Only files are uploaded, and only the files named: a symbolic link is skipped (said so, in --json \
            with status "skipped" and why) unless --follow-symlinks asks for what links point to; so are FIFOs, \
            sockets and devices, a directory that cannot be read, and a name that is not UTF-8. A file whose name \
            cannot make a key (a backslash, a control character) fails alone; the rest go up.

            Exit status: 0 when every item was stored or deduplicated; 1 when any failed or was skipped (with \
            --allow-skipped, skipped paths alone do not count); 2 for a usage error (the command line itself); \
            3 when nothing went up because the relay could not be reached or refused the account (bad token, \
            TLS). With --json each failed or skipped item carries error and error_code (a wire code such as \
            QUOTA_EXCEEDED, or RELAY_UNREACHABLE, NO_PROGRESS, TLS_UNTRUSTED, SOURCE_ERROR, INVALID_KEY, SKIPPED).
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var stateOptions: StateOptions

    @Option(name: .long, help: ArgumentHelp("The key for data read from stdin (-).", valueName: "key"))
    var name: String?

    @Option(name: .long, help: ArgumentHelp("Keep reconnecting this long without progress, e.g. 60s, 5m.", valueName: "duration"))
    var retryFor: String = "60s"

    @Flag(name: .long, help: "Print one JSON object per finished item on stdout.")
    var json = false

    @Flag(name: .long, help: "Replace different content already stored under a key.")
    var overwrite = false

    @Flag(name: .long, help: "Record nothing: no persistent queue, no hash cache (a one-shot upload).")
    var noState = false

    @Flag(name: .long, help: "No progress display on stderr.")
    var quiet = false

    @Flag(
        name: [.customShort("L"), .long],
        help: "Follow symbolic links: upload the files they point to, and walk the directories (each once). By default a link is skipped and said so."
    )
    var followSymlinks = false

    @Flag(
        name: .long,
        help: "Exit 0 even when paths were skipped (symbolic links, unreadable directories, names that are not UTF-8); they are still reported.")
    var allowSkipped = false

    @Flag(
        name: .long,
        help:
            "When the selection does not fit in the account's quota, send the files that fit (in order) and report the rest; by default nothing is sent then."
    )
    var sendWhatFits = false

    @Flag(name: .long, help: "Do not ask the relay whether the selection fits in the account's quota before sending.")
    var noQuotaCheck = false

    @Argument(help: ArgumentHelp("Files, directories, or - for stdin.", valueName: "path"))
    var paths: [String]

    func validate() throws {
        guard !self.paths.isEmpty else { throw ValidationError("name at least one file, directory or -") }
        _ = try DurationText.parse(self.retryFor, option: "--retry-for")
    }

    func run() async throws {
        self.connection.bootstrapLogging()
        var configuration = try self.connection.configuration()
        configuration.retryFor = try DurationText.parse(self.retryFor, option: "--retry-for")
        configuration.overwrite = self.overwrite

        let plan: ItemPlanner.Plan
        do {
            plan = try ItemPlanner.plan(
                paths: self.paths, prefix: self.connection.prefix, stdinName: self.name, limits: configuration.limits,
                followSymlinks: self.followSymlinks, notUTF8: ItemPlanner.argumentsNotUTF8()
            )
        } catch let error as ItemPlanner.PlanError {
            throw ValidationError(error.description)
        }
        let store = self.noState ? nil : try self.stateOptions.open()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let uploader = Uploader(configuration: configuration, group: group, logger: Logger(label: "upload-agent"))
        let check =
            self.noQuotaCheck
            ? QuotaCheck(items: plan.items, held: [], note: nil)
            : await QuotaCheck.run(plan, sendWhatFits: self.sendWhatFits, overwrite: self.overwrite, uploader: uploader)
        let items = check.items
        let progress = ProgressPrinter(
            json: self.json, live: ProgressPrinter.liveWanted(json: self.json, quiet: self.quiet), quiet: self.quiet,
            totalItems: items.count + plan.results.count + check.held.count,
            totalBytes: check.held.isEmpty ? plan.fileBytes : check.itemBytes, connections: Uploader.connectionsAtStart(configuration)
        )
        // What will not go up is said first, each with its reason.
        for result in plan.results + check.held { progress.handle(.finished(result)) }
        if let note = check.note { progress.note(note) }
        var results: [UploadResult]
        do {
            if let store {
                results = try await QueuedSend.run(
                    consume items, uploader: uploader, store: store,
                    onHandOver: { count in
                        progress.note("another upload-agent is uploading for this relay: \(count) file(s) handed to it; waiting for them")
                    },
                    onEvent: { event in progress.handle(event) }
                )
            } else {
                results = try await uploader.upload(items) { event in progress.handle(event) }
            }
        } catch {
            await uploader.letGoOfKeptConnection()
            try? await group.shutdownGracefully()
            Platform.writeError(error)
            throw ExitCode(1)
        }
        // The quota plan's connection, when no run took it (nothing to send, or the files went to another agent).
        await uploader.letGoOfKeptConnection()
        try? await group.shutdownGracefully()
        results = plan.results + check.held + results
        progress.summary(results)
        if let code = Self.exitCode(results, allowSkipped: self.allowSkipped) { throw ExitCode(code) }
    }

    /// 0 (nil) when every item is stored or already there (skipped ones too with --allow-skipped); 3 when nothing went
    /// up because the relay could not be reached or refused the account; 1 otherwise.
    static func exitCode(_ results: [UploadResult], allowSkipped: Bool) -> Int32? {
        let failures = results.filter { $0.status == .failed || ($0.status == .skipped && !allowSkipped) }
        guard !failures.isEmpty else { return nil }
        let anyStored = results.contains { $0.status == .stored || $0.status == .deduplicated }
        let refused = failures.allSatisfy { $0.status == .failed && UploadResult.ErrorCode.relayRefused.contains($0.errorCode ?? "") }
        return !anyStored && refused ? 3 : 1
    }
}
