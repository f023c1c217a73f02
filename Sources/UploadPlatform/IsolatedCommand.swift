#if canImport(Glibc)
import Glibc
#endif
import CUploadSystem
import UploadProtocol

/// A shell command run apart from the program that runs it: a relay's post-commit hook, an agent's `--when`. It gets
/// its own session and process group, no blocked signal and default dispositions (a relay thread's blocked signals
/// would otherwise make it unkillable), descriptors 0 to 2 only, and just the environment given. At its timeout its
/// process group gets SIGTERM, then SIGKILL after the grace; it is over when its first process exits, not when its
/// output ends, and whatever it left in its process group is killed then.
public struct IsolatedCommand: Sendable {
    public var command: String
    /// The whole environment it gets, nothing inherited.
    public var environment: [String: String]
    /// Written to its standard input, which is then closed.
    public var input: [UInt8]
    /// Nil: no limit.
    public var timeout: Duration?
    public var grace: Duration
    /// The most bytes of its output (standard output and error together) kept; the rest is read and dropped.
    public var outputLimit: Int

    public init(
        command: String, environment: [String: String], input: [UInt8] = [], timeout: Duration?, grace: Duration = .seconds(2),
        outputLimit: Int = 4096
    ) {
        self.command = command
        self.environment = environment
        self.input = input
        self.timeout = timeout
        self.grace = grace
        self.outputLimit = outputLimit
    }

    public enum Outcome: Hashable, Sendable {
        case exited(Int32)
        case signalled(Int32)
        case couldNotStart(String)
    }

    public struct Ended: Hashable, Sendable {
        public var outcome: Outcome
        /// Whether it outlived its timeout and was signalled.
        public var timedOut: Bool
        /// The first ``IsolatedCommand/outputLimit`` bytes of its output.
        public var output: [UInt8]
        /// All the bytes it wrote.
        public var outputBytes: Int

        /// Its output as a log or a terminal may show it: escaped (``Printable``), with what was dropped counted.
        public var printableOutput: String {
            let text = Printable.escaped(bytes: self.output)
            return self.outputBytes > self.output.count ? text + " (\(self.outputBytes - self.output.count) more bytes dropped)" : text
        }

        /// As a shell reports it: the exit status, or 128 plus the signal's number; 127 when it could not start.
        public var shellStatus: Int32 {
            switch self.outcome {
            case .exited(let status): status
            case .signalled(let signal): 128 + signal
            case .couldNotStart: 127
            }
        }
    }

    /// Runs it to its end; blocks the calling thread that long (at most the timeout and the grace, when there is one).
    public func run() -> Ended {
        let environment = self.environment.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
        var envp: [UnsafeMutablePointer<CChar>?] = environment.map { strdup($0) } + [nil]
        defer { for pointer in envp { free(pointer) } }
        var output = [UInt8](repeating: 0, count: max(0, self.outputLimit))
        let capacity = output.count
        let result = self.input.withUnsafeBytes { input in
            output.withUnsafeMutableBytes { buffer in
                upload_run_isolated(
                    self.command, &envp, input.baseAddress, input.count, Self.milliseconds(self.timeout), Self.milliseconds(self.grace),
                    buffer.baseAddress?.assumingMemoryBound(to: CChar.self), capacity)
            }
        }
        guard result.started != 0 else {
            return Ended(outcome: .couldNotStart(String(cString: strerror(result.error))), timedOut: false, output: [], outputBytes: 0)
        }
        // WIFEXITED / WEXITSTATUS / WTERMSIG, which Swift does not import as macros.
        let signal = result.status & 0x7f
        let outcome: Outcome = signal == 0 ? .exited((result.status >> 8) & 0xff) : .signalled(signal)
        return Ended(
            outcome: outcome, timedOut: result.timed_out != 0, output: Array(output.prefix(Int(result.output_length))),
            outputBytes: Int(result.output_total))
    }

    private static func milliseconds(_ duration: Duration?) -> Int32 {
        guard let duration else { return 0 }
        let (seconds, attoseconds) = duration.components
        return Int32(clamping: max(1, seconds * 1000 + attoseconds / 1_000_000_000_000_000))
    }

    /// What a command gets of its caller's environment when nothing else is asked: where programs are, who and where
    /// the user is, the language, the time zone; never a token, a key or a password the caller holds.
    public static let baseEnvironment = ["PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR"]

    /// `names` of `environment`, with a PATH where it has none.
    public static func environment(_ environment: [String: String], passing names: [String] = Self.baseEnvironment) -> [String: String] {
        var chosen: [String: String] = [:]
        for name in names {
            if let value = environment[name] { chosen[name] = value }
        }
        if chosen["PATH"] == nil { chosen["PATH"] = "/usr/local/bin:/usr/bin:/bin" }
        return chosen
    }
}
