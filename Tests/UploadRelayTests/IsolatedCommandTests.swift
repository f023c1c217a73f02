import Foundation
import Testing
import UploadPlatform

/// ``IsolatedCommand``: hooks and `--when` run in a session of their own, with clean signals and descriptors, killed
/// at their timeout whatever they do about it, and over when their first process exits.
@Suite("Isolated commands")
struct IsolatedCommandTests {
    static let environment = ["PATH": "/usr/bin:/bin"]

    @Test("a command that ignores TERM is killed at its timeout plus the grace; its output is kept")
    func ignoresTerm() {
        let started = Date()
        let ended = IsolatedCommand(
            command: "trap '' TERM; echo started; sleep 1000", environment: Self.environment, timeout: .milliseconds(300),
            grace: .milliseconds(300)
        ).run()
        let took = Date().timeIntervalSince(started)
        #expect(ended.timedOut)
        #expect(ended.outcome == .signalled(9))
        #expect(String(decoding: ended.output, as: UTF8.self) == "started\n")
        #expect(took < 5, "took \(took) s")
    }

    @Test("a command that leaves a background job holding its output is over when it exits, not when the job ends")
    func backgroundJob() {
        let marker = FileManager.default.temporaryDirectory.appendingPathComponent("isolated-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: marker) }
        let started = Date()
        // The plain job is killed with the command's group; the setsid one escapes it, and must not hold the caller.
        let ended = IsolatedCommand(
            command: "sleep 1000 & setsid sleep 1000 & echo $! > '\(marker)'; exit 0", environment: Self.environment, timeout: .seconds(30)
        ).run()
        #expect(ended.outcome == .exited(0))
        #expect(!ended.timedOut)
        #expect(Date().timeIntervalSince(started) < 10)
        if let pid = (try? String(contentsOfFile: marker, encoding: .utf8)).flatMap({ Int32($0.trimmingCharacters(in: .whitespacesAndNewlines)) }) {
            kill(pid, SIGKILL)
        } else {
            Issue.record("the command wrote no pid")
        }
    }

    @Test("only descriptors 0 to 2, no blocked or ignored signal, its own session, only the environment given")
    func clean() throws {
        // The caller's own blocked signal must not reach the command.
        var blocked = sigset_t()
        sigemptyset(&blocked)
        sigaddset(&blocked, SIGTERM)
        var previous = sigset_t()
        pthread_sigmask(SIG_BLOCK, &blocked, &previous)
        defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
        let extra = open("/dev/null", O_RDONLY)
        defer { close(extra) }
        let ended = IsolatedCommand(
            command: "ls /proc/self/fd | sort -n | tr '\\n' ' '; grep -E '^Sig(Blk|Ign)' /proc/self/status | tr '\\n' ' '; "
                + "ps -o sid= -p $$ | tr -d ' \\n'; echo; env | sort | tr '\\n' ' '",
            environment: ["PATH": "/usr/bin:/bin", "ONLY": "this"], timeout: .seconds(10)
        ).run()
        let text = String(decoding: ended.output, as: UTF8.self)
        let lines = text.split(separator: "\n").map(String.init)
        #expect(ended.outcome == .exited(0), "\(text)")
        // ls opens one of its own for the listing (3).
        #expect(lines.first?.hasPrefix("0 1 2 3 SigBlk:\t0000000000000000 SigIgn:\t") == true, "\(text)")
        // Signals 1 to 31 at their defaults (glibc keeps its own real-time ones, 32 and 33, out of any full set).
        let ignored = lines.first?.split(separator: "\t").dropFirst(2).first?.split(separator: " ").first.flatMap { UInt64($0, radix: 16) }
        #expect(ignored.map { $0 & 0x7fff_ffff } == 0, "\(text)")
        #expect(lines.first?.hasSuffix(" \(getsid(0))") == false, "a session of its own: \(text)")
        #expect(
            lines.dropFirst().first?.split(separator: " ").filter { !$0.hasPrefix("PWD=") && !$0.hasPrefix("SHLVL=") && !$0.hasPrefix("_=") }
                == ["ONLY=this", "PATH=/usr/bin:/bin"], "\(text)")
    }

    @Test("input is written to its stdin and closed; output past the limit is counted, not kept")
    func inputOutput() {
        let ended = IsolatedCommand(
            command: "cat; head -c 10000 /dev/zero", environment: Self.environment, input: Array("event\n".utf8), timeout: .seconds(10),
            outputLimit: 100
        ).run()
        #expect(ended.outcome == .exited(0))
        #expect(ended.output.count == 100)
        #expect(ended.outputBytes == 10_006)
        #expect(ended.printableOutput.hasPrefix("event\\n\\u0000"))
        #expect(ended.printableOutput.hasSuffix("(9906 more bytes dropped)"))
    }

    @Test("what a command wrote before it exited is all counted, however soon it exits after writing")
    func outputBeforeExit() {
        // 60,000 bytes fit in the pipe, so the command is gone before most of them are read.
        for _ in 0..<20 {
            let ended = IsolatedCommand(
                command: "head -c 60000 /dev/zero", environment: Self.environment, input: [], timeout: .seconds(10), outputLimit: 100
            ).run()
            #expect(ended.outcome == .exited(0))
            #expect(ended.outputBytes == 60_000)
        }
    }
}
