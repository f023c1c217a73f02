import FoundationEssentials
import Glibc
import NIOConcurrencyHelpers
import UploadAgent
import UploadCommandLine
import UploadProtocol

/// Progress for people on stderr and one JSON object per finished item on stdout with --json.
///
/// On a terminal, a live block under the messages: a line per upload under way (its percentage, bytes and rate), at
/// most ``shownUploads`` of them, then a total line (items done, bytes, rate, ETA). Messages (stored, failed, waiting,
/// reconnecting) are printed above it, the block redrawn below; it is erased when the run ends. Not on a terminal, or
/// with --quiet, messages only.
final class ProgressPrinter: Sendable {
    /// An upload under way, for its line.
    private struct Upload {
        var size: UInt64?
        /// Where this run started it (a resume starts past 0).
        var offset: UInt64
        var sent: UInt64 = 0
        var started: Double
    }

    private struct State {
        var totalSent: UInt64 = 0
        /// Bytes counted done without being sent by this run: resumed from, or found on the relay.
        var totalSkipped: UInt64 = 0
        /// Items started in this run: a resume's offset is counted done once, at the item's first start.
        var seen: Set<String> = []
        var finished = 0
        /// Uploads under way, in the order they started.
        var active: [String: Upload] = [:]
        var order: [String] = []
        /// Lines of the live block on the screen now (erased before anything else is printed).
        var drawn = 0
        var lastDraw: Double = 0
        /// The last reconnection reason said, and how many times it came again since (said once, then counted).
        var reconnect: (reason: String, repeats: Int)? = nil
        var started: Double = Date().timeIntervalSince1970
        /// Connections to the relay the run has open (an adaptive run opens more on a long link): in each JSON line.
        var connections = 1

        /// An upload that ended, or waits: its line goes.
        mutating func forget(_ key: String) {
            guard self.active.removeValue(forKey: key) != nil else { return }
            self.order.removeAll { $0 == key }
        }
    }

    private let state = NIOLockedValueBox(State())
    private let json: Bool
    private let live: Bool
    private let quiet: Bool
    private let totalItems: Int
    /// The bytes of every item of the run, when known before it starts (send's files): the total line's ETA.
    private let totalBytes: UInt64?
    /// A long-running agent: JSON lines carry an "event" ("started", "finished").
    private let events: Bool

    /// Whether to draw the live block: stderr is a terminal, and the JSON lines (when asked for) do not go to that
    /// terminal too, where the block would cut into them.
    static func liveWanted(json: Bool, quiet: Bool) -> Bool {
        !quiet && isatty(2) == 1 && !(json && isatty(1) == 1)
    }

    /// The most uploads the live block shows a line for; the others are counted.
    static let shownUploads = 6

    init(json: Bool, live: Bool, quiet: Bool, totalItems: Int, totalBytes: UInt64? = nil, events: Bool = false, connections: Int = 1) {
        self.state.withLockedValue { $0.connections = connections }
        self.totalBytes = totalBytes
        self.json = json
        self.live = live && !quiet
        self.quiet = quiet
        self.totalItems = totalItems
        self.events = events
    }

    func handle(_ event: UploadEvent) {
        switch event {
        case .connected(let relay, let account):
            self.note("connected to \(relay) as \"\(account)\"")
        case .reconnecting(let reason, let delay):
            // The same failure again is counted, not printed again: said when it changes, with how often it came.
            let said = self.state.withLockedValue { state -> String? in
                if let last = state.reconnect, last.reason == reason {
                    state.reconnect = (reason, last.repeats + 1)
                    return nil
                }
                defer { state.reconnect = (reason, 0) }
                guard let last = state.reconnect, last.repeats > 0 else { return "" }
                return "(that came \(last.repeats + 1) times)"
            }
            guard let said else { return }
            if !said.isEmpty { self.note(said) }
            self.note("\(reason); reconnecting in \(delay), and again while it fails the same way")
        case .connections(let count, let reason):
            self.state.withLockedValue { $0.connections = count }
            self.note("using \(count) connections (\(reason))")
            if self.json && self.events {
                Self.stdout(Self.jsonText(["event": "connections", "connections": count, "reason": reason]))
            }
        case .started(let key, let size, let offset):
            self.state.withLockedValue {
                if $0.active[key] == nil { $0.order.append(key) }
                if $0.seen.insert(key).inserted { $0.totalSkipped += offset }
                $0.active[key] = Upload(size: size, offset: offset, started: Date().timeIntervalSince1970)
            }
            if offset > 0 { self.note("resuming \(key) at \(Self.bytes(offset))") }
            if self.json && self.events {
                var object: [String: Any] = ["event": "started", "key": key, "offset": offset]
                if let size { object["size"] = size }
                Self.stdout(Self.jsonText(object))
            }
        case .sent(let key, let bytes):
            // Drawn under the lock, as messages are: a message printed meanwhile is never drawn over.
            self.state.withLockedValue { state in
                state.totalSent += UInt64(bytes)
                state.active[key]?.sent += UInt64(bytes)
                let now = Date().timeIntervalSince1970
                guard self.live, now - state.lastDraw > 0.2 else { return }
                state.lastDraw = now
                Self.stderr(self.redraw(&state, now: now))
            }
        case .acknowledged:
            break
        case .waiting(let key, let reason, let retryIn):
            // The other items go on; this one waits for the relay to have room.
            self.state.withLockedValue { $0.forget(key) }
            self.note("waiting     \(key): \(reason); trying again in \(Self.duration(retryIn))")
            if self.json && self.events {
                Self.stdout(Self.jsonText(["event": "waiting", "key": key, "reason": reason, "retry_in_seconds": Int(retryIn.components.seconds)]))
            }
        case .finished(let result):
            self.state.withLockedValue {
                $0.finished += 1
                // What the relay had already (dedup, or a commit settled before a retry) counts as done.
                if result.status == .stored || result.status == .deduplicated, result.bytes > result.sentBytes {
                    $0.totalSkipped += result.bytes - result.sentBytes
                }
                $0.forget(result.key)
            }
            if self.json {
                let connections = self.state.withLockedValue { $0.connections }
                Self.stdout(Self.jsonLine(result, event: self.events ? "finished" : nil, connections: connections))
            }
            if !self.quiet {
                let what: String
                switch result.status {
                case .stored: what = "stored      \(result.key)  \(Self.bytes(result.bytes))"
                case .deduplicated: what = "unchanged   \(result.key)  (already on the relay, nothing sent)"
                case .failed: what = "FAILED      \(result.path): \(result.error ?? "unknown error")"
                case .skipped: what = "skipped     \(result.error ?? result.path)"
                }
                self.note(what)
            }
        }
    }

    /// The escape codes that erase the block drawn, then the block drawn anew (its line count recorded).
    private func redraw(_ state: inout State, now: Double) -> String {
        var output = Self.erase(state.drawn)
        let lines = self.block(state, now: now)
        output += lines.map { $0 + "\n" }.joined()
        state.drawn = lines.count
        return output
    }

    /// Moves up over `lines` lines and clears from there to the end of the screen.
    private static func erase(_ lines: Int) -> String {
        lines > 0 ? "\u{1B}[\(lines)F\u{1B}[J" : "\r\u{1B}[J"
    }

    /// The live block: a line per upload under way, then the total.
    private func block(_ state: State, now: Double) -> [String] {
        let width = Self.terminalWidth()
        var lines: [String] = []
        for key in state.order.prefix(Self.shownUploads) {
            guard let upload = state.active[key] else { continue }
            let done = upload.offset + upload.sent
            var line = "  "
            if let size = upload.size, size > 0 {
                let percent = min(100, Int(Double(done) * 100 / Double(size)))
                line += Format.padded("\(percent)%", to: 4) + "  " + Format.padded("\(Self.bytes(done)) / \(Self.bytes(size))", to: 22)
            } else {
                line += "      " + Format.padded(Self.bytes(done), to: 22)
            }
            let rate = Double(upload.sent) / max(0.001, now - upload.started)
            line += "  " + Format.padded("\(Format.fixed(rate / 1e6)) MB/s", to: 10) + "  " + Printable.escaped(key)
            lines.append(String(line.prefix(width - 1)))
        }
        if state.order.count > Self.shownUploads {
            lines.append("  ... and \(state.order.count - Self.shownUploads) more under way")
        }
        lines.append(String(self.totalLine(state, now: now).prefix(width - 1)))
        return lines
    }

    private func totalLine(_ state: State, now: Double) -> String {
        let elapsed = max(0.001, now - state.started)
        let rate = Double(state.totalSent) / elapsed
        var line = self.totalItems > 0 ? "[\(state.finished)/\(self.totalItems)] " : "[\(state.finished) done] "
        let done = state.totalSent + state.totalSkipped
        line += Self.bytes(done)
        if let total = self.totalBytes, total > 0 {
            line += " / \(Self.bytes(total))  \(min(100, Int(Double(done) * 100 / Double(total))))%"
        }
        line += "  \(Format.fixed(rate / 1e6)) MB/s"
        if let total = self.totalBytes, total > done, rate > 0 {
            let eta = Int(Double(total - done) / rate)
            line += "  ETA \(eta / 60):\(Format.twoDigits(eta % 60))"
        }
        return line
    }

    /// The terminal's width in columns (stderr's), 80 when it cannot be asked.
    static func terminalWidth() -> Int {
        var size = winsize()
        guard ioctl(2, UInt(TIOCGWINSZ), &size) == 0, size.ws_col > 20 else { return 80 }
        return Int(size.ws_col)
    }

    /// A watched path not taken (a link, a FIFO, a name no key may have): said, and with --json an event.
    func skipped(path: String, reason: String, json: Bool) {
        self.note("skipped     \(path): \(reason)")
        if json { Self.stdout(Self.jsonText(["event": "skipped", "path": path, "reason": reason])) }
    }

    /// A message above the live block (which is drawn again under it). Escaped (``Printable``): what a relay said or a
    /// file is named can neither break the line nor act on the terminal.
    func note(_ text: String) {
        guard !self.quiet else { return }
        let text = Printable.escaped(text)
        guard self.live else {
            Self.stderr(text + "\n")
            return
        }
        // Composed and written under the lock: two threads' messages never cut into each other's block.
        self.state.withLockedValue { state in
            var output = Self.erase(state.drawn)
            state.drawn = 0
            output += text + "\n"
            if !state.active.isEmpty {
                output += self.redraw(&state, now: Date().timeIntervalSince1970).dropFirst(Self.erase(0).count)
            }
            Self.stderr(output)
        }
    }

    /// Erases the live block (the run is over).
    func finishLive() {
        guard self.live else { return }
        self.state.withLockedValue { state in
            Self.stderr(Self.erase(state.drawn))
            state.drawn = 0
        }
    }

    func summary(_ results: [UploadResult]) {
        self.finishLive()
        guard !self.quiet else { return }
        if let last = self.state.withLockedValue({ $0.reconnect }), last.repeats > 0 {
            self.note("(the connection failed that way \(last.repeats + 1) times)")
        }
        let stored = results.filter { $0.status == .stored }.count
        let dedup = results.filter { $0.status == .deduplicated }.count
        let failed = results.filter { $0.status == .failed }.count
        let skipped = results.filter { $0.status == .skipped }.count
        let sent = results.reduce(0) { $0 + $1.sentBytes }
        let elapsed = Date().timeIntervalSince1970 - self.state.withLockedValue { $0.started }
        var text = "\(stored) stored, \(dedup) already there, \(failed) failed"
        if skipped > 0 { text += ", \(skipped) skipped" }
        text += "; \(Self.bytes(sent)) sent"
        text += " in \(Format.fixed(elapsed)) s (\(Format.fixed(Double(sent) / max(elapsed, 0.001) / 1e6)) MB/s)"
        self.note(text)
    }

    /// `connections`: how many the run had open when the item ended.
    static func jsonLine(_ result: UploadResult, event: String? = nil, connections: Int? = nil) -> String {
        var object: [String: Any] = [
            "key": result.key, "path": result.path, "bytes": result.bytes, "sha1": result.sha1,
            "status": result.status.rawValue, "sent_bytes": result.sentBytes, "hashed_bytes": result.hashedBytes,
            "wire_bytes": result.wireBytes, "stripes": result.stripes,
        ]
        if let error = result.error {
            object["error"] = error
            object["error_code"] = result.errorCode ?? UploadResult.ErrorCode.failed
        }
        if let event { object["event"] = event }
        if let connections { object["connections"] = connections }
        return Self.jsonText(object)
    }

    /// One JSON object on one line, keys sorted. Written by hand: Foundation's JSONSerialization took an eighth of the
    /// agent's CPU on 10,000 small files, and the agent links FoundationEssentials only (no ICU data on a device).
    static func jsonText(_ object: [String: Any]) -> String {
        var text = ""
        Self.appendJSON(object, to: &text)
        return text + "\n"
    }

    /// Strings, booleans, integers, finite doubles, arrays and objects (keys sorted); anything else is null.
    static func appendJSON(_ value: Any?, to text: inout String) {
        switch value {
        case let value as String: Self.appendJSONString(value, to: &text)
        case let value as Bool: text += value ? "true" : "false"
        case let value as any BinaryInteger: text += "\(value)"
        case let value as Double where value.isFinite: text += "\(value)"
        case let object as [String: Any]:
            text += "{"
            for (index, key) in object.keys.sorted().enumerated() {
                if index > 0 { text += "," }
                Self.appendJSONString(key, to: &text)
                text += ":"
                Self.appendJSON(object[key], to: &text)
            }
            text += "}"
        case let array as [Any]:
            text += "["
            for (index, element) in array.enumerated() {
                if index > 0 { text += "," }
                Self.appendJSON(element, to: &text)
            }
            text += "]"
        default: text += "null"
        }
    }

    /// `value` as a JSON string: quotes, backslashes and control characters escaped (RFC 8259 §7), all else as is.
    static func appendJSONString(_ value: String, to text: inout String) {
        text += "\""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": text += "\\\""
            case "\\": text += "\\\\"
            case "\n": text += "\\n"
            case "\r": text += "\\r"
            case "\t": text += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                text += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: text.unicodeScalars.append(scalar)
            }
        }
        text += "\""
    }

    static func duration(_ duration: Duration) -> String {
        let seconds = Int(duration.components.seconds)
        return seconds >= 60 ? "\(seconds / 60)m\(seconds % 60 == 0 ? "" : "\(seconds % 60)s")" : "\(max(1, seconds))s"
    }

    static func bytes(_ count: UInt64) -> String {
        Format.bytes(Int64(clamping: count))
    }

    static func stderr(_ text: String) {
        Platform.writeStandardError(text)
    }

    static func stdout(_ text: String) {
        Platform.writeStandardOutput(text)
    }
}
