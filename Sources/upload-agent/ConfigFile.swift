import ArgumentParser
import FoundationEssentials
import Glibc
import UploadCommandLine

/// `--config FILE`: options from a JSON file, placed before the command line's own so that those override them (an
/// option given twice takes its last value; a list option, such as --include, takes both).
///
/// ```json
/// {
///   "relay": "relay.example.net:7443", "token": "…", "ca": "/etc/upload-agent/ca.pem", "bwlimit": "10M",
///   "send": { "retry-for": "5m" },
///   "watch": { "settle": "5s", "include": ["*.jpg", "*.mp4"], "only-on-ac": true }
/// }
/// ```
///
/// Top-level keys are the options `send` and `watch` share (and `state`, which every command takes); a section named
/// after a command holds that command's own. A key is an option's long name without the dashes; a value is a string,
/// a number, true (a flag; false leaves it off), or a list (the option repeated).
enum ConfigFile {
    /// The options of ConnectionOptions and StateOptions, which top-level keys may name.
    static let sharedKeys: Set<String> = [
        "relay", "token", "ca", "server-name", "prefix", "concurrency", "connections", "max-connections", "no-dedup", "deflate", "bwlimit", "state",
    ]
    /// The commands that take ConnectionOptions; the others take only `state`.
    static let connectionCommands: Set<String> = ["send", "watch"]

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// `arguments` (without the program's name) with the file's options inserted after the command's name, when
    /// `--config FILE` is among them.
    static func expand(_ arguments: [String]) throws -> [String] {
        guard let command = arguments.first, !command.hasPrefix("-"), let path = OptionFile.path(in: arguments) else { return arguments }
        let object: [String: Value]
        do {
            object = try OptionFile.load(path, what: "options")
        } catch let failure as OptionFile.Failure {
            throw Failure(description: failure.description + "; see the README's \"Configuration file\"")
        }
        var inserted: [String] = []
        for (key, value) in object.sorted(by: { $0.key < $1.key }) {
            if case .section(let section) = value {
                guard key == command else { continue }
                for (option, value) in section.sorted(by: { $0.key < $1.key }) {
                    inserted += try Self.arguments(option, value, path: path, where: "\"\(key)\".")
                }
            } else {
                guard Self.sharedKeys.contains(key) else {
                    throw Failure(
                        description:
                            "--config \(path): \"\(key)\" is not an option every command takes; put it in a section named after its command, e.g. {\"watch\": {\"\(key)\": ...}}"
                    )
                }
                if key != "state" && !Self.connectionCommands.contains(command) { continue }
                inserted += try Self.arguments(key, value, path: path, where: "")
            }
        }
        return [command] + inserted + arguments.dropFirst()
    }

    typealias Value = OptionFile.Value

    private static func arguments(_ key: String, _ value: Value, path: String, where prefix: String) throws -> [String] {
        guard key != "config", !key.hasPrefix("-"), !key.isEmpty else {
            throw Failure(description: "--config \(path): \(prefix)\"\(key)\" cannot be set in the file (keys are option names without dashes)")
        }
        let option = "--" + key
        switch value {
        case .list(let list):
            return try list.flatMap { try Self.arguments(key, $0, path: path, where: prefix) }
        case .flag(let on):
            return on ? [option] : []
        case .number(let number):
            return [option, OptionFile.text(number)]
        case .text(let text):
            return [option, text]
        case .section:
            throw Failure(description: "--config \(path): \(prefix)\"\(key)\" is a section inside a section; sections hold options")
        }
    }
}
