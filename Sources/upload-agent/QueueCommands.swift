import ArgumentParser
import FoundationEssentials
import UploadAgent
import UploadCommandLine
import UploadProtocol

/// `upload-agent status`: the queue at a glance, readable while an agent runs.
struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the upload queue: what is uploading, waiting, failed, and the totals.",
        discussion: """
            Reads the state database (--state) that send and watch write, also while they run. Per item: \
            key, status (queued, uploading, done, failed, dropped), percent acknowledged by the relay, rate, \
            ETA and the last error. Items done are counted, and listed with --all. --json prints one object: \
            {"paused", "totals", "items": [...]} with every item.
            """
    )

    @OptionGroup var stateOptions: StateOptions

    @Flag(name: .long, help: "Print the whole queue as one JSON object.")
    var json = false

    @Flag(name: .long, help: "List items done too.")
    var all = false

    func run() throws {
        let store = try self.stateOptions.open()
        let items = try store.items()
        let paused = try store.isPaused()
        let hold = try store.holdReason()
        var totals: [String: Int] = [:]
        for status in QueuedItem.Status.allCases { totals[status.rawValue] = 0 }
        for item in items { totals[item.status.rawValue, default: 0] += 1 }
        let remaining = items.filter { $0.status == .queued || $0.status == .uploading }.reduce(UInt64(0)) {
            $0 + (($1.size ?? 0) - min($1.size ?? 0, $1.acked))
        }
        let rate = items.filter { $0.status == .uploading }.reduce(0.0) { $0 + $1.rate }
        if self.json {
            var object: [String: Any] = [
                "paused": paused, "totals": totals, "items": items.map(Self.json), "remaining_bytes": remaining, "rate": rate,
                "state": store.directory,
            ]
            if let hold { object["held"] = hold }
            if rate > 0 { object["eta_seconds"] = Int(Double(remaining) / rate) }
            print(ProgressPrinter.jsonText(object), terminator: "")
            return
        }
        var lines: [String] = []
        if paused { lines.append("PAUSED (upload-agent resume lets uploads go on)") }
        if let hold, !paused { lines.append("HELD: \(Printable.escaped(hold))") }
        let shown = items.filter { self.all || $0.status != .done }
        for item in shown.prefix(self.all ? Int.max : 200) {
            var line = "\(Format.padded(item.status.rawValue, to: 10)) \(Printable.escaped(item.key))"
            if let size = item.size, [.queued, .uploading, .failed].contains(item.status) {
                line += "  \(Format.fixed(size == 0 ? 100 : Double(item.acked) / Double(size) * 100, 0))%"
                line += " of \(ProgressPrinter.bytes(size))"
                if item.status == .uploading, item.rate > 0 {
                    line += "  \(Format.fixed(item.rate / 1e6)) MB/s  ETA \(Self.duration(Double(size - min(size, item.acked)) / item.rate))"
                }
            }
            if let error = item.error, item.status == .failed || item.status == .dropped { line += "  \(Printable.escaped(error))" }
            // A queued item with an error waits for the relay to have room for it (its quota, its storage).
            if let error = item.error, item.status == .queued { line += "  waiting: \(Printable.escaped(error))" }
            lines.append(line)
        }
        if shown.count > 200 && !self.all { lines.append("… and \(shown.count - 200) more (--json lists them all)") }
        let summary = QueuedItem.Status.allCases.map { "\(totals[$0.rawValue] ?? 0) \($0.rawValue)" }.joined(separator: ", ")
        var tail = "\(summary); \(ProgressPrinter.bytes(remaining)) to go"
        if rate > 0 { tail += " at \(Format.fixed(rate / 1e6)) MB/s, ETA \(Self.duration(Double(remaining) / rate))" }
        lines.append(tail)
        print(lines.joined(separator: "\n"))
    }

    static func json(_ item: QueuedItem) -> [String: Any] {
        var object: [String: Any] = [
            "id": item.id, "key": item.key, "path": item.path, "status": item.status.rawValue, "acked": item.acked,
            "sent_bytes": item.sentBytes, "hashed_bytes": item.hashedBytes, "rate": item.rate,
        ]
        if let size = item.size {
            object["size"] = size
            object["percent"] = size == 0 ? 100.0 : Double(item.acked) / Double(size) * 100
            if item.status == .uploading, item.rate > 0 { object["eta_seconds"] = Int(Double(size - min(size, item.acked)) / item.rate) }
        }
        if let sha1 = item.sha1 { object["sha1"] = sha1 }
        if let outcome = item.outcome { object["outcome"] = outcome }
        if let error = item.error { object["error"] = error }
        return object
    }

    static func duration(_ seconds: Double) -> String {
        let total = Int(seconds.isFinite ? seconds : 0)
        return Format.clock(total)
    }
}

struct Pause: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Pause uploads: a running agent stops within a second, and stays paused across restarts until resume.",
        discussion: "What the relay acknowledged is kept there; a resumed upload goes on from it."
    )

    @OptionGroup var stateOptions: StateOptions

    func run() throws {
        try self.stateOptions.open().setPaused(true)
        print("paused")
    }
}

struct Resume: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Let paused uploads go on.")

    @OptionGroup var stateOptions: StateOptions

    func run() throws {
        try self.stateOptions.open().setPaused(false)
        print("resumed")
    }
}

struct Retry: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Queue failed items again.",
        discussion: "A running agent picks them up within a second; otherwise the next send or watch does."
    )

    @OptionGroup var stateOptions: StateOptions

    func run() throws {
        let count = try self.stateOptions.open().retryFailed()
        print("\(count) failed item(s) queued again")
    }
}
