import FoundationEssentials
import Glibc

/// `--config FILE` of both programs: a JSON object of options, keys being option names without the dashes, each value a
/// string, a number, true or false (a flag), a list (the option repeated) or, where a program takes them, an object
/// (a section of one command's own options).
public enum OptionFile {
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
        public init(_ description: String) { self.description = description }
    }

    /// A value in the file.
    public indirect enum Value: Decodable, Sendable {
        case flag(Bool)
        case number(Double)
        case text(String)
        case list([Value])
        case section([String: Value])

        public init(from decoder: any Decoder) throws {
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

    /// The file's options; a failure says which file and why, in words.
    public static func load(_ path: String, what: String) throws -> [String: Value] {
        // Its options can run commands (hooks, --when): only its owner may write it.
        if let problem = FileTrust.problem(path, what: "--config \(path)", secret: false) { throw Failure(problem) }
        let data: Data
        do {
            data = try Data(contentsOf: URL(fileURLWithPath: path))
        } catch {
            let reason = access(path, R_OK) == 0 ? "not readable as a file" : String(cString: strerror(errno))
            throw Failure("--config \(path): cannot read it (\(reason))")
        }
        do {
            return try JSONDecoder().decode([String: Value].self, from: data)
        } catch {
            throw Failure(
                "--config \(path): not a JSON object of \(what) (keys are option names without dashes, values strings, numbers, true or lists)")
        }
    }

    /// A number as the command line would give it: an integer without a decimal point.
    public static func text(_ number: Double) -> String {
        number == number.rounded() && abs(number) < 1e15 ? String(Int64(number)) : String(number)
    }

    /// Where `--config` is among `arguments` (before a `--`), if it is.
    public static func path(in arguments: [String]) -> String? {
        for (index, argument) in arguments.enumerated() {
            if argument == "--" { return nil }
            if argument == "--config", index + 1 < arguments.count { return arguments[index + 1] }
            if argument.hasPrefix("--config=") { return String(argument.dropFirst("--config=".count)) }
        }
        return nil
    }
}
