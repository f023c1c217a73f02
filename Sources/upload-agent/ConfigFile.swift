import ArgumentParser
import FoundationEssentials
import Glibc

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
        "relay", "token", "ca", "server-name", "prefix", "concurrency", "connections", "no-dedup", "deflate", "bwlimit", "state",
    ]
    /// The commands that take ConnectionOptions; the others take only `state`.
    static let connectionCommands: Set<String> = ["send", "watch"]

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// `arguments` (without the program's name) with the file's options inserted after the command's name, when
    /// `--config FILE` is among them.
    static func expand(_ arguments: [String]) throws -> [String] {
        guard let command = arguments.first, !command.hasPrefix("-"), let path = Self.configPath(arguments) else { return arguments }
        let data: Data
        do {
            data = try Data(contentsOf: URL(fileURLWithPath: path))
        } catch {
            let reason = access(path, R_OK) == 0 ? "not readable as a file" : String(cString: strerror(errno))
            throw Failure(description: "--config \(path): cannot read it (\(reason))")
        }
        let object: [String: Value]
        do {
            object = try JSONDecoder().decode([String: Value].self, from: data)
        } catch {
            throw Failure(description: "--config \(path): not a JSON object of options (keys are option names without dashes); see the README's \"Configuration file\"")
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
                        description: "--config \(path): \"\(key)\" is not an option every command takes; put it in a section named after its command, e.g. {\"watch\": {\"\(key)\": ...}}"
                    )
                }
                if key != "state" && !Self.connectionCommands.contains(command) { continue }
                inserted += try Self.arguments(key, value, path: path, where: "")
            }
        }
        return [command] + inserted + arguments.dropFirst()
    }

    /// A value in the file.
    indirect enum Value: Decodable {
        case flag(Bool)
        case number(Double)
        case text(String)
        case list([Value])
        case section([String: Value])

        init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if let flag = try? container.decode(Bool.self) {
                self = .flag(flag)
            } else if let number = try? container.decode(Double.self) {
                self = .number(number)
            } else if let text = try? container.decode(String.self) {
                self = .text(text)
            } else if let list = try? container.decode([Value].self) {
                self = .list(list)
            } else {
                self = .section(try container.decode([String: Value].self))
            }
        }
    }

    private static func configPath(_ arguments: [String]) -> String? {
        for (index, argument) in arguments.enumerated() {
            if argument == "--" { return nil }
            if argument == "--config", index + 1 < arguments.count { return arguments[index + 1] }
            if argument.hasPrefix("--config=") { return String(argument.dropFirst("--config=".count)) }
        }
        return nil
    }

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
            return [option, number == number.rounded() && abs(number) < 1e15 ? String(Int64(number)) : String(number)]
        case .text(let text):
            return [option, text]
        case .section:
            throw Failure(description: "--config \(path): \(prefix)\"\(key)\" is a section inside a section; sections hold options")
        }
    }
}
