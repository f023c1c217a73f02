import Foundation
import Logging
import NIOConcurrencyHelpers

/// `--log-format json`: one JSON object per line on standard error, for log shippers (journald's JSON, Loki, ...):
/// `{"time":"2026-11-26T03:19:35.123Z","level":"info","label":"upload-relay","message":"...","source":"UploadRelay",`
/// then the metadata's keys (`"upload.key":"..."`, `"account":"..."`), nested values as JSON objects and arrays.
public struct JSONLogHandler: LogHandler {
    public var logLevel: Logger.Level = .info
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?
    private let label: String
    private let write: @Sendable (String) -> Void

    /// Lines written to standard error, each in one `write`.
    public static func standardError(label: String) -> JSONLogHandler {
        JSONLogHandler(label: label) { line in
            let bytes = Array(line.utf8)
            Self.lock.withLock { _ = bytes.withUnsafeBytes { Glibc.write(2, $0.baseAddress, $0.count) } }
        }
    }

    private static let lock = NIOLock()

    public init(label: String, write: @escaping @Sendable (String) -> Void) {
        self.label = label
        self.write = write
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.metadata[key] }
        set { self.metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var merged = self.metadata
        if let provided = self.metadataProvider?.get() { merged.merge(provided) { $1 } }
        if let own = event.metadata { merged.merge(own) { $1 } }
        var line = "{\"time\":\(JSONText.quoted(Self.timestamp()))"
        line += ",\"level\":\(JSONText.quoted(event.level.rawValue))"
        line += ",\"label\":\(JSONText.quoted(self.label))"
        line += ",\"message\":\(JSONText.quoted(event.message.description))"
        line += ",\"source\":\(JSONText.quoted(event.source))"
        for key in merged.keys.sorted() where !Self.reserved.contains(key) {
            line += ",\(JSONText.quoted(key)):\(Self.json(merged[key]!))"
        }
        line += "}\n"
        self.write(line)
    }

    /// Keys the line's own fields take; metadata never overrides them.
    static let reserved: Set<String> = ["time", "level", "label", "message", "source"]

    static func json(_ value: Logger.Metadata.Value) -> String {
        switch value {
        case .string(let text): return JSONText.quoted(text)
        case .stringConvertible(let convertible): return JSONText.quoted(convertible.description)
        case .array(let values): return "[" + values.map(Self.json).joined(separator: ",") + "]"
        case .dictionary(let values):
            return "{" + values.keys.sorted().map { "\(JSONText.quoted($0)):\(Self.json(values[$0]!))" }.joined(separator: ",") + "}"
        }
    }

    /// UTC, milliseconds, RFC 3339.
    static func timestamp(_ date: Date = Date()) -> String {
        var time = time_t(date.timeIntervalSince1970)
        var parts = tm()
        gmtime_r(&time, &parts)
        let millis = Int((date.timeIntervalSince1970 - Double(time)) * 1000)
        return String(
            format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1, Int(parts.tm_mday),
            Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec), max(0, min(999, millis))
        )
    }
}
