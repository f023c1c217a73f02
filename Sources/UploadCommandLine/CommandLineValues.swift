import ArgumentParser
import FoundationEssentials
#if canImport(Glibc)
import Glibc
#endif

// Values both command-line programs read, parsed in one place.

/// `host:port`, with `[::1]:port` for IPv6.
public enum HostPort {
    public static func parse(_ text: String, option: String) throws -> (String, Int) {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]), (0...65535).contains(port) else {
            throw ValidationError("\(option) \"\(text)\" is not host:port (for example 0.0.0.0:7443)")
        }
        var host = String(text[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") {
            host = String(host.dropFirst().dropLast())
        }
        guard !host.isEmpty else {
            throw ValidationError("\(option) \"\(text)\" has no host (for example 0.0.0.0:7443)")
        }
        return (host, port)
    }
}

/// Byte counts with optional K, M, G, T suffixes (powers of 1024).
public enum ByteCount {
    public static func parse(_ text: String, option: String) throws -> Int64 {
        let units: [Character: Int64] = ["K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40]
        var digits = text.uppercased()
        if digits.hasSuffix("IB") { digits.removeLast(2) } else if digits.hasSuffix("B") { digits.removeLast() }
        var multiplier: Int64 = 1
        if let last = digits.last, let unit = units[last] {
            multiplier = unit
            digits.removeLast()
        }
        guard let value = Int64(digits), value >= 0, value <= Int64.max / multiplier else {
            throw ValidationError("\(option) \"\(text)\" is not a byte count (for example 500M or 20G)")
        }
        return value * multiplier
    }
}

/// Durations such as 250ms, 90s, 5m or 24h (a bare number is seconds).
public enum DurationText {
    public static func parse(_ text: String, option: String) throws -> Duration {
        let units: [(String, Int64)] = [("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000), ("d", 86_400_000)]
        for (suffix, millis) in units where text.hasSuffix(suffix) {
            if let value = Int64(text.dropLast(suffix.count)), value >= 0, value <= Int64.max / millis {
                return .milliseconds(value * millis)
            }
        }
        if let seconds = Int64(text), seconds >= 0 { return .seconds(seconds) }
        throw ValidationError("\(option) \"\(text)\" is not a duration (for example 90s, 5m or 24h)")
    }
}

extension AsyncParsableCommand {
    /// Parses and runs the command, as ArgumentParser's `main()` does, except that a usage error exits 2, as scripts
    /// expect (ArgumentParser's own default is 64). Both programs' `main` call this. `hidden` gives, for each value that
    /// must not be shown (one read from a secret's file), what a message shows instead.
    public static func mainExitingTwoOnUsageError(
        _ arguments: [String]? = nil, hidden: @Sendable () -> [(value: String, shownAs: String)] = { [] }
    ) async {
        do {
            var command = try Self.parseAsRoot(arguments)
            if var asyncCommand = command as? any AsyncParsableCommand {
                try await asyncCommand.run()
            } else {
                try command.run()
            }
        } catch {
            let code = Self.exitCode(for: error)
            var message = Self.fullMessage(for: error)
            var redacted = false
            for (value, shownAs) in hidden() where !value.isEmpty && message.contains(value) {
                message = message.replacing(value, with: shownAs)
                redacted = true
            }
            if code == .validationFailure || redacted {
                let bytes = Array((message + "\n").utf8)
                _ = bytes.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
                Glibc.exit(code == .validationFailure ? 2 : code.rawValue)
            }
            Self.exit(withError: error)
        }
    }
}

/// The relay's data directory: `--data`, else `UPLOAD_RELAY_DATA`. Never a default in the current directory: a
/// command run from the wrong place would make a second, empty relay there.
public enum DataDirectory {
    /// The variable that names the data directory when `--data` is not given.
    public static let environmentVariable = "UPLOAD_RELAY_DATA"

    /// `option`, else the environment's, else nil.
    public static func resolve(_ option: String?, environment: [String: String]) -> String? {
        if let option, !option.isEmpty { return option }
        if let named = environment[Self.environmentVariable], !named.isEmpty { return named }
        return nil
    }

    /// The usage error when neither names it.
    public static let missing = ValidationError(
        "which data directory? pass --data DIR (the relay's catalog, staged uploads and, by default, its objects; e.g. /var/lib/upload-relay) or set UPLOAD_RELAY_DATA"
    )
}
