import ArgumentParser
import Foundation
import Synchronization
import UploadCommandLine

/// Where `serve` takes its options from besides the command line, each overriding the one before:
///
/// 1. `--config FILE`: a JSON object whose keys are `serve`'s option names without the dashes (`"listen"`,
///    `"status-listen"`, `"dev": true`, `"dev-host": ["a", "b"]`), the format of the agent's `--config`.
/// 2. The environment: `UPLOAD_RELAY_<NAME>` for each option, the name in capitals with `_` for `-`
///    (`UPLOAD_RELAY_MIN_FREE=2G`; a flag takes `1`/`true`/`yes` or `0`/`false`/`no`).
/// 3. The command line.
///
/// Any option's value may come from a file instead, for secrets (tokens in hook URLs, the catalog URL with its
/// password) that must not show in `ps` or in a file others read: `"catalog-file": "/etc/upload-relay/catalog"` in the
/// configuration, `UPLOAD_RELAY_CATALOG_FILE=...` in the environment, or `--catalog-file PATH` on the command line. The
/// file's content, without its trailing newline, is the value.
enum ServeConfig {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// `serve`'s options by name: true for an option that takes a value, false for a flag. Read from the command's
    /// own declaration, so a new option is configurable at once.
    static let options: [String: Bool] = {
        var options: [String: Bool] = [:]
        for child in Mirror(reflecting: Serve()).children {
            guard let label = child.label, label.hasPrefix("_") else { continue }
            let kind = String(describing: type(of: child.value))
            let name = Self.kebab(String(label.dropFirst()))
            if kind.hasPrefix("Flag<") {
                options[name] = false
            } else if kind.hasPrefix("Option<") {
                options[name] = true
            }
        }
        options["config"] = nil
        return options
    }()

    /// `listenAddress` → `listen-address`, as ArgumentParser names a `.long` option.
    static func kebab(_ name: String) -> String {
        var out = ""
        for character in name {
            if character.isUppercase {
                out += "-" + character.lowercased()
            } else {
                out.append(character)
            }
        }
        return out
    }

    /// The arguments `serve` parses: the file's options, then the environment's, then the command line's (with each
    /// `--NAME-file PATH` replaced by `--NAME VALUE`). `arguments` excludes the program's name.
    ///
    /// Each option comes from one place, the last that names it: a list (`dev-host`) from the file is replaced by the
    /// environment's, not added to; a flag set in the file is turned off by `UPLOAD_RELAY_<NAME>=0`.
    static func expand(_ arguments: [String], environment: [String: String]) throws -> [String] {
        guard arguments.first == "serve" else { return arguments }
        let given = try Self.commandLineArguments(Array(arguments.dropFirst()))
        var chosen: [String: [String]] = [:]
        if let path = OptionFile.path(in: given) {
            for (option, arguments) in try Self.fileOptions(path) { chosen[option] = arguments }
        }
        for (option, arguments) in try Self.environmentOptions(environment) { chosen[option] = arguments }
        let named = Self.optionsNamed(in: given)
        let inherited = chosen.keys.sorted().filter { !named.contains($0) }.flatMap { chosen[$0]! }
        return ["serve"] + inherited + given
    }

    /// The options a command line names (`--name VALUE`, `--name=VALUE`, `--flag`), before a `--`.
    static func optionsNamed(in arguments: [String]) -> Set<String> {
        var named = Set<String>()
        for argument in arguments {
            if argument == "--" { break }
            guard argument.hasPrefix("--") else { continue }
            let name = String(argument.dropFirst(2).prefix { $0 != "=" })
            if Self.options[name] != nil { named.insert(name) }
        }
        return named
    }

    typealias Value = OptionFile.Value

    /// The file's options: each option, and the arguments that give it (none for a flag set to false).
    static func fileOptions(_ path: String) throws -> [(option: String, arguments: [String])] {
        let object: [String: Value]
        do {
            object = try OptionFile.load(path, what: "serve's options")
        } catch let failure as OptionFile.Failure {
            throw Failure(description: failure.description)
        }
        var options: [(option: String, arguments: [String])] = []
        for (key, value) in object.sorted(by: { $0.key < $1.key }) {
            let option = Self.readFromFile(key) ?? key
            options.append((option, try Self.arguments(key, value, origin: "--config \(path): \"\(key)\"")))
        }
        return options
    }

    private static func arguments(_ key: String, _ value: Value, origin: String) throws -> [String] {
        if let name = Self.readFromFile(key) {
            guard case .text(let path) = value else { throw Failure(description: "\(origin) names a file: give its path as a string") }
            return ["--" + name, try Self.secret(path, origin: origin)]
        }
        guard let takesValue = Self.options[key] else {
            throw Failure(description: "\(origin) is not an option of upload-relay serve (see upload-relay serve --help; keys have no dashes)")
        }
        switch value {
        case .list(let list):
            return try list.flatMap { try Self.arguments(key, $0, origin: origin) }
        case .flag(let on):
            guard !takesValue else { throw Failure(description: "\(origin) takes a value, not true or false") }
            return on ? ["--" + key] : []
        case .number(let number):
            guard takesValue else { throw Failure(description: "\(origin) is a flag: true or false") }
            return ["--" + key, OptionFile.text(number)]
        case .text(let text):
            guard takesValue else { throw Failure(description: "\(origin) is a flag: true or false") }
            return ["--" + key, text]
        case .section:
            throw Failure(description: "\(origin) is an object: serve's options are flat (keys are option names without dashes)")
        }
    }

    /// The prefix of the environment's options.
    static let prefix = "UPLOAD_RELAY_"

    /// The environment's options: each option, and the arguments that give it (none for a flag set to 0). A
    /// `NAME_FILE` variable is read after a `NAME` one, so it wins.
    static func environmentOptions(_ environment: [String: String]) throws -> [(option: String, arguments: [String])] {
        var options: [(option: String, arguments: [String])] = []
        for (variable, value) in environment.sorted(by: { $0.key < $1.key }) where variable.hasPrefix(Self.prefix) {
            let name = variable.dropFirst(Self.prefix.count).lowercased().replacing("_", with: "-")
            if let option = Self.readFromFile(name) {
                options.append((option, ["--" + option, try Self.secret(value, origin: variable)]))
                continue
            }
            guard let takesValue = Self.options[name] else {
                // A variable one or two letters from an option's is a typo, refused as the file refuses one; others
                // (the package's UPLOAD_RELAY_OPTIONS, a script's own) are not the relay's.
                if let near = Self.nearestOption(to: name) {
                    let suggestion = Self.prefix + near.uppercased().replacing("-", with: "_")
                    throw Failure(
                        description: "\(variable) is not an option of upload-relay serve: did you mean \(suggestion)? (see upload-relay serve --help)"
                    )
                }
                continue
            }
            guard !value.isEmpty || !takesValue else { continue }
            if takesValue {
                options.append((name, ["--" + name, value]))
            } else {
                switch value.lowercased() {
                case "1", "true", "yes", "on": options.append((name, ["--" + name]))
                case "0", "false", "no", "off", "": options.append((name, []))
                default: throw Failure(description: "\(variable)=\(value): a flag takes 1, true, yes or 0, false, no")
                }
            }
        }
        return options
    }

    /// The option (or `NAME-file`) at most two edits from `name`, when `name` is long enough for that to mean a typo.
    static func nearestOption(to name: String) -> String? {
        guard name.count >= 4 else { return nil }
        let candidates = Self.options.keys.flatMap { option in Self.options[option] == true ? [option, option + "-file"] : [option] }
        let scored = candidates.map { ($0, Self.editDistance(name, $0)) }.filter { $0.1 <= 2 }
        return scored.min { $0.1 < $1.1 || ($0.1 == $1.1 && $0.0 < $1.0) }?.0
    }

    /// Levenshtein distance, by characters.
    static func editDistance(_ a: String, _ b: String) -> Int {
        let (a, b) = (Array(a), Array(b))
        guard !a.isEmpty else { return b.count }
        var previous = Array(0...b.count)
        for i in 1...a.count {
            var current = [i] + Array(repeating: 0, count: b.count)
            for j in stride(from: 1, through: b.count, by: 1) {
                current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1))
            }
            previous = current
        }
        return previous[b.count]
    }

    /// The command line with each `--NAME-file PATH` (NAME an option that takes a value) made `--NAME VALUE`.
    static func commandLineArguments(_ arguments: [String]) throws -> [String] {
        var out: [String] = []
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            if argument == "--" {
                out += arguments[index...]
                break
            }
            var name = argument
            var inline: String? = nil
            if let equals = argument.firstIndex(of: "="), argument.hasPrefix("--") {
                name = String(argument[..<equals])
                inline = String(argument[argument.index(after: equals)...])
            }
            if name.hasPrefix("--"), let option = Self.readFromFile(String(name.dropFirst(2))) {
                guard let path = inline ?? (index + 1 < arguments.count ? arguments[index + 1] : nil) else {
                    throw Failure(description: "\(name) needs a file's path")
                }
                out += ["--" + option, try Self.secret(path, origin: name)]
                index += inline == nil ? 2 : 1
                continue
            }
            out.append(argument)
            index += 1
        }
        return out
    }

    /// The option `name` gives from a file: `catalog` for `catalog-file`, when `catalog` takes a value and
    /// `catalog-file` is no option of its own; nil otherwise.
    static func readFromFile(_ name: String) -> String? {
        guard name.hasSuffix("-file"), Self.options[name] == nil else { return nil }
        let option = String(name.dropLast(5))
        return Self.options[option] == true ? option : nil
    }

    /// Each value read from a file so far, with how messages show it instead: a value that does not parse must not be
    /// echoed (`--listen-file /etc/shadow` would print the file).
    static let valuesRead = Mutex<[(value: String, shownAs: String)]>([])

    /// A value read from a file: its content without the trailing newline. The file is a secret's: only its owner may
    /// change it, and not every user may read it (``FileTrust``).
    static func secret(_ path: String, origin: String) throws -> String {
        if let problem = FileTrust.problem(path, what: "\(origin) \(path)", secret: true) { throw Failure(description: problem) }
        guard let data = FileManager.default.contents(atPath: path), let text = String(data: data, encoding: .utf8) else {
            throw Failure(description: "\(origin): cannot read \(path) (it must exist, be readable by this user and hold UTF-8 text)")
        }
        var value = text
        while value.hasSuffix("\n") || value.hasSuffix("\r") { value.removeLast() }
        guard !value.isEmpty else { throw Failure(description: "\(origin): \(path) is empty") }
        Self.valuesRead.withLock { $0.append((value, "(the content of \(path))")) }
        return value
    }
}
