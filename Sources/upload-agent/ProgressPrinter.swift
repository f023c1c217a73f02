import FoundationEssentials
import NIOConcurrencyHelpers
import UploadAgent
import UploadCommandLine

/// Progress for people on stderr (a live status line on a terminal) and one JSON object per
/// finished item on stdout with --json.
final class ProgressPrinter: Sendable {
    private struct State {
        var sizes: [String: UInt64] = [:]
        var sent: [String: UInt64] = [:]
        var totalSent: UInt64 = 0
        var finished = 0
        var current: String = ""
        var lastDraw: Double = 0
        /// The last reconnection reason said, and how many times it came again since (said once, then counted).
        var reconnect: (reason: String, repeats: Int)? = nil
        var started: Double = Date().timeIntervalSince1970
    }

    private let state = NIOLockedValueBox(State())
    private let json: Bool
    private let live: Bool
    private let quiet: Bool
    private let totalItems: Int
    /// A long-running agent: JSON lines carry an "event" ("started", "finished"), and there is no live line.
    private let events: Bool

    init(json: Bool, live: Bool, quiet: Bool, totalItems: Int, events: Bool = false) {
        self.json = json
        self.live = live && !events
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
        case .started(let key, let size, let offset):
            self.state.withLockedValue {
                if let size { $0.sizes[key] = size }
                $0.current = key
            }
            if offset > 0 { self.note("resuming \(key) at \(Self.bytes(offset))") }
            if self.json && self.events {
                var object: [String: Any] = ["event": "started", "key": key, "offset": offset]
                if let size { object["size"] = size }
                Self.stdout(Self.jsonText(object))
            }
        case .sent(let key, let bytes):
            let line: String? = self.state.withLockedValue { state in
                state.sent[key, default: 0] += UInt64(bytes)
                state.totalSent += UInt64(bytes)
                state.current = key
                let now = Date().timeIntervalSince1970
                guard self.live, now - state.lastDraw > 0.2 else { return nil }
                state.lastDraw = now
                return self.statusLine(state, now: now)
            }
            if let line { Self.stderr("\r\u{1B}[K" + line) }
        case .acknowledged:
            break
        case .waiting(let key, let reason, let retryIn):
            // The other items go on; this one waits for the relay to have room.
            self.note("waiting     \(key): \(reason); trying again in \(Self.duration(retryIn))")
            if self.json && self.events {
                Self.stdout(Self.jsonText(["event": "waiting", "key": key, "reason": reason, "retry_in_seconds": Int(retryIn.components.seconds)]))
            }
        case .finished(let result):
            self.state.withLockedValue { $0.finished += 1 }
            if self.json {
                Self.stdout(Self.jsonLine(result, event: self.events ? "finished" : nil))
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

    private func statusLine(_ state: State, now: Double) -> String {
        let elapsed = max(0.001, now - state.started)
        let rate = Double(state.totalSent) / elapsed
        let total = state.sizes.values.reduce(0, +)
        var line = "[\(state.finished)/\(self.totalItems)] \(Self.bytes(state.totalSent))"
        if total > 0 { line += " / \(Self.bytes(total))" }
        line += "  \(Format.fixed(rate / 1e6)) MB/s"
        if total > state.totalSent, rate > 0 {
            let eta = Int(Double(total - state.totalSent) / rate)
            line += "  ETA \(eta / 60):\(Format.twoDigits(eta % 60))"
        }
        line += "  \(state.current)"
        return String(line.prefix(160))
    }

    /// A watched path not taken (a link, a FIFO, a name no key may have): said, and with --json an event.
    func skipped(path: String, reason: String, json: Bool) {
        self.note("skipped     \(path): \(reason)")
        if json { Self.stdout(Self.jsonText(["event": "skipped", "path": path, "reason": reason])) }
    }

    func note(_ text: String) {
        guard !self.quiet else { return }
        Self.stderr((self.live ? "\r\u{1B}[K" : "") + text + "\n")
    }

    func summary(_ results: [UploadResult]) {
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

    static func jsonLine(_ result: UploadResult, event: String? = nil) -> String {
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
